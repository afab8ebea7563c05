#ifndef TRACECUT_UTIL_PATH_GUARD_H_
#define TRACECUT_UTIL_PATH_GUARD_H_

// Paths from people and from files, taken carefully: inputs are opened only
// when they are regular files (a FIFO would block, /dev/zero never ends) and
// read only up to a limit; outputs are refused when they would overwrite,
// replace or land inside an input.
//
//   ASSIGN_OR_RETURN(std::string text,
//                    util::ReadRegularFile(path, 64 << 20, "--recipe"));
//   RETURN_IF_ERROR(util::CheckOutputApart(
//       {"-o", out}, {{"input model", model}, {"--data", data}}));

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::util {

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// "a directory", "a FIFO", "a character device", ... for `mode`.
std::string FileKind(mode_t mode);

struct RegularFile {
  UniqueFd fd;
  uint64_t size = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

// Opens `path` read-only: without blocking (a FIFO's open would wait for a
// writer), without following a final symbolic link when `follow_links` is
// false, and only when it is a regular file (checked on the open file, so a
// swap after a check cannot slip through). Errors name `what` ("--data",
// "model file") and the path: "--data: '/dev/zero' is a character device,
// not a regular file".
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path,
                                            absl::string_view what,
                                            bool follow_links = true);

// The whole of a regular file of at most `max_bytes` bytes, checked before
// anything is allocated ("--recipe: '/x' has 3 GB, more than the 64 MB a
// recipe may have").
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes,
                                            absl::string_view what);

// `path` with every symbolic link, "." and ".." resolved; for a path that
// does not exist yet, its existing directory resolved and the rest appended.
absl::StatusOr<std::string> ResolvedPath(const std::string& path);

// Whether `inner` is `outer` or lies below it (both resolved paths).
bool IsWithin(absl::string_view inner, absl::string_view outer);

// A path tracecut reads or writes and how the user named it ("-o",
// "--report", "input checkpoint directory").
struct NamedPath {
  std::string role;
  std::string path;
};

// Fails before any work when writing `output` could touch an input: it is
// an input (also through symbolic or hard links), it contains one (writing
// a directory output replaces it), or it lies inside an input directory.
// Inputs that do not exist and empty paths are skipped. The error names both
// paths and their roles.
absl::Status CheckOutputApart(const NamedPath& output,
                              const std::vector<NamedPath>& inputs);

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_PATH_GUARD_H_
