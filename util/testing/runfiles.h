#ifndef TRACECUT_UTIL_TESTING_RUNFILES_H_
#define TRACECUT_UTIL_TESTING_RUNFILES_H_

// The data files of a test (its `data` attribute), found with Bazel's
// runfiles library instead of hand-built $TEST_SRCDIR paths:
//
//   torch::jit::load(Runfile("tests/fixtures/llama.pt"));

#include <string>

#include "absl/strings/string_view.h"

namespace tracecut::util::testing {

// The absolute path of `path`, named from the tracecut workspace root, among
// this test's runfiles. Fails the test when the runfiles cannot be found.
std::string Runfile(absl::string_view path);

}  // namespace tracecut::util::testing

#endif  // TRACECUT_UTIL_TESTING_RUNFILES_H_
