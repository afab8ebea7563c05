#include "modifiers/smoothquant_modifier.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ir/graph.h"
#include "ir/module_pattern.h"
#include "modifiers/output_drift.h"
#include "runtime/collective.h"
#include "runtime/torch_status.h"
#include "util/json.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::tracecut::runtime::ReduceKind;
namespace {

// llm-compressor's MINIMUM_SMOOTHING_SCALE.
constexpr double kMinimumScale = 1e-5;

std::vector<SmoothQuantMapping> LlamaMappings() {
  return {
      {{"re:.*q_proj", "re:.*k_proj", "re:.*v_proj"}, "re:.*input_layernorm"},
      {{"re:.*gate_proj", "re:.*up_proj"}, "re:.*post_attention_layernorm"}};
}

bool MatchesAny(const std::vector<ir::ModulePattern>& patterns,
                absl::string_view path, absl::string_view type) {
  for (const ir::ModulePattern& p : patterns) {
    if (p.Matches(path, type)) return true;
  }
  return false;
}

absl::StatusOr<ir::ModulePattern> Pattern(const std::string& text) {
  ir::ModulePattern p(text);
  if (!p.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("smoothquant: mapping pattern '", text, "': ", p.error()));
  }
  return p;
}

}  // namespace

std::vector<SmoothQuantMapping> DefaultSmoothQuantMappings(
    absl::string_view architecture) {
  // llm-compressor's MAPPINGS_REGISTRY, for the architectures tracecut
  // runs; anything else gets Llama's, as there.
  if (architecture == "MixtralForCausalLM" ||
      architecture == "Qwen2MoeForCausalLM" ||
      architecture == "Qwen3MoeForCausalLM") {
    // One scale for all experts unbalances them: attention only.
    return {{{"re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$"},
             "re:.*input_layernorm$"}};
  }
  if (architecture == "Phi3ForCausalLM") {
    return {{{"re:.*qkv_proj"}, "re:.*input_layernorm"},
            {{"re:.*gate_up_proj"}, "re:.*post_attention_layernorm"}};
  }
  // Gemma 2 / 3: the MLP reads pre_feedforward_layernorm (llm-compressor
  // gives them Llama's, whose post_attention_layernorm normalizes the
  // attention's output there: its smoothing would change the model).
  if (architecture == "Gemma2ForCausalLM" ||
      architecture == "Gemma3ForCausalLM" ||
      architecture == "Gemma3ForConditionalGeneration") {
    return {
        {{"re:.*q_proj", "re:.*k_proj", "re:.*v_proj"}, "re:.*input_layernorm"},
        {{"re:.*gate_proj", "re:.*up_proj"}, "re:.*pre_feedforward_layernorm"}};
  }
  return LlamaMappings();
}

absl::StatusOr<at::Tensor> SmoothQuantScales(
    const at::Tensor& act_min, const at::Tensor& act_max,
    const std::vector<at::Tensor>& balance_weights, double alpha) {
  if (balance_weights.empty()) {
    return absl::InvalidArgumentError("smoothquant: no balance weights");
  }
  return runtime::TorchCall("smoothquant scales", [&]() -> at::Tensor {
    at::Tensor activation = act_max - act_min;
    std::vector<at::Tensor> per_layer;
    for (const at::Tensor& w : balance_weights) {
      per_layer.push_back(
          std::get<0>(w.abs().max(/*dim=*/0, /*keepdim=*/true)));
    }
    at::Tensor weight = 2.0 * std::get<0>(at::cat(per_layer, 0).max(0));
    at::Tensor scales = activation.pow(alpha) / weight.pow(1 - alpha);
    scales = at::where(weight > 0.0, scales, activation);
    // torch.Tensor([1e-5]) there: fp32, which promotes fp16 / bf16 scales.
    return at::maximum(scales, at::full({1}, kMinimumScale,
                                        scales.options().dtype(at::kFloat)));
  });
}

