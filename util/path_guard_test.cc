#include "util/path_guard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::util {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

class PathGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(testing::TempDir("path_guard")) /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(base_);
    fs::create_directories(base_ / "ckpt");
    std::ofstream(base_ / "ckpt" / "model.safetensors") << "weights";
    std::ofstream(base_ / "recipe.yaml") << "recipe";
  }
  std::string P(const std::string& rel) { return (base_ / rel).string(); }
  fs::path base_;
};

TEST_F(PathGuardTest, ReadsRegularFilesUpToALimit) {
  ASSERT_OK_AND_ASSIGN(std::string s,
                       ReadRegularFile(P("recipe.yaml"), 6, "--recipe"));
  EXPECT_EQ(s, "recipe");
  EXPECT_THAT(ReadRegularFile(P("recipe.yaml"), 5, "--recipe").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--recipe"), HasSubstr("6 B"))));
}

TEST_F(PathGuardTest, RefusesSpecialFilesWithoutBlocking) {
  ASSERT_EQ(::mkfifo(P("fifo").c_str(), 0600), 0);
  // A FIFO with no writer: a plain open would wait forever.
  EXPECT_THAT(ReadRegularFile(P("fifo"), 1 << 20, "--data").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is a FIFO, not a regular file")));
  EXPECT_THAT(ReadRegularFile("/dev/zero", 1 << 20, "--data").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'/dev/zero' is a character device")));
  EXPECT_THAT(ReadRegularFile(P("ckpt"), 1 << 20, "--data").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is a directory")));
  fs::create_symlink(P("recipe.yaml"), P("link"));
  EXPECT_OK(OpenRegularFile(P("link"), "x"));
  EXPECT_THAT(
      OpenRegularFile(P("link"), "x", /*follow_links=*/false).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("symbolic link")));
  EXPECT_THAT(OpenRegularFile(P("none"), "x").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PathGuardTest, IsWithin) {
  EXPECT_TRUE(IsWithin("/a/b", "/a"));
  EXPECT_TRUE(IsWithin("/a", "/a"));
  EXPECT_TRUE(IsWithin("/a", "/"));
  EXPECT_FALSE(IsWithin("/ab", "/a"));
  EXPECT_FALSE(IsWithin("/a", "/a/b"));
}

TEST_F(PathGuardTest, OutputsStayApartFromInputs) {
  const std::vector<NamedPath> inputs = {
      {"input checkpoint directory", P("ckpt")},
      {"--recipe", P("recipe.yaml")},
      {"--data", ""},
      {"--config", P("missing.json")}};
  fs::create_directories(base_ / "old_output");
  fs::create_symlink(base_ / "ckpt", base_ / "old_output" / "ckpt");
  fs::create_hard_link(base_ / "recipe.yaml", base_ / "hard.yaml");
  fs::create_directories(base_ / "holder" / "inner");
  fs::rename(base_ / "ckpt", base_ / "holder" / "inner" / "ckpt");
  fs::create_directory_symlink(base_ / "holder" / "inner" / "ckpt",
                               base_ / "ckpt");
  struct Case {
    std::string output, how;
  };
  const Case refused[] = {
      {P("ckpt"), "it is the input checkpoint directory"},
      {P("ckpt/model.safetensors"), "it lies inside the input checkpoint"},
      {P("ckpt/new_file"), "it lies inside the input checkpoint"},
      {P("ckpt/./sub/../x"), "it lies inside"},
      {P("recipe.yaml"), "it is the --recipe"},
      {P("hard.yaml"), "it is the --recipe"},
      {P("holder"), "it contains the input checkpoint"},
      {P("holder/inner"), "it contains the input checkpoint"},
  };
  for (const Case& c : refused) {
    SCOPED_TRACE(c.output);
    EXPECT_THAT(CheckOutputApart({"-o", c.output}, inputs),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("refusing to write -o '" + c.output),
                               HasSubstr(c.how))));
  }
  // A directory holding a link to an input is replaced without following
  // the link; the input itself is elsewhere.
  EXPECT_OK(CheckOutputApart({"-o", P("old_output")}, inputs));
  EXPECT_OK(CheckOutputApart({"-o", P("new_output")}, inputs));
  EXPECT_OK(CheckOutputApart({"-o", P("holder2")}, inputs));
  EXPECT_OK(CheckOutputApart({"-o", "-"}, inputs));
}

}  // namespace
}  // namespace tracecut::util
