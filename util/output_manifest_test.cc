#include "util/output_manifest.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/files.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::util {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

std::string Dir(const std::string& name) {
  const std::string d = testing::TempDir("manifest/" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(OutputManifestTest, AnEarlierOutputIsReplaceable) {
  const std::string d = Dir("earlier");
  std::ofstream(d + "/config.json") << "{}";
  fs::create_directories(d + "/sub");
  std::ofstream(d + "/sub/model.safetensors") << "w";
  ASSERT_OK(WriteOutputManifest(d));
  ASSERT_OK_AND_ASSIGN(std::string text, ReadFile(d + "/" + kOutputManifest));
  EXPECT_EQ(
      text,
      "# files tracecut wrote here\nconfig.json\nsub/model.safetensors\n");
  EXPECT_TRUE(HoldsOnlyManifestFiles(d));
  EXPECT_OK(CheckOutputDirReplaceable(d, false, "-o"));
  // The same files give the same manifest.
  ASSERT_OK(WriteOutputManifest(d));
  EXPECT_EQ(*ReadFile(d + "/" + kOutputManifest), text);
}

TEST(OutputManifestTest, AnythingElseIsRefusedUnlessOverwrite) {
  const std::string d = Dir("other");
  std::ofstream(d + "/config.json") << "{}";
  ASSERT_OK(WriteOutputManifest(d));
  // The user's files since: a notebook, a checkpoint moved in.
  std::ofstream(d + "/notes.txt") << "mine";
  fs::create_directories(d + "/ckpt");
  std::ofstream(d + "/ckpt/model.safetensors") << "w";
  EXPECT_FALSE(HoldsOnlyManifestFiles(d));
  EXPECT_THAT(
      CheckOutputDirReplaceable(d, false, "-o"),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("refusing to replace -o '" + d),
                     HasSubstr("2 files tracecut did not write"),
                     HasSubstr("ckpt/model.safetensors"),
                     HasSubstr("notes.txt"), HasSubstr("--overwrite"))));
  EXPECT_OK(CheckOutputDirReplaceable(d, true, "-o"));
  // No manifest: nothing in it is known to be ours.
  const std::string plain = Dir("plain");
  std::ofstream(plain + "/config.json") << "{}";
  EXPECT_FALSE(CheckOutputDirReplaceable(plain, false, "-o").ok());
}

TEST(OutputManifestTest, MissingOrEmptyIsFineAFileIsNot) {
  EXPECT_OK(CheckOutputDirReplaceable(Dir("x") + "/none", false, "-o"));
  EXPECT_OK(CheckOutputDirReplaceable(Dir("empty"), false, "-o"));
  const std::string f = Dir("file") + "/f";
  std::ofstream(f) << "x";
  EXPECT_THAT(CheckOutputDirReplaceable(f, true, "-o"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("not a directory")));
}

}  // namespace
}  // namespace tracecut::util