SmoothQuantModifier::SmoothQuantModifier(SmoothQuantOptions options)
    : options_(std::move(options)) {}

bool SmoothQuantModifier::Distributed() const {
  return options_.collective != nullptr && options_.collective->distributed();
}

bool SmoothQuantModifier::WantsModule(absl::string_view path,
                                      absl::string_view type) const {
  return smooth_of_.contains(std::string(path));
}

absl::Status SmoothQuantModifier::OnRunStart(RunContext& ctx) {
  const double alpha = options_.smoothing_strength;
  if (!(alpha >= 0 && alpha <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "smoothquant: smoothing_strength must be in [0, 1], got ", alpha));
  }
  std::vector<SmoothQuantMapping> mappings = options_.mappings;
  const bool defaults = mappings.empty();
  if (defaults)
    mappings = DefaultSmoothQuantMappings(ModelArchitecture(ctx.model()));
  std::vector<ir::ModulePattern> ignore;
  for (const std::string& i : options_.ignore) {
    ASSIGN_OR_RETURN(ir::ModulePattern p, Pattern(i));
    ignore.push_back(std::move(p));
  }
  // Every module, in module order: smooth layers are not leaves (an
  // RMSNorm is traced through), only their weights matter here.
  std::vector<std::pair<std::string, std::string>> modules;
  RETURN_IF_ERROR(runtime::TorchCall("smoothquant", [&]() -> absl::Status {
    for (const auto& m : ctx.model().module().named_modules()) {
      if (m.name.empty()) continue;
      modules.emplace_back(
          m.name,
          ir::Scope::DemangleType(m.value.type()->name()->qualifiedName()));
    }
    return absl::OkStatus();
  }));

  resolved_.clear();
  smooth_of_.clear();
  ranges_.clear();
  std::vector<std::string> unmatched;
  for (const SmoothQuantMapping& mapping : mappings) {
    ASSIGN_OR_RETURN(ir::ModulePattern smooth_pattern,
                     Pattern(mapping.smooth_layer));
    std::vector<ir::ModulePattern> balance_patterns;
    for (const std::string& b : mapping.balance_layers) {
      ASSIGN_OR_RETURN(ir::ModulePattern p, Pattern(b));
      balance_patterns.push_back(std::move(p));
    }
    bool matched = false;
    for (const auto& [smooth, smooth_type] : modules) {
      if (!smooth_pattern.Matches(smooth, smooth_type)) continue;
      const std::string scope = ParentModulePath(smooth);
      std::vector<std::string> balance;
      for (const LeafModule& leaf : ctx.leaf_modules()) {
        if (leaf.path == smooth) continue;
        if (!scope.empty() && !absl::StartsWith(leaf.path, scope + ".")) {
          continue;
        }
        if (MatchesAny(balance_patterns, leaf.path, leaf.type)) {
          balance.push_back(leaf.path);
        }
      }
      if (balance.empty()) {
        ctx.Warn(absl::StrCat(
            "smoothquant: ", smooth, " has no balance layers (",
            absl::StrJoin(mapping.balance_layers, ", "), ") under ",
            scope.empty() ? "the model" : scope, "; not smoothed"));
        continue;
      }
      bool all_ignored = MatchesAny(ignore, smooth, smooth_type);
      for (const std::string& b : balance) {
        const LeafModule* leaf = ctx.FindLeaf(b);
        all_ignored = all_ignored && MatchesAny(ignore, b, leaf->type);
      }
      if (all_ignored) continue;
      matched = true;
      if (resolved_.contains(smooth)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "smoothquant: ", smooth, " is the smooth layer of two mappings"));
      }
      // Shapes: a 1-D smooth weight of C channels, Linear balance weights
      // [out, C].
      ASSIGN_OR_RETURN(at::Tensor sw,
                       ctx.model().GetTensor(absl::StrCat(smooth, ".weight")));
      const int64_t channels = sw.dim() >= 1 ? sw.size(0) : -1;
      for (const std::string& b : balance) {
        const LeafModule* leaf = ctx.FindLeaf(b);
        ASSIGN_OR_RETURN(at::Tensor bw,
                         ctx.model().GetTensor(absl::StrCat(b, ".weight")));
        if (ShortType(leaf->type) != "Linear" || bw.dim() != 2 ||
            bw.size(1) != channels || !bw.is_floating_point()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "smoothquant: balance layer ", b, " (", ShortType(leaf->type),
              ", weight [", absl::StrJoin(bw.sizes(), ", "),
              "]) is not a Linear reading the ", channels, " channels of ",
              smooth));
        }
        auto [it, inserted] = smooth_of_.emplace(b, smooth);
        if (!inserted) {
          return absl::InvalidArgumentError(
              absl::StrCat("smoothquant: ", b, " balances both ", it->second,
                           " and ", smooth));
        }
      }
      resolved_[smooth] = std::move(balance);
    }
    if (!matched) unmatched.push_back(mapping.smooth_layer);
  }
  if (resolved_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "smoothquant: no mapping matched the model (smooth layers ",
        absl::StrJoin(unmatched, ", "), defaults ? ", the defaults" : "",
        "); give mappings [[balance layers...], smooth layer] for it"));
  }
  if (!unmatched.empty()) {
    ctx.Warn(absl::StrCat("smoothquant: no module matches smooth layer ",
                          absl::StrJoin(unmatched, ", ")));
  }
  return absl::OkStatus();
}

