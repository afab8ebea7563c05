#include "output/compressed_output.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/closed_dir.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "modifiers/modifier.h"
#include "output/compressed_output_internal.h"
#include "runtime/torch_status.h"
#include "util/files.h"
#include "util/output_manifest.h"
#include "util/status_macros.h"

namespace tracecut::output {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::CheckQuantRecordFinite;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::output::internal::AppendPacked;
using ::tracecut::output::internal::IsQuantRecord;
using ::tracecut::output::internal::KvCache;
using ::tracecut::output::internal::QuantizationConfigFor;
using ::tracecut::output::internal::QuantizedModule;
using ::tracecut::output::internal::QuantizedModules;
using ::tracecut::output::internal::Tensors;
namespace {

namespace fs = std::filesystem;

// Buffers calibration adds to a module (ExportQuantParams).
constexpr const char* kQuantBuffers[] = {
    "weight_scale",        "weight_zero_point", "weight_g_idx",
    "weight_global_scale", "input_scale",       "input_zero_point",
    "input_global_scale",  "output_scale",      "output_zero_point"};

// Every parameter and buffer of the model by dotted path.
std::map<std::string, torch::Tensor> StateDict(const runtime::GraphModule& gm) {
  std::map<std::string, torch::Tensor> all;
  for (const auto& p : gm.module().named_parameters(/*recurse=*/true)) {
    all.emplace(p.name, p.value);
  }
  for (const auto& b : gm.module().named_buffers(/*recurse=*/true)) {
    all.emplace(b.name, b.value);
  }
  return all;
}

// Splits `tensors` (in order) into shards of at most `max_bytes` (a larger
// tensor gets a shard of its own).
std::vector<Tensors> Shard(const Tensors& tensors, int64_t max_bytes) {
  std::vector<Tensors> shards(1);
  int64_t bytes = 0;
  for (const auto& entry : tensors) {
    const int64_t size = entry.second.numel() * entry.second.element_size();
    if (!shards.back().empty() && bytes + size > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(entry);
    bytes += size;
  }
  return shards;
}

// True if `dir` looks like an earlier compressed-tensors output.
bool IsCompressedTensorsDir(const fs::path& dir) {
  absl::StatusOr<std::string> config =
      util::ReadFile((dir / "config.json").string());
  return config.ok() && absl::StrContains(*config, "\"compressed-tensors\"");
}

// The source checkpoint's other files (tokenizer, generation config) that
// go into the output: name -> resolved path, sorted by name. A closed world
// (checkpoint/closed_dir.h): a downloaded checkpoint's "tokenizer.json"
// linking to ~/.ssh/id_rsa must not end up in an output the user may
// publish, so links are followed only inside the checkpoint.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> SourceFiles(
    const std::string& source_dir) {
  std::vector<std::pair<std::string, std::string>> files;
  if (source_dir.empty()) return files;
  ASSIGN_OR_RETURN(checkpoint::ClosedDir source,
                   checkpoint::ClosedDir::Open(source_dir));
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(source_dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string ext = e.path().extension().string();
    // Directories and special files are not copied; links are, once
    // resolved inside the checkpoint.
    // Weights in any format (the source's own, other frameworks' copies of
    // them: TensorFlow .h5, Flax .msgpack, rust .ot, GGUF, ONNX) are not
    // the output's: it holds its own.
    static constexpr absl::string_view kWeightFormats[] = {
        ".safetensors", ".bin",     ".pt", ".pt2",  ".pth",  ".ckpt",
        ".h5",          ".msgpack", ".ot", ".gguf", ".onnx", ".tflite"};
    if ((!e.is_symlink() && !e.is_regular_file()) || name[0] == '.' ||
        name == "config.json" || name == "model.safetensors.index.json" ||
        std::find(std::begin(kWeightFormats), std::end(kWeightFormats), ext) !=
            std::end(kWeightFormats)) {
      continue;
    }
    names.push_back(name);
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list '", source_dir, "': ", ec.message()));
  }
  std::sort(names.begin(), names.end());
  for (std::string& name : names) {
    ASSIGN_OR_RETURN(
        std::string path,
        source.Resolve(name, absl::StrCat(source_dir, "/", name,
                                          " (copied into the output)")));
    files.emplace_back(std::move(name), std::move(path));
  }
  return files;
}

absl::Status CopySourceFiles(const fs::path& dir,
                             const std::string& source_dir) {
  ASSIGN_OR_RETURN(auto files, SourceFiles(source_dir));
  for (const auto& [name, path] : files) {
    // Copied by the kernel, not read into memory: a source file may be
    // large (a README with images, a tokenizer of a huge vocabulary). `dir`
    // is the output's staging directory, renamed into place when complete.
    std::error_code ec;
    fs::copy_file(path, dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return util::ErrnoError(
          ec.value(), absl::StrCat("cannot copy '", path, "' into the output"));
    }
    // Writable by its owner, as the files written beside it, whatever the
    // source's mode (a read-only store).
    fs::permissions(dir / name, fs::perms::owner_write, fs::perm_options::add,
                    ec);
  }
  return absl::OkStatus();
}

// The source checkpoint's files, then the recipe that made this one (in
// place of a recipe.yaml the source carried).
absl::Status WriteOtherFiles(const fs::path& dir,
                             const CompressedOutputOptions& options) {
  RETURN_IF_ERROR(CopySourceFiles(dir, options.source_dir));
  if (options.recipe_yaml.empty()) return absl::OkStatus();
  return util::WriteFileAtomically((dir / "recipe.yaml").string(),
                                   options.recipe_yaml);
}

absl::Status WriteIndex(const fs::path& dir,
                        const nlohmann::ordered_json& weight_map,
                        int64_t total) {
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
  return util::WriteFileAtomically(
      (dir / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

std::string ShardName(size_t i, size_t n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
}

absl::Status WriteDirectory(const fs::path& dir, const Tensors& tensors,
                            const std::string& config,
                            const CompressedOutputOptions& options) {
  RETURN_IF_ERROR(
      util::WriteFileAtomically((dir / "config.json").string(), config));
  const std::vector<Tensors> shards =
      Shard(tensors, std::max<int64_t>(options.max_shard_bytes, 1));
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        shards.size() == 1 ? "model.safetensors" : ShardName(i, shards.size());
    ASSIGN_OR_RETURN(std::string bytes, checkpoint::SerializeSafetensors(
                                            shards[i], {{"format", "pt"}}));
    RETURN_IF_ERROR(util::WriteFileAtomically((dir / name).string(), bytes));
    for (const auto& [tensor, t] : shards[i]) {
      weight_map[tensor] = name;
      total += t.numel() * t.element_size();
    }
  }
  if (shards.size() > 1) RETURN_IF_ERROR(WriteIndex(dir, weight_map, total));
  return WriteOtherFiles(dir, options);
}

// FailedPrecondition unless OUT_DIR is free: missing, empty, or an earlier
// compressed-tensors output.
absl::Status CheckOutputDir(const fs::path& out, const std::string& where) {
  std::error_code ec;
  if (fs::exists(out, ec) &&
      !(fs::is_directory(out, ec) &&
        (fs::is_empty(out, ec) || IsCompressedTensorsDir(out) ||
         util::HoldsOnlyManifestFiles(out.string())))) {
    return absl::FailedPreconditionError(absl::StrCat(
        where,
        ": it exists and is not an earlier compressed-tensors output; "
        "remove it or choose another -o"));
  }
  return absl::OkStatus();
}

// The modules of subclasses of torch.nn.Linear the exporter listed
// (tracecut_model.json's "linear_subclasses"; none without it).
absl::StatusOr<std::vector<std::string>> LinearSubclasses(
    const torch::jit::ExtraFilesMap& extra_files) {
  auto it = extra_files.find("tracecut_model.json");
  if (it == extra_files.end() || it->second.empty()) {
    return std::vector<std::string>();
  }
  try {
    nlohmann::json j = nlohmann::json::parse(it->second);
    if (!j.is_object() || !j.contains("linear_subclasses")) {
      return std::vector<std::string>();
    }
    return j["linear_subclasses"].get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tracecut_model.json: \"linear_subclasses\" must be a list of "
        "module paths (",
        e.what(), ")"));
  }
}

// config.json: the one the model carries (--config's, or the export's),
// else the source checkpoint's.
absl::StatusOr<std::string> ModelConfig(
    const torch::jit::ExtraFilesMap& extra_files,
    const CompressedOutputOptions& options, const std::string& where) {
  std::error_code ec;
  if (auto it = extra_files.find("config.json");
      it != extra_files.end() && !it->second.empty()) {
    return it->second;
  }
  if (!options.source_dir.empty() &&
      fs::exists(fs::path(options.source_dir) / "config.json", ec)) {
    ASSIGN_OR_RETURN(checkpoint::ClosedDir source,
                     checkpoint::ClosedDir::Open(options.source_dir));
    ASSIGN_OR_RETURN(
        std::string path,
        source.Resolve("config.json",
                       absl::StrCat(options.source_dir, "/config.json")));
    return util::ReadFile(path);
  }
  return absl::FailedPreconditionError(
      absl::StrCat(where,
                   ": compressed-tensors output needs the model's config.json "
                   "(a checkpoint directory, or a model that embeds it, as "
                   "`tracecut export` writes)"));
}

// Renames the finished directory `tmp` onto `out`, replacing an earlier
// output only once the new one is in place.
absl::Status Publish(const fs::path& tmp, const fs::path& out,
                     const std::string& where) {
  RETURN_IF_ERROR(util::WriteOutputManifest(tmp.string()));
  std::error_code ec;
  const fs::path parent =
      out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path old =
      parent / absl::StrCat(".", out.filename().string(), ".old.", getpid());
  const bool replacing = fs::exists(out, ec);
  if (replacing) {
    fs::rename(out, old, ec);
    if (ec) {
      return util::ErrnoError(ec.value(),
                              absl::StrCat(where, ": moving the old one"));
    }
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    const int err = ec.value();
    if (replacing) fs::rename(old, out, ec);
    return util::ErrnoError(
        err, absl::StrCat(where, ": renaming '", tmp.string(), "' onto it"));
  }
  if (replacing) fs::remove_all(old, ec);
  return absl::OkStatus();
}

// The weight at `name`: the model's, or its piece of a fused model tensor
// (an MoE expert's Linear) in the checkpoint's [out, in] shape.
absl::StatusOr<at::Tensor> WeightOf(const runtime::GraphModule& gm,
                                    const checkpoint::Layout& layout,
                                    const std::string& name) {
  const auto* owner = layout.Owner(name);
  if (owner == nullptr) return gm.GetTensor(name);
  ASSIGN_OR_RETURN(at::Tensor fused, gm.GetTensor(owner->first));
  return checkpoint::PieceOf(fused, owner->second,
                             checkpoint::SqueezedSizes(owner->second));
}

// A fused expert's weight left dense: what no loader would read.
absl::Status UnquantizedExpert(const std::string& where,
                               const std::string& name,
                               const std::string& fused) {
  return absl::FailedPreconditionError(absl::StrCat(
      where, ": '", name, "' (a piece of the fused '", fused,
      "') was not quantized; transformers and vLLM read fused MoE experts "
      "from compressed-tensors only quantized, one packed Linear per expert, "
      "so select every expert's Linears in the recipe (targets: \"Linear\" "
      "selects them by their checkpoint paths) or use --format=torchscript"));
}

// The module path of a weight ("a.b" for "a.b.weight"); empty otherwise.
std::string ModuleOfWeight(const std::string& name) {
  return absl::EndsWith(name, ".weight")
             ? name.substr(0, name.size() - std::strlen(".weight"))
             : std::string();
}

}  // namespace

absl::Status WriteCompressedTensors(const runtime::GraphModule& gm,
                                    const CalibrationResults& results,
                                    const CompressedOutputOptions& options) {
  const fs::path out(options.output_dir);
  const std::string where =
      absl::StrCat("cannot write '", options.output_dir, "'");
  ASSIGN_OR_RETURN(checkpoint::Layout layout,
                   checkpoint::Layout::FromExtraFiles(gm.extra_files()));
  RETURN_IF_ERROR(CheckOutputDir(out, where));
  ASSIGN_OR_RETURN(std::string config,
                   ModelConfig(gm.extra_files(), options, where));

  Tensors tensors;
  std::vector<QuantizedModule> quantized;
  std::set<std::string> replaced;  // Dense names the compressed ones replace.
  RETURN_IF_ERROR(
      runtime::TorchCall("compressing the weights", [&]() -> absl::Status {
        for (const auto& [path, record] : results.modules) {
          if (!IsQuantRecord(record)) continue;
          ASSIGN_OR_RETURN(at::Tensor weight,
                           WeightOf(gm, layout, path + ".weight"));
          ASSIGN_OR_RETURN(QuantizedModule m,
                           AppendPacked(weight, path, record, tensors));
          quantized.push_back(std::move(m));
          replaced.insert(path + ".weight");
          for (const char* buffer : kQuantBuffers) {
            replaced.insert(absl::StrCat(path, ".", buffer));
          }
        }
        return absl::OkStatus();
      }));
  if (quantized.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": no module was quantized"));
  }
  ASSIGN_OR_RETURN(auto kv, KvCache(results));
  for (auto& [name, t] : kv.first) {
    replaced.insert(name);
    tensors.emplace_back(name, t);
  }

  // The dense tensors, by name.
  const std::map<std::string, torch::Tensor> state = StateDict(gm);
  std::vector<std::string> names;
  if (!options.source_dir.empty() &&
      checkpoint::Checkpoint::HasWeights(options.source_dir)) {
    ASSIGN_OR_RETURN(checkpoint::Checkpoint source,
                     checkpoint::Checkpoint::Open(options.source_dir));
    for (const std::string& name : source.names()) {
      if (replaced.contains(name)) continue;
      if (state.contains(name)) {
        // In its stored dtype, as the streamed writer keeps it (a bf16
        // checkpoint traced in fp32 gives its bf16 values back exactly).
        ASSIGN_OR_RETURN(checkpoint::TensorInfo info, source.Info(name));
        tensors.emplace_back(name, state.at(name).to(info.dtype));
        continue;
      }
      // A piece of a model tensor (an MoE expert's weight), as stored.
      const auto* owner = layout.Owner(name);
      if (owner != nullptr && layout.Find(owner->first)->size() > 1) {
        return UnquantizedExpert(where, name, owner->first);
      }
      if (owner == nullptr || !state.contains(owner->first)) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": the model has no tensor '", name,
                         "', which ", options.source_dir, " holds"));
      }
      ASSIGN_OR_RETURN(checkpoint::TensorInfo info, source.Info(name));
      ASSIGN_OR_RETURN(at::Tensor piece,
                       checkpoint::PieceOf(state.at(owner->first),
                                           owner->second, info.shape));
      tensors.emplace_back(name, piece.to(info.dtype));
    }
  } else {
    for (const auto& [name, t] : state) {
      const size_t dot = name.rfind('.');
      const std::string leaf =
          dot == std::string::npos ? name : name.substr(dot + 1);
      if (!replaced.contains(name) &&
          !absl::StartsWith(leaf, "_tensor_constant")) {
        names.push_back(name);
      }
    }
  }
  for (const std::string& name : names)
    tensors.emplace_back(name, state.at(name));
  std::stable_sort(
      tensors.begin(), tensors.end(),
      [](const auto& a, const auto& b) { return a.first < b.first; });
  ASSIGN_OR_RETURN(std::vector<std::string> subclasses,
                   LinearSubclasses(gm.extra_files()));
  ASSIGN_OR_RETURN(
      std::string quant_config,
      QuantizationConfigFor(config, quantized, kv.second, subclasses));

  // Built beside OUT_DIR, then renamed into place.
  const fs::path parent =
      out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path tmp =
      parent / absl::StrCat(".", out.filename().string(), ".tmp.", getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) {
    return util::ErrnoError(
        ec.value(), absl::StrCat(where, ": creating '", tmp.string(), "'"));
  }
  absl::Cleanup remove_tmp = [&] { fs::remove_all(tmp, ec); };
  RETURN_IF_ERROR(runtime::TorchCall(where, [&] {
    return WriteDirectory(tmp, tensors, quant_config, options);
  }));
  RETURN_IF_ERROR(Publish(tmp, out, where));
  std::move(remove_tmp).Cancel();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Shard by shard.

