#include "tools/cli/testing/cli_test_util.h"

#include <algorithm>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tools/cli/common.h"
#include "util/testing/runfiles.h"

namespace tracecut::cli::testing {

Result RunTracecut(std::vector<std::string> args) {
  args.insert(args.begin(), "tracecut");
  std::ostringstream out, err;
  Io io{out, err};
  const int code = Main(args, io);
  return {code, out.str(), err.str()};
}

std::string Fixture(absl::string_view stem) {
  return util::testing::Runfile(absl::StrCat("tests/fixtures/", stem, ".pt"));
}

int Lines(absl::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

}  // namespace tracecut::cli::testing
