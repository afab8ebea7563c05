#ifndef TRACECUT_TOOLS_CLI_TESTING_CLI_TEST_UTIL_H_
#define TRACECUT_TOOLS_CLI_TESTING_CLI_TEST_UTIL_H_

// What the `tracecut` subcommand tests share: running the command line in
// process, and the fixture models.
//
//   Result r = RunTracecut({"trace", Fixture("llama"), "--json"});
//   ASSERT_EQ(r.code, 0) << r.err;
//   EXPECT_EQ(Lines(r.err), 0);
//
// A test using Fixture() needs data = ["//tests/fixtures:models"].

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tracecut::cli::testing {

// What `tracecut ...` did: exit code, stdout, stderr.
struct Result {
  int code;
  std::string out;
  std::string err;
};

// Runs `tracecut <args>` through cli::Main in this process (the subcommands
// linked into the test register themselves).
Result RunTracecut(std::vector<std::string> args);

// tests/fixtures/<stem>.pt among the test's runfiles.
std::string Fixture(absl::string_view stem);

// The number of lines of `s` (its newlines).
int Lines(absl::string_view s);

}  // namespace tracecut::cli::testing

#endif  // TRACECUT_TOOLS_CLI_TESTING_CLI_TEST_UTIL_H_