absl::Status SmoothQuantModifier::OnModuleCall(RunContext& ctx,
                                               const ModuleCall& call) {
  const std::string path(call.path);
  if (done_.contains(smooth_of_.at(path))) return absl::OkStatus();
  if (call.inputs.empty() || !call.inputs[0].isTensor()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "smoothquant: the input of ", path, " (Linear) is not a tensor"));
  }
  const at::Tensor& x = call.inputs[0].toTensor();
  return runtime::TorchCall("smoothquant", [&]() -> absl::Status {
    if (x.dim() == 0 || x.numel() == 0) return absl::OkStatus();
    at::Tensor flat = x.detach().reshape({-1, x.size(-1)});
    at::Tensor mins = std::get<0>(flat.min(0));
    at::Tensor maxs = std::get<0>(flat.max(0));
    auto it = ranges_.find(path);
    if (it == ranges_.end()) {
      ranges_[path] = Range{mins, maxs};
    } else {
      it->second.min = at::minimum(it->second.min, mins);
      it->second.max = at::maximum(it->second.max, maxs);
    }
    return absl::OkStatus();
  });
}

absl::Status SmoothQuantModifier::OnSubgraphEnd(RunContext& ctx,
                                                const SubgraphInfo& subgraph) {
  // The smooth layers whose balance layers this subgraph calls: the same
  // on every rank, so data-parallel ranks reduce in one order.
  std::set<std::string> smooths;
  for (const std::string& leaf : subgraph.leaf_modules) {
    auto it = smooth_of_.find(leaf);
    if (it != smooth_of_.end() && resolved_.contains(it->second) &&
        !done_.contains(it->second)) {
      smooths.insert(it->second);
    }
  }
  for (const std::string& smooth : smooths) {
    RETURN_IF_ERROR(Smooth(ctx, smooth));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<SmoothQuantModifier::Range>>
SmoothQuantModifier::TakeRange(const std::string& smooth,
                               const at::Tensor& sw) {
  const std::vector<std::string>& balance = resolved_.at(smooth);
  // The range of the smooth layer's output: what each balance layer read.
  const Range* range = nullptr;
  const std::string* first = nullptr;
  for (const std::string& b : balance) {
    auto it = ranges_.find(b);
    if (it == ranges_.end()) continue;
    if (range == nullptr) {
      range = &it->second;
      first = &b;
      continue;
    }
    ASSIGN_OR_RETURN(bool same, runtime::TorchCall("smoothquant", [&] {
                       return at::equal(range->min, it->second.min) &&
                              at::equal(range->max, it->second.max);
                     }));
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "smoothquant: balance layers ", *first, " and ", b, " of ", smooth,
          " read different inputs; SmoothQuant needs every balance layer to "
          "read the smooth layer's output (check the mappings)"));
    }
  }
  Range reduced;  // What the scales are computed from.
  if (range != nullptr) reduced = *range;
  if (Distributed()) {
    // Min / max over ranks, in fp32 (exact for fp32, fp16 and bf16 values);
    // a rank without tokens contributes +inf / -inf.
    const int64_t channels = sw.size(0);
    ASSIGN_OR_RETURN(
        reduced, runtime::TorchCall("smoothquant", [&]() -> Range {
          auto inf = std::numeric_limits<float>::infinity();
          at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
          return Range{range != nullptr ? range->min.to(at::kFloat).contiguous()
                                        : at::full({channels}, inf, f32),
                       range != nullptr ? range->max.to(at::kFloat).contiguous()
                                        : at::full({channels}, -inf, f32)};
        }));
    RETURN_IF_ERROR(options_.collective->AllReduce(
        reduced.min, ReduceKind::kMin,
        absl::StrCat("the SmoothQuant minima of ", smooth)));
    RETURN_IF_ERROR(options_.collective->AllReduce(
        reduced.max, ReduceKind::kMax,
        absl::StrCat("the SmoothQuant maxima of ", smooth)));
    const at::ScalarType dtype =
        range != nullptr ? range->min.scalar_type() : sw.scalar_type();
    ASSIGN_OR_RETURN(bool any, runtime::TorchCall("smoothquant", [&] {
                       return reduced.min.isfinite().all().item<bool>();
                     }));
    if (!any) {
      range = nullptr;
    } else {
      reduced.min = reduced.min.to(dtype);
      reduced.max = reduced.max.to(dtype);
      range = &reduced;
    }
  }
  std::optional<Range> out;
  if (range != nullptr) out = reduced;
  for (const std::string& b : balance) ranges_.erase(b);
  return out;
}

