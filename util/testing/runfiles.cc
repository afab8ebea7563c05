#include "util/testing/runfiles.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tools/cpp/runfiles/runfiles.h"

namespace tracecut::util::testing {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;

// The workspace name (WORKSPACE): the first component of a runfile's path.
constexpr absl::string_view kWorkspace = "tracecut";

}  // namespace

std::string Runfile(absl::string_view path) {
  static const Runfiles* const runfiles = [] {
    std::string error;
    Runfiles* r = Runfiles::CreateForTest(&error);
    EXPECT_NE(r, nullptr) << "cannot find the test's runfiles: " << error;
    return r;
  }();
  if (runfiles == nullptr) return std::string(path);
  return runfiles->Rlocation(absl::StrCat(kWorkspace, "/", path));
}

}  // namespace tracecut::util::testing
