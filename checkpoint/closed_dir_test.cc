#include "checkpoint/closed_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;
using ::tracecut::util::testing::TempDir;

void Touch(const fs::path& p) { std::ofstream(p) << "x"; }

class ClosedDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(TempDir("closed_dir")) /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(base_);
    dir_ = base_ / "ckpt";
    fs::create_directories(dir_ / "sub");
    Touch(dir_ / "model.safetensors");
    Touch(dir_ / "sub" / "shard.safetensors");
    Touch(base_ / "outside.safetensors");
  }
  fs::path base_, dir_;
};

TEST_F(ClosedDirTest, ResolvesFilesInside) {
  ASSERT_OK_AND_ASSIGN(ClosedDir d, ClosedDir::Open(dir_.string()));
  ASSERT_OK_AND_ASSIGN(std::string p, d.Resolve("model.safetensors", "idx"));
  EXPECT_EQ(p, fs::canonical(dir_ / "model.safetensors").string());
  EXPECT_OK(d.Resolve("sub/shard.safetensors", "idx"));
  EXPECT_OK(d.Resolve("./sub//shard.safetensors", "idx"));
  // A link to a file inside is that file.
  fs::create_symlink("sub/shard.safetensors", dir_ / "link.safetensors");
  ASSERT_OK_AND_ASSIGN(p, d.Resolve("link.safetensors", "idx"));
  EXPECT_EQ(p, fs::canonical(dir_ / "sub" / "shard.safetensors").string());
}

TEST_F(ClosedDirTest, RefusesNamesLeavingTheDirectory) {
  ASSERT_OK_AND_ASSIGN(ClosedDir d, ClosedDir::Open(dir_.string()));
  fs::create_symlink(base_ / "outside.safetensors", dir_ / "out_link");
  fs::create_symlink("/etc/passwd", dir_ / "passwd_link");
  fs::create_directory_symlink(base_, dir_ / "up");
  struct Case {
    std::string entry, why;
  };
  const Case cases[] = {
      {"/etc/passwd", "an absolute path"},
      {(base_ / "outside.safetensors").string(), "an absolute path"},
      {"../outside.safetensors", "'..'"},
      {"sub/../../outside.safetensors", "'..'"},
      {"", "an empty file name"},
      {std::string("a\0b", 3), "NUL"},
      {"out_link", "outside"},
      {"passwd_link", "outside"},
      {"up/outside.safetensors", "outside"},
      {"sub", "a directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry);
    EXPECT_THAT(d.Resolve(c.entry, "index: weight_map entry 'w'").status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("index: weight_map entry 'w'"),
                               HasSubstr(c.why), HasSubstr(dir_.string()))));
  }
  EXPECT_THAT(d.Resolve("missing.safetensors", "idx").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("idx")));
}

TEST_F(ClosedDirTest, RefusesSpecialFiles) {
  ASSERT_OK_AND_ASSIGN(ClosedDir d, ClosedDir::Open(dir_.string()));
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0600), 0);
  EXPECT_THAT(
      d.Resolve("fifo", "idx").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("it is a FIFO")));
  fs::create_symlink("/dev/zero", dir_ / "zero");
  EXPECT_THAT(
      d.Resolve("zero", "idx").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
}

// The Hugging Face cache: snapshots/REV/x -> ../../blobs/SHA.
TEST_F(ClosedDirTest, FollowsHuggingFaceCacheLinksIntoTheRepositoryBlobs) {
  const fs::path repo = base_ / "hub" / "models--org--tiny";
  const fs::path snapshot = repo / "snapshots" / "abc123";
  fs::create_directories(snapshot);
  fs::create_directories(repo / "blobs");
  Touch(repo / "blobs" / "deadbeef");
  fs::create_symlink("../../blobs/deadbeef", snapshot / "model.safetensors");
  Touch(repo / "secret");
  fs::create_symlink("../../secret", snapshot / "secret.safetensors");
  ASSERT_OK_AND_ASSIGN(ClosedDir d, ClosedDir::Open(snapshot.string()));
  ASSERT_OK_AND_ASSIGN(std::string p, d.Resolve("model.safetensors", "idx"));
  EXPECT_EQ(p, fs::canonical(repo / "blobs" / "deadbeef").string());
  // Only blobs/: the rest of the repository (and the cache) stays out.
  EXPECT_THAT(
      d.Resolve("secret.safetensors", "idx").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  // The same layout elsewhere gives no such exception.
  ASSERT_OK_AND_ASSIGN(ClosedDir plain, ClosedDir::Open(dir_.string()));
  fs::create_symlink(repo / "blobs" / "deadbeef", dir_ / "blob_link");
  EXPECT_FALSE(plain.Resolve("blob_link", "idx").ok());
}

TEST_F(ClosedDirTest, OpenNeedsADirectory) {
  EXPECT_THAT(ClosedDir::Open((dir_ / "model.safetensors").string()).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ClosedDir::Open((base_ / "none").string()).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace tracecut::checkpoint