absl::StatusOr<std::unique_ptr<CompressedTensorsWriter>>
CompressedTensorsWriter::Create(const CompressedOutputOptions& options,
                                const torch::jit::ExtraFilesMap& extra_files,
                                std::string work_dir) {
  auto w = std::unique_ptr<CompressedTensorsWriter>(
      new CompressedTensorsWriter(options, std::move(work_dir)));
  w->where_ = absl::StrCat("cannot write '", options.output_dir, "'");

  RETURN_IF_ERROR(CheckOutputDir(fs::path(options.output_dir), w->where_));
  ASSIGN_OR_RETURN(w->config_, ModelConfig(extra_files, options, w->where_));
  // Refused now rather than after the calibration.
  RETURN_IF_ERROR(SourceFiles(options.source_dir).status());
  if (options.source_dir.empty() ||
      !checkpoint::Checkpoint::HasWeights(options.source_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat(w->where_,
                     ": writing shard by shard needs the source "
                     "checkpoint (safetensors) in '",
                     options.source_dir, "'"));
  }
  ASSIGN_OR_RETURN(checkpoint::Checkpoint source,
                   checkpoint::Checkpoint::Open(options.source_dir));
  w->source_.emplace(std::move(source));
  ASSIGN_OR_RETURN(w->layout_, checkpoint::Layout::FromExtraFiles(extra_files));
  ASSIGN_OR_RETURN(w->linear_subclasses_, LinearSubclasses(extra_files));
  RETURN_IF_ERROR(util::MakeDirs(w->work_dir_));
  return w;
}

