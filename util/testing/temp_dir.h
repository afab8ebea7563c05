#ifndef TRACECUT_UTIL_TESTING_TEMP_DIR_H_
#define TRACECUT_UTIL_TESTING_TEMP_DIR_H_

// Scratch directories for tests, under the test's own temporary directory
// (Bazel's $TEST_TMPDIR, which Bazel empties before each run):
//
//   const std::string dir = TempDir("atomic");  // Created if missing.
//   ... write outputs to dir + "/f.txt" ...
//   EXPECT_THAT(ListDir(dir), ElementsAre("f.txt"));  // No temporaries.

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tracecut::util::testing {

// "<test tmpdir>/<name>", created with its parents if missing.
std::string TempDir(absl::string_view name);

// The names in `dir` (without "." and ".."), sorted; empty when `dir` cannot
// be read.
std::vector<std::string> ListDir(const std::string& dir);

}  // namespace tracecut::util::testing

#endif  // TRACECUT_UTIL_TESTING_TEMP_DIR_H_
