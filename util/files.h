#ifndef TRACECUT_UTIL_FILES_H_
#define TRACECUT_UTIL_FILES_H_

// Files as tracecut writes them: never half-written.
//
//   RETURN_IF_ERROR(util::WriteFileAtomically(path, bytes));
//   ASSIGN_OR_RETURN(std::string text, util::ReadFile(path));
//
// Errors name the path and carry the errno's absl code (absl::ErrnoToStatus:
// ENOSPC is RESOURCE_EXHAUSTED, EACCES PERMISSION_DENIED, ENOENT NOT_FOUND).

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::util {

// "<context>: <strerror(err)>" with the code absl::ErrnoToStatus gives err.
absl::Status ErrnoError(int err, absl::string_view context);

// Writes `bytes` to `path` so that `path` holds either its old content or
// all of `bytes`: a temporary file in the same directory ("."<name>".tmp.*"),
// written, fsync'ed, then renamed over `path`; on any failure the temporary
// is removed and `path` is untouched. The file gets mode 0666 & ~umask, like
// a file created normally. Errors read "cannot write '<path>': <why>".
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes);

// The whole file. Errors read "cannot read '<path>': <why>"; a directory is
// an error, not an empty file.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Creates `dir` and its missing parents (mode 0777 & ~umask); an existing
// directory is fine, an existing non-directory is FAILED_PRECONDITION.
absl::Status MakeDirs(const std::string& dir);

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_FILES_H_
