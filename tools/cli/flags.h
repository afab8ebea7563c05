#ifndef TRACECUT_TOOLS_CLI_FLAGS_H_
#define TRACECUT_TOOLS_CLI_FLAGS_H_

// The flags of a `tracecut` subcommand: declared as FlagSpecs, parsed by
// CLI11, read back through ParsedArgs.
//
//   std::vector<FlagSpec> flags = {
//       FlagSpec::Value("leaf", "TYPE_OR_PATH", "a leaf module").Repeated(),
//       FlagSpec::Value("output", "FILE", "where to write").Short('o'),
//       FlagSpec::Bool("json", "print a JSON summary"),
//   };
//   ASSIGN_OR_RETURN(ParsedArgs args, ParseArgs(argv_tail, flags));
//   for (const std::string& leaf : args.GetAll("leaf")) ...
//
// FlagSpec is what the subcommands declare and ParsedArgs what they read, so
// that no *_cmd.cc file depends on CLI11 itself. No LibTorch here.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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
  bool input_file = false;  // Names a file to read: a regular file.
  uint64_t max_bytes = 0;   // Of that file; 0: no limit.
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
  // Main refuses a directory, FIFO or device as its value (and, with
  // `max_bytes`, a larger file) before the command runs: "--recipe: 'DIR' is
  // a directory", "--data: '/dev/zero' is a character device, not a
  // regular file".
  FlagSpec& InputFile(uint64_t max = 0) {
    input_file = true;
    max_bytes = max;
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
// `--name`, and positionals ("--" ends flags). Unknown flags, missing, empty
// or unexpected values, and single-valued flags given twice are usage errors
// ("unknown flag --bogus", "-o needs a value (FILE)", "--leaf needs a
// non-empty value (X)", "--json takes no value", "--config given more than
// once").
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args,
                                     const std::vector<FlagSpec>& flags);

// The help of a command taking `flags`:
//
//   usage: tracecut <command> <synopsis>
//
//   <summary>
//
//   <description>
//
//   flags:
//     -o, --output=FILE  where to write
//     --leaf=X           a leaf module (repeatable)
std::string FlagsHelp(absl::string_view command, absl::string_view synopsis,
                      absl::string_view summary, absl::string_view description,
                      const std::vector<FlagSpec>& flags);

// A usage error: exits 2 and points at --help.
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);

}  // namespace tracecut::cli

#endif  // TRACECUT_TOOLS_CLI_FLAGS_H_