std::string CompressedTensorsWriter::PartPath(int index) const {
  return (fs::path(work_dir_) / absl::StrFormat("part-%05d.safetensors", index))
      .string();
}

absl::Status CompressedTensorsWriter::Clear() {
  std::error_code ec;
  fs::remove_all(work_dir_, ec);
  if (ec) {
    return util::ErrnoError(ec.value(),
                            absl::StrCat("cannot remove '", work_dir_, "'"));
  }
  return util::MakeDirs(work_dir_);
}

absl::Status CompressedTensorsWriter::WriteShard(
    int index, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const CalibrationResults& results) {
  Tensors out;
  RETURN_IF_ERROR(runtime::TorchCall(
      absl::StrCat(where_, ": shard ", index), [&]() -> absl::Status {
        for (const auto& [name, value] : tensors) {
          // As the checkpoint stores it: itself, or its pieces (a fused
          // tensor's in their checkpoint shapes).
          Tensors stored;
          const std::vector<checkpoint::Piece>* pieces = layout_.Find(name);
          if (pieces == nullptr) {
            stored.emplace_back(name, value);
          } else {
            for (const checkpoint::Piece& p : *pieces) {
              ASSIGN_OR_RETURN(checkpoint::TensorInfo info,
                               source_->Info(p.name));
              ASSIGN_OR_RETURN(at::Tensor t,
                               checkpoint::PieceOf(value, p, info.shape));
              stored.emplace_back(p.name, std::move(t));
            }
          }
          for (const auto& [stored_name, t] : stored) {
            const std::string module = ModuleOfWeight(stored_name);
            const ModuleRecord* r =
                module.empty() ? nullptr : results.FindModule(module);
            if (r != nullptr && IsQuantRecord(*r)) {
              RETURN_IF_ERROR(CheckQuantRecordFinite(module, *r, t));
              RETURN_IF_ERROR(AppendPacked(t, module, *r, out).status());
            } else if (pieces != nullptr && pieces->size() > 1) {
              return UnquantizedExpert(where_, stored_name, name);
            } else if (source_->Has(stored_name)) {
              // Dense: only the checkpoint's own names, in its stored dtype
              // (a bf16 checkpoint traced in fp32 gives its bf16 values
              // back exactly).
              ASSIGN_OR_RETURN(checkpoint::TensorInfo info,
                               source_->Info(stored_name));
              out.emplace_back(stored_name, t.to(info.dtype).contiguous());
            }
          }
        }
        return absl::OkStatus();
      }));
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first < b.first;
  });
  ASSIGN_OR_RETURN(std::string bytes,
                   checkpoint::SerializeSafetensors(out, {{"format", "pt"}}));
  return util::WriteFileAtomically(PartPath(index), bytes);
}

