#include "util/output_manifest.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "util/files.h"

namespace tracecut::util {
namespace {

namespace fs = std::filesystem;

constexpr char kHeader[] = "# files tracecut wrote here";

// Everything under `dir` but the manifest, as relative paths; directories
// only when empty (a file of ours lives in every other one). Links are not
// followed.
std::set<std::string> Contents(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string rel = it->path().lexically_relative(dir).string();
    if (rel == kOutputManifest) continue;
    std::error_code e;
    if (it->is_directory(e) && !it->is_symlink(e)) {
      if (!fs::is_empty(it->path(), e)) continue;
    }
    out.insert(rel);
  }
  return out;
}

}  // namespace

absl::Status WriteOutputManifest(const std::string& dir) {
  const std::set<std::string> files = Contents(dir);
  std::string text = absl::StrCat(kHeader, "\n");
  for (const std::string& f : files) absl::StrAppend(&text, f, "\n");
  return WriteFileAtomically((fs::path(dir) / kOutputManifest).string(), text);
}

bool HoldsOnlyManifestFiles(const std::string& dir) {
  absl::StatusOr<std::string> text =
      ReadFile((fs::path(dir) / kOutputManifest).string());
  if (!text.ok()) return false;
  std::vector<std::string> lines =
      absl::StrSplit(*text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kHeader) return false;
  const std::set<std::string> listed(lines.begin() + 1, lines.end());
  for (const std::string& f : Contents(dir)) {
    if (!listed.contains(f)) return false;
  }
  return true;
}

absl::Status CheckOutputDirReplaceable(const std::string& dir, bool overwrite,
                                       absl::string_view flag) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dir, ec))) return absl::OkStatus();
  if (!fs::is_directory(fs::symlink_status(dir, ec))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot write ", flag, " '", dir,
        "': it exists and is not a directory; remove it or choose another "
        "path"));
  }
  if (overwrite || fs::is_empty(dir, ec) || HoldsOnlyManifestFiles(dir)) {
    return absl::OkStatus();
  }
  std::set<std::string> listed;
  if (absl::StatusOr<std::string> text =
          ReadFile((fs::path(dir) / kOutputManifest).string());
      text.ok()) {
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      listed.insert(std::string(line));
    }
  }
  std::vector<std::string> foreign;
  for (const std::string& f : Contents(dir)) {
    if (!listed.contains(f)) foreign.push_back(f);
  }
  const size_t shown = std::min<size_t>(foreign.size(), 3);
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to replace ", flag, " '", dir, "': it holds ", foreign.size(),
      foreign.size() == 1 ? " file" : " files", " tracecut did not write (",
      absl::StrJoin(foreign.begin(), foreign.begin() + shown, ", "),
      foreign.size() > shown ? ", ..." : "",
      "); remove them, choose another path, or give --overwrite"));
}

}  // namespace tracecut::util
