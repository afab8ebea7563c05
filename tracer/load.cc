#include "tracer/load.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "checkpoint/closed_dir.h"
#include "runtime/dtype.h"
#include "tracer/export/pt2_archive.h"
#include "tracer/export/pt2_import.h"
#include "tracer/native_model.h"
#include "util/path_guard.h"
#include "util/status_macros.h"

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
  // A FIFO would block the read below; a device never ends.
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    RETURN_IF_ERROR(util::OpenRegularFile(path, "model file").status());
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

// Parses the embedded files tracecut knows into `loaded`.
absl::Status ReadModelFiles(const std::string& path,
                            torch::jit::ExtraFilesMap& extra,
                            LoadedModel& loaded) {
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
  if (!extra[kModelJson].empty() && loaded.config.has_value()) {
    const std::string source = absl::StrCat(path, ":", kModelJson);
    std::vector<std::string> types;
    try {
      nlohmann::json j = nlohmann::json::parse(extra[kModelJson]);
      if (j.contains("no_split_modules")) {
        types = j["no_split_modules"].get<std::vector<std::string>>();
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": \"no_split_modules\" must be a list of strings (",
          e.what(), ")"));
    }
    loaded.config->set_no_split_modules(std::move(types));
  }
  return absl::OkStatus();
}

// A checkpoint directory holding one .pt2: that file; nullopt for none.
absl::StatusOr<std::optional<std::string>> Pt2InDirectory(
    const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    // Hidden names are temporaries (an export killed before it renamed
    // ".model.pt2.PID.tmp.pt2" into place), never the model.
    if (entry.is_regular_file() && entry.path().extension() == ".pt2" &&
        entry.path().filename().string()[0] != '.') {
      found.push_back(entry.path().string());
    }
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat("cannot list model directory '",
                                            dir, "': ", ec.message()));
  }
  std::sort(found.begin(), found.end());
  if (found.size() == 1) return found[0];
  if (found.empty()) return std::nullopt;
  return absl::InvalidArgumentError(
      absl::StrCat("model directory '", dir, "' holds several .pt2 files (",
                   absl::StrJoin(found, ", "), "); name one"));
}

absl::StatusOr<LoadedModel> LoadPt2(const std::string& path,
                                    const LoadOptions& options) {
  exported::Pt2ReadOptions read;
  read.defer_checkpoint_tensors = options.defer_checkpoint_tensors;
  ASSIGN_OR_RETURN(exported::Pt2Archive archive,
                   exported::ReadPt2Archive(path, read));
  LoadedModel loaded;
  loaded.path = path;
  loaded.from_torch_export = true;
  ASSIGN_OR_RETURN(exported::ImportedProgram program,
                   exported::ProgramToModule(archive));
  loaded.module = program.module;
  loaded.required_leaves = std::move(program.leaf_paths);
  loaded.deferred = std::move(archive.deferred);
  loaded.checkpoint_dir = std::move(archive.checkpoint_dir);
  if (!archive.extra_files.contains(kInputsJson)) {
    ASSIGN_OR_RETURN(loaded.example_inputs, exported::SampleInputs(archive));
  }
  torch::jit::ExtraFilesMap extra = {
      {kConfigJson, ""}, {kInputsJson, ""}, {kModelJson, ""}};
  for (auto& [name, text] : extra) {
    auto it = archive.extra_files.find(name);
    if (it != archive.extra_files.end()) text = it->second;
  }
  RETURN_IF_ERROR(ReadModelFiles(path, extra, loaded));
  return loaded;
}

