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
#include "checkpoint/compressed_tensors.h"
#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "modifiers/modifier.h"
#include "partition/partitioner.h"
#include "quantization/compressors.h"
#include "quantization/fake_quant.h"
#include "quantization/quant_args.h"
#include "quantization/quantize.h"
#include "runtime/torch_status.h"
#include "util/files.h"
#include "util/json.h"
#include "util/output_manifest.h"
#include "util/status_macros.h"

namespace tracecut::output {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::CheckQuantRecordFinite;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::modifiers::ShortType;
using ::tracecut::quantization::QuantScheme;
namespace {

namespace fs = std::filesystem;
using Tensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Buffers calibration adds to a module (ExportQuantParams).
constexpr const char* kQuantBuffers[] = {
    "weight_scale",        "weight_zero_point", "weight_g_idx",
    "weight_global_scale", "input_scale",       "input_zero_point",
    "input_global_scale",  "output_scale",      "output_zero_point"};

// Whether `r` asks for compressed output (anything quantized or observed).
bool IsQuantRecord(const ModuleRecord& r) {
  return !r.weight_method.empty() || !r.input.observer.empty() ||
         !r.output.observer.empty();
}

// `weight`: the module's weight after calibration; undefined to check the
// record only.
absl::StatusOr<checkpoint::CtLinear> QuantizedLinear(const at::Tensor& weight,
                                                     const std::string& path,
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
  if (weight.defined() && scheme.group_size > weight.size(-1)) {
    // compressed-tensors reshapes each row into whole groups on load.
    return bad(absl::StrCat("group_size ", scheme.group_size,
                            " is larger than its ", weight.size(-1),
                            " input features, which compressed-tensors cannot "
                            "load (use a group_size that divides them, "
                            "ignore the module, or --format=torchscript)"));
  }
  checkpoint::CtLinear linear;
  linear.path = path;
  linear.args.num_bits = scheme.bits;
  linear.args.symmetric = scheme.symmetric;
  linear.args.group_size = scheme.group_size;
  linear.weight = weight;
  linear.scale = r.weight_scale;
  linear.zero_point = r.weight_zero_point;
  return linear;
}

// One quantized module for quantization_config: tracecut's integer scheme
// (`args`) or a compressed-tensors one (`typed`, the record's
// weight_quantization).
struct QuantizedModule {
  std::string path;
  checkpoint::CtWeightArgs args;
  std::string typed;
};

// The compressed-tensors scheme of a typed record and its ignore list.
struct TypedRecord {
  quantization::QuantizationScheme scheme;
  std::vector<std::string> ignore;
};

bool HasStaticInput(const quantization::QuantizationScheme& scheme) {
  return scheme.input_activations.has_value() &&
         scheme.input_activations->dynamic != quantization::Dynamic::kDynamic;
}

absl::StatusOr<TypedRecord> ParseTyped(const std::string& path,
                                       const std::string& type,
                                       const std::string& weight_quantization) {
  auto bad = [&](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("compressed-tensors output: module ", path, " (",
                     ShortType(type), "): ", why));
  };
  absl::StatusOr<util::Json> j =
      util::ParseJson(weight_quantization, "weight_quantization");
  if (!j.ok()) return bad(j.status().message());
  const util::Json* scheme = util::FindMember(*j, "scheme");
  if (scheme == nullptr) return bad("weight_quantization has no scheme");
  absl::StatusOr<quantization::QuantizationScheme> s =
      quantization::QuantizationScheme::FromJson(*scheme, "scheme");
  if (!s.ok()) return bad(s.status().message());
  if (!s->weights.has_value()) return bad("its scheme quantizes no weight");
  TypedRecord t{*std::move(s), {}};
  if (const util::Json* ig = util::FindMember(*j, "ignore");
      ig != nullptr && ig->is_array()) {
    for (const util::Json& name : *ig) {
      if (name.is_string()) t.ignore.push_back(name.get<std::string>());
    }
  }
  return t;
}

// The compressed tensors of a Linear quantized with a compressed-tensors
// scheme, as the format its scheme calls for stores them (compressors.h),
// after checking that they decode to `weight`.
absl::StatusOr<Tensors> CompressTyped(const at::Tensor& weight,
                                      const std::string& path,
                                      const ModuleRecord& r) {
  ASSIGN_OR_RETURN(TypedRecord t,
                   ParseTyped(path, r.type, r.weight_quantization));
  const quantization::QuantizationArgs& args = *t.scheme.weights;
  auto bad = [&](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("compressed-tensors output: module ", path, " (",
                     args.ToString(), "): ", why));
  };
  if (ShortType(r.type) != "Linear") {
    return bad("only Linear weights are stored quantized");
  }
  const quantization::QParams q{r.weight_scale, r.weight_zero_point,
                                r.weight_global_scale};
  // Round-to-nearest leaves an fp32 module the exact real values of its
  // codes (QuantizeTyped), which give the codes back in fp32. GPTQ leaves
  // the checkpoint's dtype (the scale's), as llm-compressor's GPTQ leaves
  // its module: re-quantized in that dtype, as compressed-tensors does.
  at::Tensor w = weight;
  quantization::QParams real = q;
  const c10::ScalarType sd = r.weight_scale.scalar_type();
  if (r.weight_method == "rtn" && (weight.scalar_type() == at::kFloat ||
                                   weight.scalar_type() == at::kDouble)) {
    real.scale = r.weight_scale.to(weight.scalar_type());
  } else if (sd == at::kBFloat16 || sd == at::kHalf || sd == at::kFloat ||
             sd == at::kDouble) {
    w = weight.to(sd);
  }
  // What is stored decodes to the model's weight: quantizing it again
  // changes nothing, but for the few bf16 values GPTQ leaves between grid
  // points (llm-compressor's GPTQ too; compressed-tensors stores their
  // re-quantized codes, as here). More than 1 % means the weight changed
  // after it was quantized.
  ASSIGN_OR_RETURN(at::Tensor codes, quantization::Quantize(w, q, args));
  ASSIGN_OR_RETURN(at::Tensor again,
                   quantization::Dequantize(codes, real, args));
  const int64_t off = again.to(w.scalar_type()).ne(w).sum().item<int64_t>();
  if (off * 100 > w.numel()) {
    return bad(absl::StrCat(
        "its weight is not on the scheme's grid (", off, " of ", w.numel(),
        " values are not: it changed after it was quantized); nothing "
        "written"));
  }
  // A float code of zero keeps its sign in the module's weight (-0 from a
  // small negative weight), and compressed-tensors, quantizing the
  // original weight, stores it (fp8's -0, fp4's sign bit). Quantizing -0
  // itself gives +0 (the zero point added, cast_to_fp4's sign()), so -0 is
  // handed over as the smallest negative normal float, which gives -0.
  at::Tensor to_store = w;
  if (args.type == quantization::QuantType::kFloat) {
    ASSIGN_OR_RETURN(to_store, runtime::TorchCall("signed zeros", [&] {
                       return at::where(
                           w.eq(0) & at::signbit(w),
                           at::full({}, -1.1754944e-38F, w.options()), w);
                     }));
  }
  ASSIGN_OR_RETURN(Tensors stored, quantization::CompressWeight(
                                       to_store, q, t.scheme,
                                       quantization::InferFormat(t.scheme)));
  // Calibrated input activations (weight_quant_modifier.h Note [Static input
  // activations]), as compressed-tensors' initialize_qparams names them.
  if (HasStaticInput(t.scheme)) {
    const quantization::QuantizationArgs& in = *t.scheme.input_activations;
    if (in.dynamic == quantization::Dynamic::kLocal) {
      stored.emplace_back("input_global_scale", r.input.global_scale);
    } else {
      stored.emplace_back("input_scale", r.input.scale);
      if (!in.symmetric) {
        stored.emplace_back("input_zero_point", r.input.zero_point);
      }
    }
  }
  for (auto& [name, tensor] : stored) {
    name = absl::StrCat(path, ".", name);
    tensor = tensor.contiguous();
  }
  return stored;
}

