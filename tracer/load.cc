#include "tracer/load.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ir/status_macros.h"

namespace tracecut::tracer {
namespace {

// Zip signatures: a local file header starts every archive; the end of
// central directory record (at most 64 KiB of comment after it) ends one.
constexpr char kZipLocalHeader[] = {'P', 'K', 3, 4};
constexpr char kZipEndOfCentralDir[] = {'P', 'K', 5, 6};
constexpr size_t kEocdMin = 22;
constexpr size_t kEocdSearch = kEocdMin + 65535;

// The first line of a LibTorch error, without its C++ backtrace or the
// "[enforce fail at file.cc:N] . " prefix of caffe2-style checks.
std::string FirstLine(const char* what) {
  std::string s = what == nullptr ? "" : what;
  std::vector<std::string> lines = absl::StrSplit(s, '\n');
  for (const std::string& line : lines) {
    absl::string_view t = absl::StripAsciiWhitespace(line);
    if (absl::StartsWith(t, "[enforce fail at")) {
      size_t close = t.find(']');
      if (close != absl::string_view::npos) t.remove_prefix(close + 1);
      t = absl::StripLeadingAsciiWhitespace(t);
      if (absl::StartsWith(t, ".")) t.remove_prefix(1);
      t = absl::StripLeadingAsciiWhitespace(t);
    }
    if (!t.empty()) return std::string(t);
  }
  return "unknown error";
}

// Checks the file looks like a complete zip before LibTorch sees it, so each
// kind of bad file gets its own message.
absl::Status CheckArchive(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model path '", path, "' is a directory, not a TorchScript .pt file"));
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open model file '", path,
                                            "': ", std::strerror(errno)));
  }
  std::streamoff size = in.tellg();
  if (size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file '", path, "' is empty (0 bytes)"));
  }
  in.seekg(0);
  char head[4] = {0, 0, 0, 0};
  in.read(head, std::min<std::streamoff>(size, 4));
  if (size < 4 || std::memcmp(head, kZipLocalHeader, 4) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model file '", path,
        "' is not a TorchScript archive (not a zip file; expected a .pt "
        "written by torch.jit.save)"));
  }
  size_t tail = static_cast<size_t>(
      std::min<std::streamoff>(size, static_cast<std::streamoff>(kEocdSearch)));
  std::vector<char> buf(tail);
  in.seekg(size - static_cast<std::streamoff>(tail));
  in.read(buf.data(), static_cast<std::streamsize>(tail));
  bool found = false;
  for (size_t i = tail >= kEocdMin ? tail - kEocdMin + 1 : 0; i-- > 0;) {
    if (std::memcmp(buf.data() + i, kZipEndOfCentralDir, 4) == 0) {
      found = true;
      break;
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model file '", path, "' is truncated or corrupt (", size,
        " bytes; the zip archive has no end-of-central-directory record)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const std::string& path) {
  RETURN_IF_ERROR(CheckArchive(path));
  torch::jit::ExtraFilesMap extra = {{kConfigJson, ""}, {kInputsJson, ""}};
  LoadedModel loaded;
  loaded.path = path;
  try {
    loaded.module = torch::jit::load(path, torch::kCPU, extra);
  } catch (const c10::Error& e) {
    // The archive is a complete zip (CheckArchive): a reader error means it
    // does not hold what torch.jit.save writes.
    std::string first = FirstLine(e.what_without_backtrace());
    if (first.find("constants.pkl") != std::string::npos ||
        first.find("bytecode.pkl") != std::string::npos ||
        first.find("code/") != std::string::npos ||
        first.find("PytorchStreamReader") != std::string::npos ||
        first.find("not in a subdirectory") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model file '", path,
          "' is a zip archive but not a TorchScript model (was it saved with "
          "torch.save instead of torch.jit.save?): ",
          first));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load TorchScript model '", path, "': ", first));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot load TorchScript model '", path, "': ", FirstLine(e.what())));
  }
  for (const auto& [name, text] : extra) {
    if (!text.empty()) loaded.extra_files[name] = text;
  }
  if (!extra[kConfigJson].empty()) {
    ASSIGN_OR_RETURN(loaded.config,
                     hf::HfConfig::Parse(extra[kConfigJson],
                                         absl::StrCat(path, ":", kConfigJson)));
  }
  if (!extra[kInputsJson].empty()) {
    ASSIGN_OR_RETURN(loaded.inputs,
                     hf::ParseInputsJson(extra[kInputsJson],
                                         absl::StrCat(path, ":", kInputsJson)));
  }
  return loaded;
}

}  // namespace tracecut::tracer