absl::Status CompressedTensorsWriter::Finish(
    const CalibrationResults& results) {
  ASSIGN_OR_RETURN(auto quantized, QuantizedModules(results, where_));
  std::set<std::string> replaced;  // Dense names the compressed ones replace.
  for (const QuantizedModule& m : quantized) {
    replaced.insert(m.path + ".weight");
  }

  // The parts written, in order, and what they hold.
  std::vector<fs::path> parts;
  for (const fs::directory_entry& e : fs::directory_iterator(work_dir_)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "part-") &&
        absl::EndsWith(name, ".safetensors")) {
      parts.push_back(e.path());
    }
  }
  std::sort(parts.begin(), parts.end());
  std::set<std::string> written;
  for (const fs::path& part : parts) {
    ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::SafetensorsFile> f,
                     checkpoint::SafetensorsFile::Open(part.string()));
    for (const std::string& name : f->names()) {
      if (!written.insert(name).second) {
        return absl::InternalError(absl::StrCat(where_, ": tensor '", name,
                                                "' written twice (",
                                                part.string(), ")"));
      }
    }
  }
  // The checkpoint's tensors that no subgraph read, copied as stored.
  Tensors rest;
  RETURN_IF_ERROR(runtime::TorchCall(where_, [&]() -> absl::Status {
    for (const std::string& name : source_->names()) {
      if (written.contains(name) || replaced.contains(name)) continue;
      ASSIGN_OR_RETURN(at::Tensor t, source_->Get(name));
      rest.emplace_back(name, std::move(t));
    }
    return absl::OkStatus();
  }));
  ASSIGN_OR_RETURN(auto kv, KvCache(results));
  for (auto& entry : kv.first) rest.push_back(std::move(entry));
  if (!rest.empty()) {
    ASSIGN_OR_RETURN(std::string bytes, checkpoint::SerializeSafetensors(
                                            rest, {{"format", "pt"}}));
    const fs::path part = fs::path(work_dir_) / "part-rest.safetensors";
    RETURN_IF_ERROR(util::WriteFileAtomically(part.string(), bytes));
    parts.push_back(part);
  }

  // Parts become the shards, with an index.
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::map<std::string, std::string> shard_of;
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string name = ShardName(i, parts.size());
    ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::SafetensorsFile> f,
                     checkpoint::SafetensorsFile::Open(parts[i].string()));
    for (const std::string& tensor : f->names()) {
      ASSIGN_OR_RETURN(checkpoint::TensorInfo info, f->Info(tensor));
      int64_t numel = 1;
      for (int64_t d : info.shape) numel *= d;
      total += numel * static_cast<int64_t>(c10::elementSize(info.dtype));
      shard_of[tensor] = name;
    }
  }
  for (const auto& [tensor, shard] : shard_of) weight_map[tensor] = shard;
  const fs::path dir(work_dir_);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::error_code ec;
    fs::rename(parts[i], dir / ShardName(i, parts.size()), ec);
    if (ec) {
      return util::ErrnoError(
          ec.value(), absl::StrCat(where_, ": renaming ", parts[i].string()));
    }
  }
  RETURN_IF_ERROR(WriteIndex(dir, weight_map, total));
  ASSIGN_OR_RETURN(
      std::string quant_config,
      QuantizationConfigFor(config_, quantized, kv.second, linear_subclasses_));
  RETURN_IF_ERROR(
      util::WriteFileAtomically((dir / "config.json").string(), quant_config));
  RETURN_IF_ERROR(WriteOtherFiles(dir, options_));
  return Publish(dir, fs::path(options_.output_dir), where_);
}

}  // namespace tracecut::output
