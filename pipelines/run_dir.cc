#include "pipelines/run_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "util/files.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

constexpr char kLockFile[] = "lock";
constexpr char kSpillDir[] = "spill";
// Where a streamed run writes its shards (CompressedTensorsWriter).
constexpr char kOutputDir[] = "output";

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The names in `dir` that `keep` accepts.
template <typename Keep>
std::vector<std::string> Names(const std::string& dir, Keep keep) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (keep(absl::string_view(e->d_name))) names.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return names;
}

// Removes the files a pipeline writes into a run directory, then the
// directory if it is empty (anything else in it is left alone).
void RemoveRunFiles(const std::string& dir) {
  RemoveSpillFiles(absl::StrCat(dir, "/", kSpillDir), 0);
  std::error_code ec;
  std::filesystem::remove_all(absl::StrCat(dir, "/", kOutputDir), ec);
  std::remove(absl::StrCat(dir, "/", kLockFile).c_str());
  // With the temporaries of a run killed while writing one of them
  // (util::WriteFileAtomically's ".state.pt.tmp.XXXXXX").
  for (const std::string& name : Names(dir, [](absl::string_view name) {
         absl::string_view file = absl::StripPrefix(name, ".");
         return absl::StartsWith(file, "state.pt") ||
                absl::StartsWith(file, "weights-");
       })) {
    std::remove(absl::StrCat(dir, "/", name).c_str());
  }
  ::rmdir(dir.c_str());
}

bool HasCheckpointIn(const std::string& dir) {
  return !Names(dir, [](absl::string_view name) {
            return absl::StartsWith(name, "state.pt");
          }).empty();
}

std::string WorldDescription(int world_size) {
  return world_size == 1 ? "1 (one process)" : absl::StrCat(world_size);
}

}  // namespace

std::string RunDirFor(absl::string_view output, absl::string_view run_dir) {
  return run_dir.empty() ? absl::StrCat(output, ".run") : std::string(run_dir);
}

void RemoveSpillFiles(const std::string& dir, int64_t pid) {
  const std::string prefix =
      pid == 0 ? "tracecut-" : absl::StrCat("tracecut-", pid, "-");
  for (const std::string& name : Names(dir, [&](absl::string_view name) {
         return absl::StartsWith(name, prefix);
       })) {
    std::remove(absl::StrCat(dir, "/", name).c_str());
  }
  ::rmdir(dir.c_str());
}

// An advisory lock (flock) on the lock file for the whole run: the file
// holds the owner's pid; the kernel drops the lock when the owner dies,
// however it dies, so a lock that can be taken is never stale.
absl::StatusOr<std::unique_ptr<RunDir>> RunDir::Open(const std::string& base,
                                                     absl::string_view rank_dir,
                                                     absl::string_view output) {
  const std::string path =
      rank_dir.empty() ? base : absl::StrCat(base, "/", rank_dir);
  const bool base_existed = IsDirectory(base);
  const bool path_existed = IsDirectory(path);
  if (!rank_dir.empty()) RETURN_IF_ERROR(util::MakeDirs(base));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return util::ErrnoError(
        errno, absl::StrCat("cannot create the run directory ", path));
  }
  const std::string lock = absl::StrCat(path, "/", kLockFile);
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return util::ErrnoError(errno, absl::StrCat("cannot open ", lock));
  }
  char buf[32] = {};
  ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  int64_t pid = 0;
  if (n > 0) {
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(buf), &pid);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "another tracecut run (pid ", pid, ") is writing ", output,
          " (it holds ", lock,
          "); wait for it to finish or choose another -o / --run-dir"));
    }
    return util::ErrnoError(err, absl::StrCat("cannot lock ", lock));
  }
  const std::string mine = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, mine.data(), mine.size(), 0) !=
                                     static_cast<ssize_t>(mine.size())) {
    const int err = errno;
    ::close(fd);
    return util::ErrnoError(err, absl::StrCat("cannot write ", lock));
  }
  std::unique_ptr<RunDir> dir(
      new RunDir(base, path, base_existed, path_existed, fd, pid));
  // Spill files go under the run directory (unless the recipe says where),
  // so the leftovers of a run killed with SIGKILL are found and removed
  // here by the next run on the same output.
  RemoveSpillFiles(dir->spill_dir(), 0);
  return dir;
}

RunDir::RunDir(std::string base, std::string path, bool base_existed,
               bool path_existed, int fd, int64_t previous_pid)
    : base_(std::move(base)),
      path_(std::move(path)),
      base_existed_(base_existed),
      path_existed_(path_existed),
      fd_(fd),
      previous_pid_(previous_pid) {}

RunDir::~RunDir() {
  if (!done_) {
    // A run directory this run created is removed again; in one it did not
    // create, only the lock and spill files it made go.
    if (!path_existed_) {
      RemoveRunFiles(path_);
      if (!base_existed_) ::rmdir(base_.c_str());
    } else {
      RemoveSpillFiles(spill_dir(), ::getpid());
      std::remove(absl::StrCat(path_, "/", kLockFile).c_str());
    }
  }
  ::close(fd_);
}

std::string RunDir::spill_dir() const {
  return absl::StrCat(path_, "/", kSpillDir);
}

std::string RunDir::output_dir() const {
  return absl::StrCat(path_, "/", kOutputDir);
}

bool RunDir::HasCheckpoint() const { return HasCheckpointIn(path_); }

void RunDir::Remove() {
  done_ = true;
  RemoveRunFiles(path_);
  if (path_ != base_) ::rmdir(base_.c_str());  // When the last rank is out.
}

std::string RankDirName(int rank, int world_size) {
  return absl::StrCat("rank-", rank, "-of-", world_size);
}

absl::Status CheckResumeWorldSize(const std::string& base, int world_size) {
  // The world size of the checkpoints in `base` other than `world_size`
  // (1: one process's state.pt), or 0 when there are none.
  int other = 0;
  if (world_size != 1 &&
      ::access(absl::StrCat(base, "/state.pt").c_str(), F_OK) == 0) {
    other = 1;
  }
  for (const std::string& name : Names(base, [](absl::string_view name) {
         return absl::StartsWith(name, "rank-");
       })) {
    absl::string_view rest = absl::StripPrefix(name, "rank-");
    std::vector<absl::string_view> parts = absl::StrSplit(rest, "-of-");
    int rank = 0, world = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rank) ||
        !absl::SimpleAtoi(parts[1], &world) || world == world_size) {
      continue;
    }
    if (HasCheckpointIn(absl::StrCat(base, "/", name))) other = world;
  }
  if (other == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot resume: the checkpoint in ", base, " was made with world size ",
      WorldDescription(other), ", this run has world size ",
      WorldDescription(world_size), "; resume with ",
      other == 1 ? "no --nproc-per-node (and no WORLD_SIZE)"
                 : absl::StrCat("--nproc-per-node=", other,
                                " (or WORLD_SIZE=", other, ")"),
      ", or delete ", base, " to start afresh"));
}

}  // namespace tracecut::pipelines
