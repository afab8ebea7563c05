#include "checkpoint/closed_dir.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/files.h"
#include "util/path_guard.h"

namespace tracecut::checkpoint {
namespace {

// realpath(3): every link, "." and ".." resolved; errno on failure.
absl::StatusOr<std::string> RealPath(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> real(
      ::realpath(path.c_str(), nullptr), &std::free);
  if (real == nullptr) return util::ErrnoError(errno, "realpath");
  return std::string(real.get());
}

}  // namespace

absl::StatusOr<ClosedDir> ClosedDir::Open(const std::string& dir) {
  absl::StatusOr<std::string> root = RealPath(dir);
  struct stat st;
  if (!root.ok() || ::stat(root->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory '", dir, "' is not a directory"));
  }
  ClosedDir out;
  out.dir_ = dir;
  out.roots_.push_back(*root);
  // A Hugging Face cache snapshot: REPO/snapshots/REV, its files links into
  // REPO/blobs.
  const std::filesystem::path rev(*root);
  const std::filesystem::path snapshots = rev.parent_path();
  const std::filesystem::path repo = snapshots.parent_path();
  if (snapshots.filename() == "snapshots" &&
      absl::StartsWith(repo.filename().string(), "models--")) {
    if (absl::StatusOr<std::string> blobs = RealPath((repo / "blobs").string());
        blobs.ok()) {
      out.roots_.push_back(*blobs);
    }
  }
  return out;
}

absl::StatusOr<std::string> ClosedDir::Resolve(absl::string_view entry,
                                               absl::string_view where) const {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", why,
                     "; a checkpoint's files must be regular files "
                     "inside its directory '",
                     dir_, "'"));
  };
  if (entry.empty()) return refuse("an empty file name");
  if (entry.find('\0') != absl::string_view::npos) {
    return refuse("a file name with a NUL byte");
  }
  if (entry.front() == '/') return refuse("an absolute path");
  for (absl::string_view part : absl::StrSplit(entry, '/')) {
    if (part == "..") return refuse("a path with '..'");
  }
  const std::string joined = absl::StrCat(roots_.front(), "/", entry);
  absl::StatusOr<std::string> real = RealPath(joined);
  if (!real.ok()) {
    if (absl::IsNotFound(real.status())) {
      return absl::NotFoundError(
          absl::StrCat(where, ": no such file in '", dir_, "'"));
    }
    return refuse(
        absl::StrCat("cannot resolve it (", real.status().message(), ")"));
  }
  bool inside = false;
  for (const std::string& root : roots_) inside |= util::IsWithin(*real, root);
  if (!inside) {
    return refuse(
        "a symbolic link (or a directory link on the way) to a "
        "file outside");
  }
  struct stat st;
  if (::stat(real->c_str(), &st) != 0) {
    return util::ErrnoError(errno, absl::StrCat(where, ": cannot stat it"));
  }
  if (!S_ISREG(st.st_mode)) {
    return refuse(absl::StrCat("it is ", util::FileKind(st.st_mode)));
  }
  return *std::move(real);
}

}  // namespace tracecut::checkpoint
