#include "tools/cli/launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "pipelines/interrupt.h"
#include "tools/cli/common.h"
#include "util/files.h"

extern char** environ;

namespace tracecut::cli {
namespace {

absl::StatusOr<std::vector<std::string>> OwnCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  if (!in.good() && !in.eof()) {
    return absl::InternalError("cannot read /proc/self/cmdline");
  }
  std::vector<std::string> args = absl::StrSplit(all, '\0');
  while (!args.empty() && args.back().empty()) args.pop_back();
  if (args.empty()) return absl::InternalError("empty /proc/self/cmdline");
  return args;
}

// A port nobody listens on now (the kernel's pick for port 0).
absl::StatusOr<int> FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return util::ErrnoError(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return util::ErrnoError(err, "cannot find a free port on 127.0.0.1");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last non-empty line of a rank's log, without "tracecut calibrate: ".
std::string LastMessage(const std::string& log) {
  std::vector<absl::string_view> lines =
      absl::StrSplit(log, '\n', absl::SkipWhitespace());
  if (lines.empty()) return "";
  absl::string_view line = lines.back();
  absl::ConsumePrefix(&line, "tracecut calibrate: ");
  absl::ConsumePrefix(&line, "error: ");
  return std::string(line);
}

struct Rank {
  pid_t pid = -1;
  std::string log;
  bool done = false;
  int status = 0;
  bool stopped_by_us = false;
};

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status));
  }
  return absl::StrCat("exit status ", WEXITSTATUS(status));
}

// The launcher's environment with rank `r`'s c10d variables in place of
// any it had.
std::vector<std::string> RankEnvironment(int r, int nproc, int port) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view v(*e);
    if (absl::StartsWith(v, "RANK=") || absl::StartsWith(v, "WORLD_SIZE=") ||
        absl::StartsWith(v, "LOCAL_RANK=") ||
        absl::StartsWith(v, "LOCAL_WORLD_SIZE=") ||
        absl::StartsWith(v, "MASTER_ADDR=") ||
        absl::StartsWith(v, "MASTER_PORT=")) {
      continue;
    }
    env.emplace_back(v);
  }
  env.push_back(absl::StrCat("RANK=", r));
  env.push_back(absl::StrCat("LOCAL_RANK=", r));
  env.push_back(absl::StrCat("WORLD_SIZE=", nproc));
  env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", nproc));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back(absl::StrCat("MASTER_PORT=", port));
  return env;
}

// The rank whose failure stopped the run: one that failed on its own rather
// than through a collective that saw another rank go (those say "another
// rank died"); `first_failed` when every one did. Sets `message` to its
// last error line.
int FailureCause(const std::vector<Rank>& ranks, int first_failed,
                 std::string& message) {
  message = LastMessage(ReadFile(ranks[first_failed].log));
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].stopped_by_us) continue;
    const int st = ranks[r].status;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
    std::string m = LastMessage(ReadFile(ranks[r].log));
    if (!absl::StrContains(m, "another rank died")) {
      message = std::move(m);
      return static_cast<int>(r);
    }
  }
  return first_failed;
}

// How many ranks kept a checkpoint: ranks keep theirs in
// RUN_DIR/rank-R-of-N/state.pt.NNNNN.
int CheckpointedRanks(const std::string& run_dir, int nproc) {
  if (run_dir.empty()) return 0;
  std::error_code ec;
  int checkpointed = 0;
  for (int r = 0; r < nproc; ++r) {
    const std::string dir = absl::StrCat(run_dir, "/rank-", r, "-of-", nproc);
    for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
      if (absl::StartsWith(f.path().filename().string(), "state.pt")) {
        ++checkpointed;
        break;
      }
    }
  }
  return checkpointed;
}

}  // namespace

bool IsLaunchedRank() {
  const char* rank = std::getenv("RANK");
  return rank != nullptr && *rank != '\0';
}