// LoadOptions::dtype for a model built from `config`.
absl::StatusOr<c10::ScalarType> NativeDType(const std::string& name,
                                            const hf::HfConfig& config) {
  std::string want = name.empty() ? "float32" : name;
  if (want == "auto") {
    want = "float32";
    for (const char* key : {"dtype", "torch_dtype"}) {
      ASSIGN_OR_RETURN(std::optional<std::string> d, config.GetString(key));
      if (d.has_value()) {
        want = *d;
        break;
      }
    }
  }
  absl::StatusOr<c10::ScalarType> t = runtime::ParseDType(want);
  if (!t.ok() || (*t != at::kFloat && *t != at::kBFloat16 && *t != at::kHalf)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype '", want, "'", name == "auto" ? " (config.json's)" : "",
        ": a model built from config.json computes in float32, bfloat16 or "
        "float16"));
  }
  return *t;
}

// A dtype other than the program's own, asked of a saved program.
absl::Status CheckProgramDType(const std::string& path,
                               const LoadOptions& options) {
  if (options.dtype.empty() || options.dtype == "auto" ||
      options.dtype == "float32") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype '", options.dtype, "': '", path,
      "' is a saved program, which computes in the dtypes it was saved with "
      "(`tracecut export --dtype` chooses them); only a checkpoint directory "
      "without a .pt2, built from its config.json, computes in another"));
}

// A checkpoint directory without a .pt2: the model built from its
// config.json (tracer/native_model.h) when tracecut knows the architecture.
absl::StatusOr<LoadedModel> LoadNative(const std::string& dir,
                                       const LoadOptions& options) {
  std::string none = absl::StrCat(
      "model path '", dir,
      "' is a directory without a .pt2 (make one with `tracecut export ", dir,
      " -o ", dir, "/model.pt2`)");
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(dir) / kConfigJson, ec)) {
    return absl::InvalidArgumentError(none);
  }
  // An untrusted directory's config.json may be a link: read it only when
  // it resolves inside the directory (checkpoint/closed_dir.h).
  ASSIGN_OR_RETURN(checkpoint::ClosedDir closed,
                   checkpoint::ClosedDir::Open(dir));
  ASSIGN_OR_RETURN(
      std::string config_path,
      closed.Resolve(kConfigJson, absl::StrCat(dir, "/", kConfigJson)));
  ASSIGN_OR_RETURN(hf::HfConfig config, hf::HfConfig::Load(config_path));
  if (absl::Status s = NativeSupport(config); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(none,
                     "; tracecut builds models natively only for some "
                     "architectures: ",
                     s.message()));
  }
  ASSIGN_OR_RETURN(c10::ScalarType dtype, NativeDType(options.dtype, config));
  ASSIGN_OR_RETURN(
      NativeModel native,
      BuildNativeModel(dir, config, options.defer_checkpoint_tensors, dtype));
  LoadedModel loaded;
  loaded.path = dir;
  loaded.native = true;
  loaded.native_dtype = dtype;
  loaded.module = native.module;
  loaded.deferred = std::move(native.deferred);
  if (!loaded.deferred.empty()) loaded.checkpoint_dir = dir;
  torch::jit::ExtraFilesMap extra = {{kConfigJson, config.text()},
                                     {kInputsJson, native.inputs_json},
                                     {kModelJson, native.model_json}};
  RETURN_IF_ERROR(ReadModelFiles(dir, extra, loaded));
  return loaded;
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const std::string& path,
                                      const LoadOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    ASSIGN_OR_RETURN(std::optional<std::string> pt2, Pt2InDirectory(path));
    if (!pt2.has_value()) return LoadNative(path, options);
    RETURN_IF_ERROR(CheckProgramDType(*pt2, options));
    return LoadPt2(*pt2, options);
  }
  RETURN_IF_ERROR(CheckProgramDType(path, options));
  if (exported::IsPt2Path(path)) return LoadPt2(path, options);
  RETURN_IF_ERROR(CheckArchive(path));
  RETURN_IF_ERROR(exported::CheckArchiveMemberSizes(path));
  torch::jit::ExtraFilesMap extra = {
      {kConfigJson, ""}, {kInputsJson, ""}, {kModelJson, ""}};
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
  RETURN_IF_ERROR(ReadModelFiles(path, extra, loaded));
  return loaded;
}

}  // namespace tracecut::tracer
