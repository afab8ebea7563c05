// The quantized modules of a compressed-tensors checkpoint: each one's
// tensors as its scheme's format stores them, and the quantization_config
// that describes them (compressed_output_internal.h).

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/compressed_tensors.h"
#include "checkpoint/layout.h"
#include "modifiers/modifier.h"
#include "output/compressed_output.h"
#include "output/compressed_output_internal.h"
#include "partition/partitioner.h"
#include "quantization/compressors.h"
#include "quantization/fake_quant.h"
#include "quantization/int_codes.h"
#include "quantization/quant_args.h"
#include "quantization/quantize.h"
#include "runtime/torch_status.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::output::internal {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::modifiers::ShortType;
using ::tracecut::quantization::QuantScheme;
namespace {

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
  ASSIGN_OR_RETURN(std::optional<int64_t> counted,
                   quantization::CountOffGrid(w, q, real.scale, args));
  if (!counted.has_value()) {
    ASSIGN_OR_RETURN(at::Tensor codes, quantization::Quantize(w, q, args));
    ASSIGN_OR_RETURN(at::Tensor again,
                     quantization::Dequantize(codes, real, args));
    counted = again.to(w.scalar_type()).ne(w).sum().item<int64_t>();
  }
  const int64_t off = *counted;
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
// compressed-tensors infers; the recipe's ignore list and the modules of
// Linear's subclasses left unquantized; the model's format
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

}  // namespace

bool IsQuantRecord(const ModuleRecord& r) {
  return !r.weight_method.empty() || !r.input.observer.empty() ||
         !r.output.observer.empty();
}

absl::StatusOr<std::string> QuantizationConfigFor(
    const std::string& config_json, const std::vector<QuantizedModule>& modules,
    const std::string& kv_cache_scheme,
    const std::vector<std::string>& linear_subclasses) {
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
  absl::StatusOr<std::string> config;
  if (typed) {
    config = TypedConfig(config_json, modules, kv_cache_scheme);
  } else if (!kv_cache_scheme.empty()) {
    return absl::FailedPreconditionError(
        "compressed-tensors output: a kv_cache_scheme needs compressed-tensors "
        "schemes (presets) for the weights");
  } else {
    config = checkpoint::ConfigWithQuantization(config_json, legacy);
  }
  if (!config.ok() || modules.empty() || linear_subclasses.empty()) {
    return config;
  }
  ASSIGN_OR_RETURN(util::Json j, util::ParseJson(*config, "config.json"));
  if (util::FindMember(j, "quantization_config") == nullptr) return config;
  util::Json& ignore = j["quantization_config"]["ignore"];
  if (!ignore.is_array()) ignore = util::Json::array();
  for (const std::string& path : linear_subclasses) {
    const bool quantized =
        std::any_of(modules.begin(), modules.end(),
                    [&](const QuantizedModule& q) { return q.path == path; });
    if (!quantized &&
        std::find(ignore.begin(), ignore.end(), path) == ignore.end()) {
      ignore.push_back(path);
    }
  }
  return util::DumpJson(j, 2) + "\n";
}

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

}  // namespace tracecut::output::internal

namespace tracecut::output {
namespace {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::quantization::QuantScheme;

// The scheme of `r`'s weight, described, unless transformers 5.17 turns it
// back into fused experts.
std::optional<std::string> NotLoadedAsFusedExperts(const ModuleRecord& r) {
  if (r.weight_quantization.empty()) {
    // tracecut's integer schemes: pack-quantized, as W4A16 / W8A16 when
    // symmetric.
    absl::StatusOr<QuantScheme> s = QuantScheme::Parse(r.weight_scheme);
    if (s.ok() && s->symmetric) return std::nullopt;
    return r.weight_scheme;
  }
  absl::StatusOr<util::Json> j =
      util::ParseJson(r.weight_quantization, "weight_quantization");
  const util::Json* json = j.ok() ? util::FindMember(*j, "scheme") : nullptr;
  if (json == nullptr) return r.weight_quantization;
  absl::StatusOr<quantization::QuantizationScheme> scheme =
      quantization::QuantizationScheme::FromJson(*json, "scheme");
  if (!scheme.ok() || !scheme->weights.has_value()) {
    return r.weight_quantization;
  }
  // GPTQ's act order (llm-compressor's W4A16 GPTQ default, "static") only
  // orders the solve: the stored tensors are the preset's.
  quantization::QuantizationArgs weights = *scheme->weights;
  weights.actorder = quantization::ActOrder::kNone;
  for (const char* name : {"W4A16", "W8A16", "FP8", "FP8_DYNAMIC"}) {
    absl::StatusOr<quantization::QuantizationScheme> preset =
        quantization::PresetScheme(name, scheme->targets);
    if (preset.ok() && preset->weights == weights &&
        preset->input_activations == scheme->input_activations) {
      return std::nullopt;
    }
  }
  return absl::StrCat("weights ", scheme->weights->ToString(),
                      scheme->input_activations.has_value()
                          ? absl::StrCat(", input activations ",
                                         scheme->input_activations->ToString())
                          : "");
}

}  // namespace

std::optional<std::string> FusedExpertsLoadWarning(
    const CalibrationResults& results, const checkpoint::Layout& layout) {
  for (const auto& [path, r] : results.modules) {
    if (r.weight_method.empty()) continue;
    const auto* owner = layout.Owner(path + ".weight");
    if (owner == nullptr || layout.Find(owner->first)->size() < 2) continue;
    std::optional<std::string> scheme = NotLoadedAsFusedExperts(r);
    if (!scheme.has_value()) continue;
    return absl::StrCat(
        "MoE experts fused into 3-D parameters (", owner->first,
        ") are written one Linear per expert (", path, ": ", *scheme,
        "); transformers 5.17 turns those back into its fused experts only "
        "for W4A16, W8A16, FP8 and FP8_DYNAMIC: with this scheme it fails to "
        "load the checkpoint or loads wrong experts without an error (vLLM "
        "reads it)");
  }
  return std::nullopt;
}

}  // namespace tracecut::output