absl::Status LaunchLocalRanks(int nproc,
                              const std::vector<std::string>& outputs,
                              const std::string& run_dir, Io& io) {
  absl::StatusOr<std::vector<std::string>> args = OwnCommandLine();
  if (!args.ok()) return args.status();
  absl::StatusOr<int> port = FreePort();
  if (!port.ok()) return port.status();
  std::vector<std::string> created;
  for (const std::string& o : outputs) {
    if (!o.empty() && !Exists(o)) created.push_back(o);
  }
  const bool run_dir_created = !run_dir.empty() && !Exists(run_dir);
  char dir_template[] = "/tmp/tracecut-ranks-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    return util::ErrnoError(errno, "cannot create a directory for rank logs");
  }
  const std::string log_dir = dir_template;

  std::vector<char*> argv;
  for (std::string& a : *args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<Rank> ranks(nproc);
  io.err.flush();
  // SIGINT / SIGTERM to the launcher go to the ranks, which stop at their
  // next safe point; the launcher waits for them and then exits as the
  // signal would.
  pipelines::InstallInterruptHandlers();
  const pid_t launcher = ::getpid();
  for (int r = 0; r < nproc; ++r) {
    ranks[r].log = absl::StrCat(log_dir, "/rank-", r, ".log");
    std::vector<std::string> env = RankEnvironment(r, nproc, *port);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      for (int q = 0; q < r; ++q) ::kill(ranks[q].pid, SIGKILL);
      for (int q = 0; q < r; ++q) ::waitpid(ranks[q].pid, nullptr, 0);
      std::filesystem::remove_all(log_dir);
      return util::ErrnoError(err, "cannot start the ranks (fork)");
    }
    if (pid == 0) {
      // A rank whose launcher dies (SIGKILL, a crash) stops too.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);
      FILE* f = std::freopen(ranks[r].log.c_str(), "w", stderr);
      if (f == nullptr) ::_exit(127);
      ::execve("/proc/self/exe", argv.data(), envp.data());
      ::_exit(127);
    }
    ranks[r].pid = pid;
  }

  // Wait; at the first failure stop the others.
  int remaining = nproc;
  int first_failed = -1;
  auto reap = [&](int options) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, options);
    if (pid <= 0) return false;
    for (int r = 0; r < nproc; ++r) {
      if (ranks[r].pid != pid || ranks[r].done) continue;
      ranks[r].done = true;
      ranks[r].status = status;
      --remaining;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && first_failed < 0) first_failed = r;
    }
    return true;
  };
  while (remaining > 0 && first_failed < 0 &&
         pipelines::InterruptSignal() == 0) {
    if (!reap(0) && errno != EINTR) break;
  }
  // Only a signal that found ranks running stops the run.
  const int interrupted = remaining > 0 ? pipelines::InterruptSignal() : 0;
  if (interrupted != 0) {
    for (const Rank& r : ranks) {
      if (!r.done) ::kill(r.pid, interrupted);
    }
    // A rank stops at its next safe point (between batches), checkpointing
    // what it has; one that takes longer than this is killed.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (remaining > 0 && std::chrono::steady_clock::now() < until) {
      if (!reap(WNOHANG)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  if (interrupted != 0 && first_failed < 0) first_failed = 0;
  if (first_failed >= 0 && remaining > 0) {
    // Others that fail within a moment failed on their own (they saw the
    // first one go); those still running are stopped.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (remaining > 0 && std::chrono::steady_clock::now() < until) {
      if (!reap(WNOHANG)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    for (Rank& r : ranks) {
      if (!r.done) {
        r.stopped_by_us = true;
        ::kill(r.pid, SIGKILL);
      }
    }
    while (remaining > 0) {
      if (!reap(0) && errno != EINTR) break;
    }
  }

  if (first_failed < 0) {
    io.err << ReadFile(ranks[0].log);
    std::filesystem::remove_all(log_dir);
    return absl::OkStatus();
  }
  std::string message;
  const int cause = FailureCause(ranks, first_failed, message);
  std::error_code ec;
  for (const std::string& path : created) {
    std::filesystem::remove_all(path, ec);
  }
  std::filesystem::remove_all(log_dir, ec);
  // The run can continue when every rank kept a checkpoint.
  const int checkpointed = CheckpointedRanks(run_dir, nproc);
  // What killed ranks left (lock files, a checkpoint of some ranks only).
  if (!run_dir.empty() && checkpointed < nproc && run_dir_created) {
    std::filesystem::remove_all(run_dir, ec);
  }
  std::string resume;
  if (checkpointed == nproc && !absl::StrContains(message, "--resume")) {
    resume = absl::StrCat("; the checkpoints in ", run_dir,
                          " are kept: rerun the same command with --resume "
                          "to continue");
  }
  if (interrupted != 0) {
    return WithExitCode(
        absl::CancelledError(absl::StrCat(
            "interrupted by ", interrupted == SIGINT ? "SIGINT" : "SIGTERM",
            "; the ", nproc, " ranks were stopped and no output was written",
            resume)),
        128 + interrupted);
  }
  return absl::UnavailableError(absl::StrFormat(
      "rank %d of %d failed (%s)%s; the other ranks were stopped and no "
      "output was written%s",
      cause, nproc, DescribeExit(ranks[cause].status),
      message.empty() ? "" : absl::StrCat(": ", message), resume));
}

}  // namespace tracecut::cli
