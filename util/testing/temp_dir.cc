#include "util/testing/temp_dir.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tracecut::util::testing {

std::string TempDir(absl::string_view name) {
  std::string base = ::testing::TempDir();  // Ends with '/'.
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string dir = absl::StrCat(base, "/", name);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  EXPECT_FALSE(ec) << "cannot create " << dir << ": " << ec.message();
  return dir;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    out.push_back(entry.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tracecut::util::testing
