#include "util/path_guard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "util/files.h"
#include "util/format.h"

namespace tracecut::util {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::string FileKind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path,
                                            absl::string_view what,
                                            bool follow_links) {
  const std::string prefix = what.empty() ? "" : absl::StrCat(what, ": ");
  const std::string context = absl::StrCat(prefix, "cannot open '", path, "'");
  const int flags =
      O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW);
  RegularFile f;
  f.fd = UniqueFd(::open(path.c_str(), flags));
  if (f.fd.get() < 0) {
    const int err = errno;
    if (err == ELOOP && !follow_links) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "'", path, "' is a symbolic link, not a regular file"));
    }
    return ErrnoError(err, context);
  }
  struct stat st;
  if (::fstat(f.fd.get(), &st) != 0) return ErrnoError(errno, context);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "'", path, "' is ",
                                                   FileKind(st.st_mode),
                                                   ", not a regular file"));
  }
  // Reads block again (O_NONBLOCK was only for the open).
  ::fcntl(f.fd.get(), F_SETFL, ::fcntl(f.fd.get(), F_GETFL) & ~O_NONBLOCK);
  f.size = static_cast<uint64_t>(st.st_size);
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  return f;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes,
                                            absl::string_view what) {
  absl::StatusOr<RegularFile> f = OpenRegularFile(path, what);
  if (!f.ok()) return f.status();
  if (f->size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": '", path, "' has ", HumanBytes(static_cast<int64_t>(f->size)),
        ", more than the ", HumanBytes(static_cast<int64_t>(max_bytes)),
        " tracecut reads from such a file"));
  }
  std::string out(static_cast<size_t>(f->size), '\0');
  size_t done = 0;
  // A file that grows while read is cut at the size it had.
  while (done < out.size()) {
    const ssize_t n = ::read(f->fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoError(errno,
                        absl::StrCat(what, ": cannot read '", path, "'"));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

absl::StatusOr<std::string> ResolvedPath(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(
      path.empty() ? std::filesystem::path(".") : std::filesystem::path(path),
      ec);
  if (ec) {
    return ErrnoError(ec.value(),
                      absl::StrCat("cannot resolve the path '", path, "'"));
  }
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool IsWithin(absl::string_view inner, absl::string_view outer) {
  if (inner.size() < outer.size() || inner.substr(0, outer.size()) != outer) {
    return false;
  }
  return inner.size() == outer.size() || outer == "/" ||
         inner[outer.size()] == '/';
}

absl::Status CheckOutputApart(const NamedPath& output,
                              const std::vector<NamedPath>& inputs) {
  if (output.path.empty() || output.path == "-") return absl::OkStatus();
  absl::StatusOr<std::string> out = ResolvedPath(output.path);
  if (!out.ok()) return out.status();
  struct stat out_st;
  const bool out_exists = ::stat(output.path.c_str(), &out_st) == 0;
  auto refuse = [&](const NamedPath& input, absl::string_view how) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to write ", output.role, " '", output.path, "': ", how, " ",
        input.role, " '", input.path,
        "'; tracecut never writes over its inputs, choose another path"));
  };
  for (const NamedPath& input : inputs) {
    struct stat in_st;
    if (input.path.empty() || ::stat(input.path.c_str(), &in_st) != 0) {
      continue;
    }
    absl::StatusOr<std::string> in = ResolvedPath(input.path);
    if (!in.ok()) continue;
    if (*out == *in || (out_exists && out_st.st_dev == in_st.st_dev &&
                        out_st.st_ino == in_st.st_ino)) {
      return refuse(input, "it is the");
    }
    if (IsWithin(*in, *out)) return refuse(input, "it contains the");
    if (S_ISDIR(in_st.st_mode) && IsWithin(*out, *in)) {
      return refuse(input, "it lies inside the");
    }
  }
  return absl::OkStatus();
}

}  // namespace tracecut::util