absl::Status SmoothQuantModifier::Smooth(RunContext& ctx,
                                         const std::string& smooth) {
  const std::vector<std::string>& balance = resolved_.at(smooth);
  const std::string smooth_weight = absl::StrCat(smooth, ".weight");
  ASSIGN_OR_RETURN(at::Tensor sw, ctx.model().GetTensor(smooth_weight));
  ASSIGN_OR_RETURN(std::optional<Range> reduced, TakeRange(smooth, sw));
  done_.insert(smooth);
  if (!reduced.has_value()) {
    ctx.Warn(absl::StrCat("smoothquant: no calibration token reached ", smooth,
                          "'s balance layers; not smoothed"));
    return absl::OkStatus();
  }

  std::vector<at::Tensor> weights;
  for (const std::string& b : balance) {
    ASSIGN_OR_RETURN(at::Tensor w,
                     ctx.model().GetTensor(absl::StrCat(b, ".weight")));
    weights.push_back(w);
  }
  // What the balance layers compute on the first batch, before and after:
  // smoothing must not change it (balance layers that do not read the
  // smooth layer's output would). Only where the pipeline can replay the
  // subgraph (not `basic`); later batches end at their first leaf call.
  const std::set<std::string> balance_set(balance.begin(), balance.end());
  auto outputs = [&](std::vector<at::Tensor>& into) {
    return ctx.ReplaySubgraph(
        [&](const ModuleCall& call) -> absl::StatusOr<bool> {
          if (call.batch > 0) return false;
          if (balance_set.contains(std::string(call.path)) &&
              call.output != nullptr && call.output->isTensor()) {
            into.push_back(call.output->toTensor());
          }
          return true;
        });
  };
  std::vector<at::Tensor> before;
  absl::Status replayed = outputs(before);
  const bool check = replayed.ok();
  if (!check && !absl::IsFailedPrecondition(replayed)) return replayed;
  ASSIGN_OR_RETURN(at::Tensor scales,
                   SmoothQuantScales(reduced->min, reduced->max, weights,
                                     options_.smoothing_strength));
  for (size_t k = 0; k < balance.size(); ++k) {
    ASSIGN_OR_RETURN(at::Tensor w, runtime::TorchCall("smoothquant", [&] {
                       return (weights[k] * scales.view({1, -1}))
                           .to(weights[k].scalar_type());
                     }));
    RETURN_IF_ERROR(ctx.UpdateTensor(absl::StrCat(balance[k], ".weight"), w));
  }
  ASSIGN_OR_RETURN(torch::jit::Module m, ctx.model().GetSubmodule(smooth));
  const bool has_bias = m.hasattr("bias") && m.attr("bias").isTensor();
  if (has_bias) {
    const std::string bias_path = absl::StrCat(smooth, ".bias");
    ASSIGN_OR_RETURN(at::Tensor bias, ctx.model().GetTensor(bias_path));
    ASSIGN_OR_RETURN(at::Tensor new_bias,
                     runtime::TorchCall("smoothquant", [&] {
                       return (bias / scales).to(bias.scalar_type());
                     }));
    RETURN_IF_ERROR(ctx.UpdateTensor(bias_path, new_bias));
  }
  auto set_weight = [&](const at::Tensor& w) {
    return ctx.UpdateTensor(smooth_weight, w);
  };
  auto drift_of = [&]() -> absl::StatusOr<OutputDrift> {
    std::vector<at::Tensor> after;
    RETURN_IF_ERROR(outputs(after));
    OutputDrift drift;
    for (size_t k = 0; k < before.size() && k < after.size(); ++k) {
      RETURN_IF_ERROR(drift.Add(before[k], after[k]));
    }
    return drift;
  };
  OutputDrift drift;
  if (check && sw.dim() == 1 && !has_bias) {
    ASSIGN_OR_RETURN(NormSmoothing n,
                     SmoothNormWeight(sw, scales, set_weight, drift_of));
    drift = n.drift;
    if (n.offset) {
      ctx.results().Module(smooth).notes.push_back(
          "smoothquant: smoothed as a (1 + weight) norm");
    }
  } else {
    ASSIGN_OR_RETURN(
        at::Tensor new_sw, runtime::TorchCall("smoothquant", [&] {
          at::Tensor s = sw.dim() == 1 ? scales : scales.view({-1, 1});
          return (sw / s).to(sw.scalar_type());
        }));
    RETURN_IF_ERROR(set_weight(new_sw));
    if (!check) return absl::OkStatus();
    ASSIGN_OR_RETURN(drift, drift_of());
  }
  RETURN_IF_ERROR(drift.Check(sw.scalar_type(),
                              absl::StrCat("smoothquant: ", smooth),
                              absl::StrJoin(balance, ", ")));
  return absl::OkStatus();
}

absl::Status SmoothQuantModifier::OnRunEnd(RunContext& ctx) {
  std::vector<std::string> left;
  for (const auto& [smooth, balance] : resolved_) {
    if (!done_.contains(smooth)) left.push_back(smooth);
  }
  if (!left.empty()) {
    ctx.Warn(
        absl::StrCat("smoothquant: not smoothed (their balance layers "
                     "ran in no subgraph): ",
                     absl::StrJoin(left, ", ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<c10::IValue> SmoothQuantModifier::SaveState() const {
  return NamesToState(done_);
}

absl::Status SmoothQuantModifier::RestoreState(const c10::IValue& state) {
  ASSIGN_OR_RETURN(done_, NamesFromState(state, "smoothquant"));
  return absl::OkStatus();
}

}  // namespace tracecut::modifiers
