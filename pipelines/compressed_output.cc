#include "pipelines/compressed_output.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
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
#include "checkpoint/compressed_tensors.h"
#include "checkpoint/safetensors.h"
#include "pipelines/quantize.h"
#include "runtime/torch_status.h"
#include "util/files.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

namespace fs = std::filesystem;
using Tensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Buffers calibration adds to a module (ExportQuantParams).
constexpr const char* kQuantBuffers[] = {
    "weight_scale",     "weight_zero_point", "weight_g_idx",     "input_scale",
    "input_zero_point", "output_scale",      "output_zero_point"};

absl::StatusOr<checkpoint::CtLinear> QuantizedLinear(
    const runtime::GraphModule& gm, const std::string& path,
    const ModuleRecord& r) {
  auto bad = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("compressed-tensors output: module ", path, " (",
                     ShortType(r.type), "): ", why));
  };
  if (!r.input.observer.empty() || !r.output.observer.empty()) {
    return bad(
        "its activations were observed; compressed-tensors output "
        "holds weight-only quantization (use --format=torchscript)");
  }
  if (r.weight_method != "rtn" && r.weight_method != "gptq") {
    return bad(absl::StrCat("its weight was ", r.weight_method,
                            ", not quantized (rtn or gptq)"));
  }
  if (ShortType(r.type) != "Linear") {
    return bad("only Linear weights are stored packed");
  }
  if (r.weight_g_idx.defined()) {
    return bad(
        "GPTQ act order with dynamic groups (a g_idx) has no form in the "
        "pinned compressed-tensors, which dropped actorder='group': add "
        "`static_groups: true` to the gptq modifier (llm-compressor's "
        "actorder='weight')");
  }
  ASSIGN_OR_RETURN(QuantScheme scheme, QuantScheme::Parse(r.weight_scheme));
  if (scheme.per_tensor) return bad("per-tensor weight scales");
  checkpoint::CtLinear linear;
  linear.path = path;
  linear.args.num_bits = scheme.bits;
  linear.args.symmetric = scheme.symmetric;
  linear.args.group_size = scheme.group_size;
  ASSIGN_OR_RETURN(linear.weight, gm.GetTensor(path + ".weight"));
  linear.scale = r.weight_scale;
  linear.zero_point = r.weight_zero_point;
  return linear;
}

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
        shards.size() == 1 ? "model.safetensors"
                           : absl::StrFormat("model-%05d-of-%05d.safetensors",
                                             i + 1, shards.size());
    ASSIGN_OR_RETURN(std::string bytes, checkpoint::SerializeSafetensors(
                                            shards[i], {{"format", "pt"}}));
    RETURN_IF_ERROR(util::WriteFileAtomically((dir / name).string(), bytes));
    for (const auto& [tensor, t] : shards[i]) {
      weight_map[tensor] = name;
      total += t.numel() * t.element_size();
    }
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                    {"weight_map", weight_map}};
    RETURN_IF_ERROR(util::WriteFileAtomically(
        (dir / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }
  // The source checkpoint's other files: tokenizer, generation config.
  if (!options.source_dir.empty()) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e :
         fs::directory_iterator(options.source_dir)) {
      const std::string name = e.path().filename().string();
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || name[0] == '.' || name == "config.json" ||
          name == "model.safetensors.index.json" || ext == ".safetensors" ||
          ext == ".bin" || ext == ".pt" || ext == ".pt2" || ext == ".pth") {
        continue;
      }
      files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      ASSIGN_OR_RETURN(std::string bytes, util::ReadFile(f.string()));
      RETURN_IF_ERROR(
          util::WriteFileAtomically((dir / f.filename()).string(), bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteCompressedTensors(const runtime::GraphModule& gm,
                                    const CalibrationResults& results,
                                    const CompressedOutputOptions& options) {
  const fs::path out(options.output_dir);
  const std::string where =
      absl::StrCat("cannot write '", options.output_dir, "'");
  std::error_code ec;
  if (fs::exists(out, ec) &&
      !(fs::is_directory(out, ec) &&
        (fs::is_empty(out, ec) || IsCompressedTensorsDir(out)))) {
    return absl::FailedPreconditionError(absl::StrCat(
        where,
        ": it exists and is not an earlier compressed-tensors output; "
        "remove it or choose another -o"));
  }

  // config.json: the one the model carries (--config's, or the export's),
  // else the source checkpoint's.
  std::string config;
  if (auto it = gm.extra_files().find("config.json");
      it != gm.extra_files().end() && !it->second.empty()) {
    config = it->second;
  } else if (!options.source_dir.empty() &&
             fs::exists(fs::path(options.source_dir) / "config.json", ec)) {
    ASSIGN_OR_RETURN(
        config, util::ReadFile(
                    (fs::path(options.source_dir) / "config.json").string()));
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        where,
        ": compressed-tensors output needs the model's config.json "
        "(a checkpoint directory, or a model that embeds it, as "
        "`tracecut export` writes)"));
  }

  Tensors tensors;
  std::vector<std::pair<std::string, checkpoint::CtWeightArgs>> quantized;
  std::set<std::string> replaced;  // Dense names the compressed ones replace.
  RETURN_IF_ERROR(
      runtime::TorchCall("compressing the weights", [&]() -> absl::Status {
        for (const auto& [path, record] : results.modules) {
          if (record.weight_method.empty() && record.input.observer.empty() &&
              record.output.observer.empty()) {
            continue;
          }
          ASSIGN_OR_RETURN(checkpoint::CtLinear linear,
                           QuantizedLinear(gm, path, record));
          ASSIGN_OR_RETURN(Tensors packed, checkpoint::CompressLinear(linear));
          for (auto& entry : packed) tensors.push_back(std::move(entry));
          quantized.emplace_back(path, linear.args);
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

  // The dense tensors, by name.
  const std::map<std::string, torch::Tensor> state = StateDict(gm);
  std::vector<std::string> names;
  if (!options.source_dir.empty() &&
      checkpoint::Checkpoint::HasWeights(options.source_dir)) {
    ASSIGN_OR_RETURN(checkpoint::Checkpoint source,
                     checkpoint::Checkpoint::Open(options.source_dir));
    for (const std::string& name : source.names()) {
      if (replaced.contains(name)) continue;
      if (!state.contains(name)) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": the model has no tensor '", name,
                         "', which ", options.source_dir, " holds"));
      }
      names.push_back(name);
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
  ASSIGN_OR_RETURN(std::string quant_config,
                   checkpoint::ConfigWithQuantization(config, quantized));

  // Built beside OUT_DIR, then renamed into place.
  const fs::path parent =
      out.has_parent_path() ? out.parent_path() : fs::path(".");
  const fs::path tmp =
      parent / absl::StrCat(".", out.filename().string(), ".tmp.", getpid());
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec)) {
    return util::ErrnoError(
        ec.value(), absl::StrCat(where, ": creating '", tmp.string(), "'"));
  }
  absl::Cleanup remove_tmp = [&] { fs::remove_all(tmp, ec); };
  RETURN_IF_ERROR(runtime::TorchCall(where, [&] {
    return WriteDirectory(tmp, tensors, quant_config, options);
  }));
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
    return util::ErrnoError(err, where);
  }
  std::move(remove_tmp).Cancel();
  if (replacing) fs::remove_all(old, ec);
  return absl::OkStatus();
}

}  // namespace tracecut::pipelines
