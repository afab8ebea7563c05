#include "util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace tracecut::util {
namespace {

namespace fs = std::filesystem;

// Closes `fd`, keeping the first error.
int CloseKeepingErrno(int fd, int err) {
  if (::close(fd) != 0 && err == 0) return errno;
  return err;
}

}  // namespace

absl::Status ErrnoError(int err, absl::string_view context) {
  return absl::ErrnoToStatus(err, context);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  const std::string context = absl::StrCat("cannot write '", path, "'");
  const fs::path target(path);
  if (path.empty() || !target.has_filename()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": not a file path"));
  }
  std::error_code ec;
  if (fs::is_directory(target, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(context, ": it is a directory"));
  }
  const fs::path dir =
      target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmp =
      (dir / absl::StrCat(".", target.filename().string(), ".tmp.XXXXXX"))
          .string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) {
    return ErrnoError(errno,
                      absl::StrCat(context, ": cannot create a file in '",
                                   dir.string(), "'"));
  }
  absl::Cleanup remove_tmp = [&tmp] { ::unlink(tmp.c_str()); };
  int err = 0;
  for (size_t done = 0; done < bytes.size() && err == 0;) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0) {
    // mkstemp makes the file 0600; give it what open(2) would.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    if (::fsync(fd) != 0) err = errno;
  }
  err = CloseKeepingErrno(fd, err);
  if (err != 0) return ErrnoError(err, context);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoError(errno, absl::StrCat(context, ": rename failed"));
  }
  std::move(remove_tmp).Cancel();
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const std::string context = absl::StrCat("cannot read '", path, "'");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, context);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, context);
  if (S_ISDIR(st.st_mode)) return ErrnoError(EISDIR, context);
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, context);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return absl::OkStatus();
  if (fs::exists(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory '", dir,
                     "': it exists and is not a directory"));
  }
  fs::create_directories(dir, ec);
  if (ec) {
    return ErrnoError(ec.value(),
                      absl::StrCat("cannot create directory '", dir, "'"));
  }
  return absl::OkStatus();
}

}  // namespace tracecut::util
