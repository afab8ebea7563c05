#include "util/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::util {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::tracecut::util::testing::IsOk;
using ::tracecut::util::testing::IsOkAndHolds;
using ::tracecut::util::testing::StatusIs;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(std::getenv("TEST_TMPDIR")) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  // Names in dir_ other than the ones a test made: leftover temporaries.
  int Entries() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) {
      (void)e;
      ++n;
    }
    return n;
  }
  fs::path dir_;
};

TEST_F(FilesTest, WritesAndReplacesWholeFiles) {
  const std::string path = (dir_ / "out.txt").string();
  ASSERT_THAT(WriteFileAtomically(path, "first"), IsOk());
  EXPECT_THAT(ReadFile(path), IsOkAndHolds("first"));
  ASSERT_THAT(WriteFileAtomically(path, std::string(1 << 20, 'x')), IsOk());
  EXPECT_THAT(ReadFile(path), IsOkAndHolds(std::string(1 << 20, 'x')));
  EXPECT_EQ(Entries(), 1);  // No temporary left behind.
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);
}

TEST_F(FilesTest, WriteErrorsNameThePathAndLeaveNothing) {
  EXPECT_THAT(WriteFileAtomically((dir_ / "missing" / "x").string(), "x"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("cannot write '" +
                                 (dir_ / "missing" / "x").string() + "'")));
  EXPECT_THAT(WriteFileAtomically(dir_.string(), "x"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("it is a directory")));
  EXPECT_THAT(WriteFileAtomically((dir_ / "").string(), "x"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(Entries(), 0);
}

TEST_F(FilesTest, FullDiskKeepsTheOldFile) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  // /dev/full's directory cannot take a temporary; a failed write leaves
  // the target untouched either way.
  const std::string path = (dir_ / "keep.txt").string();
  ASSERT_THAT(WriteFileAtomically(path, "old"), IsOk());
  ASSERT_EQ(::chmod(dir_.c_str(), 0500), 0);
  absl::Status s = WriteFileAtomically(path, "new");
  ::chmod(dir_.c_str(), 0700);
  if (::geteuid() != 0) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                            HasSubstr("cannot create a file in")));
  }
  if (!s.ok()) EXPECT_THAT(ReadFile(path), IsOkAndHolds("old"));
}

TEST_F(FilesTest, ReadErrors) {
  EXPECT_THAT(ReadFile((dir_ / "nope").string()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_THAT(ReadFile(dir_.string()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cannot read '" + dir_.string() + "'")));
}

TEST_F(FilesTest, MakeDirs) {
  const std::string deep = (dir_ / "a" / "b" / "c").string();
  ASSERT_THAT(MakeDirs(deep), IsOk());
  EXPECT_TRUE(fs::is_directory(deep));
  EXPECT_THAT(MakeDirs(deep), IsOk());
  ASSERT_THAT(WriteFileAtomically((dir_ / "f").string(), "x"), IsOk());
  EXPECT_THAT(MakeDirs((dir_ / "f").string()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(ErrnoErrorTest, CodesFollowAbsl) {
  EXPECT_THAT(ErrnoError(ENOSPC, "cannot write 'x'"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("cannot write 'x': No space left")));
  EXPECT_THAT(ErrnoError(EACCES, "c"),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

}  // namespace
}  // namespace tracecut::util