// quantization_config for modules quantized with compressed-tensors schemes,
// as llm-compressor writes it: a config group per scheme with the recipe's
// targets ("Linear"), the observers llm-compressor records and the format
// compressed-tensors infers; the recipe's ignore list; the model's format
// (mixed-precision when groups differ).
absl::StatusOr<std::string> TypedConfig(
    const std::string& config_json, const std::vector<QuantizedModule>& modules,
    const std::string& kv_cache_scheme) {
  ASSIGN_OR_RETURN(util::Json config,
                   util::ParseJson(config_json, "config.json"));
  if (!config.is_object()) {
    return absl::InvalidArgumentError("config.json is not a JSON object");
  }
  std::vector<std::string> seen;  // weight_quantization texts, in order.
  util::Json groups = util::Json::object();
  std::vector<std::string> ignore;
  std::set<quantization::CompressionFormat> formats;
  for (const QuantizedModule& m : modules) {
    if (std::find(seen.begin(), seen.end(), m.typed) != seen.end()) continue;
    seen.push_back(m.typed);
    ASSIGN_OR_RETURN(TypedRecord t, ParseTyped(m.path, "", m.typed));
    const quantization::CompressionFormat format =
        quantization::InferFormat(t.scheme);
    formats.insert(format);
    util::Json scheme = t.scheme.ToJson();
    // llm-compressor's observer defaults (QuantizationMixin's overrides).
    for (const char* key :
         {"weights", "input_activations", "output_activations"}) {
      util::Json& a = scheme[key];
      if (a.is_null() || !a["observer"].is_null()) continue;
      if (a["dynamic"] == true) continue;
      a["observer"] =
          std::string(key) == "weights" ? "memoryless_minmax" : "minmax";
    }
    scheme["format"] = std::string(quantization::FormatName(format));
    groups[absl::StrCat("group_", groups.size())] = std::move(scheme);
    for (const std::string& name : t.ignore) {
      // A module one modifier ignores and another quantizes is not ignored:
      // compressed-tensors would load its packed weight as a dense one.
      const bool quantized =
          std::any_of(modules.begin(), modules.end(), [&](const auto& q) {
            return partition::ModulePatternMatches(
                name, q.path, "torch.nn.modules.linear.Linear");
          });
      if (!quantized &&
          std::find(ignore.begin(), ignore.end(), name) == ignore.end()) {
        ignore.push_back(name);
      }
    }
  }
  util::Json qc = util::Json::object();
  qc["config_groups"] = std::move(groups);
  qc["format"] =
      std::string(quantization::FormatName(quantization::ModelFormat(formats)));
  qc["global_compression_ratio"] = nullptr;
  qc["ignore"] = ignore;
  qc["kv_cache_scheme"] = nullptr;
  if (!kv_cache_scheme.empty()) {
    ASSIGN_OR_RETURN(qc["kv_cache_scheme"],
                     util::ParseJson(kv_cache_scheme, "kv_cache_scheme"));
  }
  qc["quant_method"] = "compressed-tensors";
  qc["quantization_status"] = "compressed";
  qc["sparsity_config"] = util::Json::object();
  qc["transform_config"] = util::Json::object();
  config["quantization_config"] = std::move(qc);
  return util::DumpJson(config, 2) + "\n";
}

