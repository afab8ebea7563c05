#ifndef TRACECUT_TOOLS_CLI_COMMON_H_
#define TRACECUT_TOOLS_CLI_COMMON_H_

// Shared plumbing of the `tracecut` command line: a subcommand registry,
// flag parsing, and atomic output. No LibTorch here.
//
// A subcommand lives in its own file (tools/cli/<name>_cmd.cc, a cc_library
// with alwayslink = True linked into //tools:tracecut) and registers itself:
//
//   namespace {
//   absl::Status RunFoo(const ParsedArgs& args, Io& io) { ... }
//   Subcommand FooCommand() {
//     Subcommand c;
//     c.name = "foo";
//     c.synopsis = "MODEL.pt [-o FILE]";
//     c.summary = "One line for `tracecut --help`.";
//     c.description = "A paragraph for `tracecut foo --help`.";
//     c.flags = {FlagSpec::Value("output", "FILE", "where to
//     write").Short('o')}; c.min_positional = c.max_positional = 1; c.run =
//     RunFoo; return c;
//   }
//   const bool kRegistered = RegisterSubcommand(FooCommand());
//   }  // namespace
//
// Errors: a UsageError status (bad flags or arguments) exits 2, any other
// error 1; both print one line, "tracecut foo: <message>".

#include <functional>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::cli {

struct FlagSpec {
  std::string name;         // Long name without dashes: "leaf".
  char short_name = 0;      // 'o' for -o; 0 for none.
  std::string value_name;   // "FILE"; empty for a boolean flag.
  bool repeated = false;    // May be given more than once.
  bool input_file = false;  // Names a file to read: not a directory.
  std::string help;

  // --name=VALUE_NAME.
  static FlagSpec Value(std::string name, std::string value_name,
                        std::string help);
  // --name (no value).
  static FlagSpec Bool(std::string name, std::string help);
  FlagSpec& Short(char c) {
    short_name = c;
    return *this;
  }
  FlagSpec& Repeated() {
    repeated = true;
    return *this;
  }
  // Main refuses a directory as its value, before the command runs:
  // "--recipe: 'DIR' is a directory".
  FlagSpec& InputFile() {
    input_file = true;
    return *this;
  }
};

class ParsedArgs {
 public:
  const std::vector<std::string>& positional() const { return positional_; }
  bool Has(absl::string_view flag) const;
  // The value of a single-valued flag, if given.
  std::optional<std::string> Get(absl::string_view flag) const;
  // Every value of a repeated flag, in order.
  std::vector<std::string> GetAll(absl::string_view flag) const;

 private:
  friend absl::StatusOr<ParsedArgs> ParseArgs(
      const std::vector<std::string>& args, const std::vector<FlagSpec>& flags);
  std::vector<std::string> positional_;
  std::map<std::string, std::vector<std::string>, std::less<>> values_;
};

// Parses `--name=value`, `--name value`, `-o value`, `-ovalue`, boolean
// `--name`, and positionals ("--" ends flags). Unknown flags, missing or
// unexpected values, and single-valued flags given twice are usage errors.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<FlagSpec>& flags);

// Where a subcommand writes.
struct Io {
  std::ostream& out;
  std::ostream& err;
};

struct Subcommand {
  std::string name;
  std::string synopsis;  // Arguments after "tracecut <name> ".
  std::string summary;   // One line.
  std::string description;
  std::vector<FlagSpec> flags;  // --help is added automatically.
  int min_positional = 0;
  int max_positional = 0;  // -1: unlimited.
  std::function<absl::Status(const ParsedArgs&, Io&)> run;
};

// Adds a subcommand (at static-initialisation time); returns true.
bool RegisterSubcommand(Subcommand command);
// Registered subcommands, sorted by name.
std::vector<const Subcommand*> Subcommands();

// A usage error: exits 2 and points at --help.
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);

// The `tracecut` entry point: dispatches argv[1] and returns the exit code.
int Main(const std::vector<std::string>& argv, Io& io);

// The help text of a subcommand.
std::string SubcommandHelp(const Subcommand& command);

// `status` with the process exit code to use for it (default 1; 2 for usage
// errors), e.g. 128 + signal for a run stopped by SIGINT / SIGTERM.
absl::Status WithExitCode(absl::Status status, int code);

// Writes `bytes` to `path` atomically: a temporary file in the same
// directory, flushed and fsync'ed, then renamed over `path`. On failure the
// temporary is removed and `path` is untouched. "-" writes to `io.out`.
absl::Status WriteOutput(const std::string& path, absl::string_view bytes,
                         Io& io);

// Fails, naming `path`, when an output could not be written there later (it
// is a directory, or its directory is missing): long runs check this before
// doing any work. `directory_output`: the output is a directory (which may
// exist; its writer decides whether to replace it).
absl::Status CheckOutputPath(const std::string& path,
                             bool directory_output = false);

// Fails, naming both, when writing `output` would overwrite the input model
// `input`: the same file (also through symbolic or hard links), or an
// existing file inside `input` when it is a checkpoint directory. A user's
// model is never replaced by a tool's output.
absl::Status CheckOutputIsNotInput(const std::string& output,
                                   const std::string& input);

}  // namespace tracecut::cli

#endif  // TRACECUT_TOOLS_CLI_COMMON_H_
