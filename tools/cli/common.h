#ifndef TRACECUT_TOOLS_CLI_COMMON_H_
#define TRACECUT_TOOLS_CLI_COMMON_H_

// Shared plumbing of the `tracecut` command line: a subcommand registry,
// dispatch, and atomic output. Flags are declared and read through
// tools/cli/flags.h (parsed by CLI11). No LibTorch here.
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
//     c.flags = {FlagSpec::Value("output", "FILE", "where to write")
//                    .Short('o')};
//     c.min_positional = c.max_positional = 1;
//     c.run = RunFoo;
//     return c;
//   }
//   const bool kRegistered = RegisterSubcommand(FooCommand());
//   }  // namespace
//
// Errors: a UsageError status (bad flags or arguments) exits 2, any other
// error 1; both print one line, "tracecut foo: <message>".

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/cli/flags.h"

namespace tracecut::cli {

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

// `path` as the user meant it: relative paths are taken from where the user
// ran `bazel run` ($BUILD_WORKING_DIRECTORY), not from the runfiles tree
// that `bazel run` starts in.
std::string UserPath(const std::string& path);

// `name` ("tracecut/tests/fixtures/llama.pt": workspace, then path) among
// the runfiles of the running binary, found with Bazel's runfiles library.
// NotFound when the binary has no runfiles or `name` is not readable there.
absl::StatusOr<std::string> FindRunfile(const std::string& name);

}  // namespace tracecut::cli

#endif  // TRACECUT_TOOLS_CLI_COMMON_H_
