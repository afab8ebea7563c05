#include "pipelines/run_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::pipelines {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;
using ::tracecut::util::testing::TempDir;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(RunDirTest, DefaultIsBesideTheOutput) {
  EXPECT_EQ(RunDirFor("out/model", ""), "out/model.run");
  EXPECT_EQ(RunDirFor("out/model", "/tmp/r"), "/tmp/r");
}

TEST(RunDirTest, FailedRunRemovesTheDirectoryItCreated) {
  const std::string base = TempDir("run_dir_created") + "/m.run";
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RunDir> dir,
                         RunDir::Open(base, "", "m"));
    EXPECT_EQ(dir->path(), base);
    Touch(base + "/state.pt");
    EXPECT_TRUE(dir->HasCheckpoint());
  }
  EXPECT_FALSE(Exists(base));
}

TEST(RunDirTest, FailedRunInAnExistingDirectoryRemovesOnlyItsLock) {
  const std::string base = TempDir("run_dir_existing");
  Touch(base + "/state.pt");
  Touch(base + "/notes.txt");
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RunDir> dir,
                         RunDir::Open(base, "", "m"));
    EXPECT_TRUE(Exists(base + "/lock"));
  }
  EXPECT_FALSE(Exists(base + "/lock"));
  EXPECT_TRUE(Exists(base + "/state.pt"));
  EXPECT_TRUE(Exists(base + "/notes.txt"));
}

TEST(RunDirTest, KeptStaysRemovedGoesButNotOthersFiles) {
  const std::string base = TempDir("run_dir_keep") + "/m.run";
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RunDir> dir,
                         RunDir::Open(base, "", "m"));
    Touch(base + "/state.pt");
    dir->Keep();
  }
  EXPECT_TRUE(Exists(base + "/state.pt"));
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<RunDir> dir,
                         RunDir::Open(base, "", "m"));
    Touch(base + "/notes.txt");
    dir->Remove();
  }
  EXPECT_FALSE(Exists(base + "/state.pt"));
  EXPECT_FALSE(Exists(base + "/lock"));
  EXPECT_TRUE(Exists(base + "/notes.txt"));
}

TEST(RunDirTest, SecondOpenWhileLockedNamesTheHolder) {
  const std::string base = TempDir("run_dir_locked") + "/m.run";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RunDir> first,
                       RunDir::Open(base, "", "m"));
  // flock is per open file description: a second open in this process
  // conflicts as another process's would.
  EXPECT_THAT(RunDir::Open(base, "", "m").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("another tracecut run (pid ",
                                              ::getpid(), ") is writing m"))));
  first->Remove();
}

TEST(RunDirTest, LeftoverSpillFilesOfAnEarlierRunAreRemoved) {
  const std::string base = TempDir("run_dir_spill") + "/m.run";
  ASSERT_EQ(::mkdir(base.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((base + "/spill").c_str(), 0755), 0);
  Touch(base + "/spill/tracecut-99999-0.pt");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RunDir> dir,
                       RunDir::Open(base, "", "m"));
  EXPECT_FALSE(Exists(base + "/spill/tracecut-99999-0.pt"));
  dir->Remove();
  EXPECT_FALSE(Exists(base));
}

TEST(RunDirTest, RanksGetTheirOwnDirectoryUnderTheBase) {
  const std::string base = TempDir("run_dir_ranks") + "/m.run";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RunDir> dir,
                       RunDir::Open(base, RankDirName(1, 2), "m"));
  EXPECT_EQ(dir->path(), base + "/rank-1-of-2");
  EXPECT_EQ(dir->base(), base);
  Touch(dir->path() + "/state.pt");
  EXPECT_THAT(CheckResumeWorldSize(base, 3),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("made with world size 2, this run has "
                                 "world size 3; resume with "
                                 "--nproc-per-node=2")));
  EXPECT_OK(CheckResumeWorldSize(base, 2));
  dir->Remove();
  EXPECT_FALSE(Exists(base));
}

}  // namespace
}  // namespace tracecut::pipelines