// quantization_config for `modules`: all typed or all tracecut's integer
// schemes.
absl::StatusOr<std::string> QuantizationConfigFor(
    const std::string& config_json, const std::vector<QuantizedModule>& modules,
    const std::string& kv_cache_scheme) {
  const bool typed = !modules.empty() && !modules.front().typed.empty();
  std::vector<std::pair<std::string, checkpoint::CtWeightArgs>> legacy;
  for (const QuantizedModule& m : modules) {
    if (m.typed.empty() == typed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "compressed-tensors output: module ", m.path,
          typed ? " has a tracecut integer scheme and others a "
                  "compressed-tensors preset/json scheme"
                : " has a compressed-tensors preset/json scheme and others "
                  "a tracecut integer scheme",
          "; one output takes one kind (use presets for all modifiers)"));
    }
    legacy.emplace_back(m.path, m.args);
  }
  if (typed) return TypedConfig(config_json, modules, kv_cache_scheme);
  if (!kv_cache_scheme.empty()) {
    return absl::FailedPreconditionError(
        "compressed-tensors output: a kv_cache_scheme needs compressed-tensors "
        "schemes (presets) for the weights");
  }
  return checkpoint::ConfigWithQuantization(config_json, legacy);
}

// The record's module for the config; errors as QuantizedLinear's.
absl::StatusOr<QuantizedModule> ModuleEntry(const std::string& path,
                                            const ModuleRecord& r) {
  if (!r.weight_quantization.empty() && r.output.observer.empty()) {
    ASSIGN_OR_RETURN(TypedRecord t,
                     ParseTyped(path, r.type, r.weight_quantization));
    auto bad = [&](absl::string_view why) {
      return absl::FailedPreconditionError(
          absl::StrCat("compressed-tensors output: module ", path, " (",
                       ShortType(r.type), "): ", why));
    };
    if (!HasStaticInput(t.scheme) && !r.input.observer.empty()) {
      return bad(
          "its input activations were observed by an observer modifier, "
          "which compressed-tensors output does not hold beside a "
          "compressed-tensors scheme (use --format=torchscript)");
    }
    if (HasStaticInput(t.scheme)) {
      const bool local =
          t.scheme.input_activations->dynamic == quantization::Dynamic::kLocal;
      if (!(local ? r.input.global_scale : r.input.scale).defined()) {
        return bad(absl::StrCat("its scheme's static input activations (",
                                t.scheme.input_activations->ToString(),
                                ") were not calibrated"));
      }
    }
    return QuantizedModule{path, {}, r.weight_quantization};
  }
  ASSIGN_OR_RETURN(checkpoint::CtLinear linear,
                   QuantizedLinear(at::Tensor(), path, r));
  return QuantizedModule{path, linear.args, ""};
}

