#ifndef TRACECUT_UTIL_OUTPUT_MANIFEST_H_
#define TRACECUT_UTIL_OUTPUT_MANIFEST_H_

// What tracecut wrote into an output directory, so that replacing the
// directory later never removes a file it did not write.
//
//   RETURN_IF_ERROR(util::CheckOutputDirReplaceable(out, overwrite, "-o"));
//   ... build the directory in TMP ...
//   RETURN_IF_ERROR(util::WriteOutputManifest(TMP));  // Then rename onto OUT.
//
// The manifest, OUT/.tracecut-output, lists every file under the directory
// (relative paths, sorted, one per line): deterministic, so identical runs
// still give identical directories.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tracecut::util {

inline constexpr char kOutputManifest[] = ".tracecut-output";

// Writes DIR/.tracecut-output listing every file under `dir`.
absl::Status WriteOutputManifest(const std::string& dir);

// Whether `dir` holds exactly the files its manifest lists.
bool HoldsOnlyManifestFiles(const std::string& dir);

// OK when an output directory may be replaced: it does not exist, is empty,
// or holds only what an earlier run listed in its manifest. Otherwise
// FAILED_PRECONDITION naming `flag`, the directory and a few files tracecut
// did not write, unless `overwrite` (the user's explicit --overwrite); a
// path that is not a directory is refused either way.
absl::Status CheckOutputDirReplaceable(const std::string& dir, bool overwrite,
                                       absl::string_view flag);

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_OUTPUT_MANIFEST_H_