// The attention modules' k/v scales (weight_quant_modifier.h Note [KV cache])
// and the kv_cache_scheme they share ("" when none).
absl::StatusOr<std::pair<Tensors, std::string>> KvCache(
    const CalibrationResults& results) {
  std::pair<Tensors, std::string> kv;
  for (const auto& [path, r] : results.modules) {
    if (r.kv_cache_scheme.empty()) continue;
    if (!kv.second.empty() && kv.second != r.kv_cache_scheme) {
      return absl::FailedPreconditionError(absl::StrCat(
          "compressed-tensors output: attention ", path,
          " has another kv_cache_scheme than the others; a checkpoint has "
          "one"));
    }
    kv.second = r.kv_cache_scheme;
    kv.first.emplace_back(path + ".k_scale", r.k_cache.scale.contiguous());
    kv.first.emplace_back(path + ".v_scale", r.v_cache.scale.contiguous());
  }
  return kv;
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
    if ((!e.is_symlink() && !e.is_regular_file()) || name[0] == '.' ||
        name == "config.json" || name == "model.safetensors.index.json" ||
        ext == ".safetensors" || ext == ".bin" || ext == ".pt" ||
        ext == ".pt2" || ext == ".pth") {
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
    ASSIGN_OR_RETURN(std::string bytes, util::ReadFile(path));
    RETURN_IF_ERROR(util::WriteFileAtomically((dir / name).string(), bytes));
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

// Every module `results` quantized, with its scheme; errors as
// QuantizedLinear's. FailedPrecondition when there is none.
absl::StatusOr<std::vector<QuantizedModule>> QuantizedModules(
    const CalibrationResults& results, const std::string& where) {
  std::vector<QuantizedModule> quantized;
  for (const auto& [path, record] : results.modules) {
    if (!IsQuantRecord(record)) continue;
    ASSIGN_OR_RETURN(QuantizedModule m, ModuleEntry(path, record));
    quantized.push_back(std::move(m));
  }
  if (quantized.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": no module was quantized"));
  }
  return quantized;
}

// Appends `weight` of the quantized Linear at `module` as the tensors its
// compressed-tensors format stores; its entry for the config.
absl::StatusOr<QuantizedModule> AppendPacked(const at::Tensor& weight,
                                             const std::string& module,
                                             const ModuleRecord& record,
                                             Tensors& out) {
  ASSIGN_OR_RETURN(QuantizedModule entry, ModuleEntry(module, record));
  Tensors packed;
  if (!entry.typed.empty()) {
    ASSIGN_OR_RETURN(packed, CompressTyped(weight, module, record));
  } else {
    ASSIGN_OR_RETURN(checkpoint::CtLinear linear,
                     QuantizedLinear(weight, module, record));
    ASSIGN_OR_RETURN(packed, checkpoint::CompressLinear(linear));
  }
  for (auto& e : packed) out.push_back(std::move(e));
  return entry;
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
  ASSIGN_OR_RETURN(std::string quant_config,
                   QuantizationConfigFor(config, quantized, kv.second));

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
  ASSIGN_OR_RETURN(std::string quant_config,
                   QuantizationConfigFor(config_, quantized, kv.second));
  RETURN_IF_ERROR(
      util::WriteFileAtomically((dir / "config.json").string(), quant_config));
  RETURN_IF_ERROR(WriteOtherFiles(dir, options_));
  return Publish(dir, fs::path(options_.output_dir), where_);
}

}  // namespace tracecut::output
