#include "modifiers/awq_modifier.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "ir/module_pattern.h"
#include "modifiers/output_drift.h"
#include "quantization/fake_quant.h"
#include "quantization/observers.h"
#include "runtime/collective.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::tracecut::runtime::ReduceKind;
namespace {

absl::StatusOr<ir::ModulePattern> Pattern(const std::string& text) {
  ir::ModulePattern p(text);
  if (!p.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("awq: mapping pattern '", text, "': ", p.error()));
  }
  return p;
}

// The longest common dotted prefix of `paths`.
std::string CommonAncestor(const std::vector<std::string>& paths) {
  std::vector<std::string> common = absl::StrSplit(paths.front(), '.');
  for (const std::string& p : paths) {
    std::vector<std::string> parts = absl::StrSplit(p, '.');
    size_t n = 0;
    while (n < common.size() && n < parts.size() && common[n] == parts[n]) ++n;
    common.resize(n);
  }
  return absl::StrJoin(common, ".");
}

bool Within(absl::string_view path, absl::string_view scope) {
  return scope.empty() || path == scope ||
         (absl::StartsWith(path, scope) && path.size() > scope.size() &&
          path[scope.size()] == '.');
}

using Modules = std::vector<std::pair<std::string, std::string>>;

// The modules matching `balance` in the smallest scope around `smooth` that
// holds any: its parent module, or further up (BERT's attention.self.value
// feeds attention.output.dense), but not up to a scope holding another
// module that `smooth_pattern` matches (the next layer's).
std::vector<std::string> BalanceLayers(
    const Modules& modules, const std::string& smooth,
    const ir::ModulePattern& smooth_pattern,
    const std::vector<ir::ModulePattern>& balance) {
  std::vector<std::string> out;
  const std::string parent = ParentModulePath(smooth);
  for (std::string scope = parent;; scope = ParentModulePath(scope)) {
    for (const auto& [path, type] : modules) {
      if (scope != parent && path != smooth && Within(path, scope) &&
          smooth_pattern.Matches(path, type)) {
        return out;  // Another smooth layer's scope.
      }
    }
    for (const auto& [path, type] : modules) {
      if (path == smooth || !Within(path, scope)) continue;
      for (const ir::ModulePattern& p : balance) {
        if (p.Matches(path, type)) {
          out.push_back(path);
          break;
        }
      }
    }
    if (!out.empty() || scope.empty()) return out;
  }
}

}  // namespace

absl::StatusOr<at::Tensor> AwqModifier::OutputTensor(const ModuleCall& call) {
  // Depth first: a module imported from a .pt2 may return values its caller
  // reads (sizes) before its output.
  std::vector<const c10::IValue*> pending;
  if (call.output != nullptr) pending.push_back(call.output);
  while (!pending.empty()) {
    const c10::IValue* v = pending.back();
    pending.pop_back();
    if (v->isTensor() && v->toTensor().is_floating_point()) {
      return v->toTensor();
    }
    if (v->isTuple()) {
      const auto& elements = v->toTupleRef().elements();
      for (size_t i = elements.size(); i > 0; --i) {
        pending.push_back(&elements[i - 1]);
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "awq: the output of ", call.path, " holds no floating-point tensor"));
}

AwqModifier::AwqModifier(AwqOptions options) : options_(std::move(options)) {
  // The search observes each candidate weight once: min-max, whatever
  // observer the quantizer uses (llm-compressor's memoryless_minmax).
  options_.weights.observer.reset();
}

bool AwqModifier::Distributed() const {
  return options_.collective != nullptr && options_.collective->distributed();
}

bool AwqModifier::WantsModule(absl::string_view path,
                              absl::string_view type) const {
  return observers_.contains(std::string(path));
}

absl::Status AwqModifier::OnRunStart(RunContext& ctx) {
  const int n = options_.n_grid;
  const int least = options_.duo_scaling == AwqDuoScaling::kOn     ? 3
                    : options_.duo_scaling == AwqDuoScaling::kBoth ? 4
                                                                   : 2;
  if (n < least) {
    return absl::InvalidArgumentError(
        absl::StrCat("awq: n_grid must be at least ", least, " here, got ", n));
  }
  std::vector<AwqMapping> mappings = options_.mappings;
  const bool defaults = mappings.empty();
  if (defaults) {
    ASSIGN_OR_RETURN(mappings,
                     AwqDefaultMappings(ModelArchitecture(ctx.model())));
  }
  // Every per-expert Linear of fused experts, quantized or not: mappings
  // name them by their checkpoint paths.
  ASSIGN_OR_RETURN(
      experts_, FusedExperts::Find(ctx, ModuleSelector{{"Linear"}, {}}, name(),
                                   options_.all_expert_tokens));
  RETURN_IF_ERROR(Resolve(ctx, mappings, defaults));
  for (const Resolved& r : resolved_) {
    if (experts_.IsExperts(r.observed) && Distributed()) {
      return absl::UnimplementedError(absl::StrCat(
          "awq: fused MoE experts (", r.balance.front(),
          ", ...) in a data-parallel run are not supported yet; run them in "
          "one process"));
    }
  }
  return absl::OkStatus();
}

absl::Status AwqModifier::Resolve(RunContext& ctx,
                                  const std::vector<AwqMapping>& mappings,
                                  bool defaults) {
  // Every module with its type, in module order (smooth layers need not be
  // leaves: an RMSNorm is traced through; nor need balance layers that are
  // only scaled, such as an MoE router), then the fused experts' Linears.
  Modules modules;
  std::set<std::string> module_lists;
  RETURN_IF_ERROR(runtime::TorchCall("awq", [&]() -> absl::Status {
    for (const auto& m : ctx.model().module().named_modules()) {
      if (m.name.empty()) continue;
      std::string type =
          ir::Scope::DemangleType(m.value.type()->name()->qualifiedName());
      if (ShortType(type) == "ModuleList") module_lists.insert(m.name);
      modules.emplace_back(m.name, std::move(type));
    }
    return absl::OkStatus();
  }));
  for (const auto& [path, linear] : experts_.linears()) {
    modules.emplace_back(path, kFusedLinearType);
  }

  resolved_.clear();
  observers_.clear();
  expert_down_.clear();
  stats_.clear();
  int incompatible = 0;
  int untargeted = 0;
  std::vector<std::string> unmatched;
  for (const AwqMapping& mapping : mappings) {
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
      Resolved r;
      r.smooth = smooth;
      r.balance =
          BalanceLayers(modules, smooth, smooth_pattern, balance_patterns);
      if (r.balance.empty()) continue;
      matched = true;
      // Shapes: every balance layer [out, C] reads the same C channels; a
      // norm's weight is [C]; a Linear smooth layer's last C output rows are
      // scaled (all of v_proj; the v part of a fused qkv_proj, the up part
      // of a fused gate_up_proj, as llm-compressor does).
      ASSIGN_OR_RETURN(at::Tensor sw, LiveWeight(ctx, smooth));
      bool compatible = sw.dim() == 1 || sw.dim() == 2;
      bool targeted = false;
      int64_t channels = -1;
      std::vector<std::string> parents;  // Module paths.
      for (const std::string& b : r.balance) {
        const LeafModule* leaf = ctx.FindLeaf(b);
        const FusedLinear* fused = experts_.FindLinear(b);
        ASSIGN_OR_RETURN(at::Tensor bw, LiveWeight(ctx, b));
        // A leaf must be a Linear (its input is observed, its weight
        // quantized); a module that is no leaf is only scaled (an MoE
        // router computing x W^T).
        const std::string type = fused != nullptr  ? kFusedLinearType
                                 : leaf != nullptr ? leaf->type
                                                   : "";
        if ((leaf != nullptr && ShortType(leaf->type) != "Linear") ||
            bw.dim() != 2 || !bw.is_floating_point()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "awq: balance layer ", b, " of ", smooth, " is ",
              leaf != nullptr ? absl::StrCat("a ", ShortType(leaf->type))
                              : "a module without a 2-D weight",
              ", not a Linear"));
        }
        if (leaf != nullptr && r.observed.empty()) r.observed = b;
        if (channels < 0) channels = bw.size(1);
        compatible = compatible && bw.size(1) == channels;
        // llm-compressor's rule: v_proj -> o_proj only when v_proj gives
        // every channel o_proj reads (not under grouped-query attention),
        // qkv_proj -> o_proj only when it is 3 x those channels.
        if (absl::EndsWith(b, ".o_proj") && sw.dim() == 2) {
          if (absl::EndsWith(smooth, ".v_proj")) {
            compatible = compatible && sw.size(0) == bw.size(1);
          }
          if (absl::EndsWith(smooth, ".qkv_proj")) {
            compatible = compatible && sw.size(0) == 3 * bw.size(1);
          }
        }
        targeted =
            targeted || (!type.empty() && options_.quantized.Matches(b, type));
        parents.push_back(fused != nullptr ? fused->experts : b);
      }
      compatible = compatible && (sw.dim() == 1 ? sw.size(0) == channels
                                                : sw.size(0) >= channels);
      if (!compatible) {
        ++incompatible;
        continue;
      }
      if (!targeted) {
        ++untargeted;
        continue;
      }
      RETURN_IF_ERROR(ResolveObserved(r));
      std::string parent = CommonAncestor(parents);
      while (module_lists.contains(parent)) parent = ParentModulePath(parent);
      r.parent = r.expert_down ? r.balance.front() : parent;
      for (const LeafModule& leaf : ctx.leaf_modules()) {
        if (Within(leaf.path, parent)) r.loss_leaf = leaf.path;
      }
      observers_[r.observed].push_back(resolved_.size());
      if (r.expert_down) expert_down_[r.balance.front()] = resolved_.size();
      resolved_.push_back(std::move(r));
    }
    if (!matched) unmatched.push_back(mapping.smooth_layer);
  }
  if (resolved_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "awq: no mapping matched the model's quantized Linears (smooth layers ",
        absl::StrJoin(unmatched, ", "), defaults ? ", the defaults" : "",
        incompatible > 0 ? absl::StrCat("; ", incompatible, " incompatible")
                         : "",
        untargeted > 0
            ? absl::StrCat("; ", untargeted, " with no quantized layer")
            : "",
        "); give mappings (smooth_layer, balance_layers) for it"));
  }
  if (incompatible > 0) {
    ctx.Warn(absl::StrCat(
        "awq: ", incompatible,
        " mapping(s) skipped: the smooth layer's channels differ from what "
        "its balance layers read (v_proj -> o_proj under grouped-query "
        "attention)"));
  }
  return absl::OkStatus();
}

absl::Status AwqModifier::OnModuleCall(RunContext& ctx,
                                       const ModuleCall& call) {
  const std::string path(call.path);
  bool expert_downs = false;
  for (size_t index : observers_.at(path)) {
    const Resolved& r = resolved_[index];
    if (done_.contains(r.smooth)) continue;
    if (r.expert_down) {
      expert_downs = true;
      continue;
    }
    at::Tensor x;
    if (experts_.IsExperts(path)) {
      ASSIGN_OR_RETURN(x, experts_.Hidden(ctx, call));
    } else if (!call.inputs.empty() && call.inputs[0].isTensor()) {
      x = call.inputs[0].toTensor();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "awq: the input of ", call.path, " (Linear) is not a tensor"));
    }
    RETURN_IF_ERROR(AddStats(index, x, /*hessian=*/false));
  }
  if (!expert_downs) return absl::OkStatus();
  return experts_.ForEachInput(
      ctx, call, [&](const std::string& linear, const at::Tensor& x) {
        auto it = expert_down_.find(linear);
        if (it == expert_down_.end() ||
            done_.contains(resolved_[it->second].smooth)) {
          return absl::OkStatus();
        }
        return AddStats(it->second, x, /*hessian=*/true);
      });
}

absl::Status AwqModifier::OnSubgraphEnd(RunContext& ctx,
                                        const SubgraphInfo& subgraph) {
  // The mappings whose observed layer this subgraph calls, in mapping
  // order (the same on every rank); an experts module's down projections
  // together.
  std::set<std::string> leaves(subgraph.leaf_modules.begin(),
                               subgraph.leaf_modules.end());
  for (const Resolved& r : resolved_) {
    if (!leaves.contains(r.observed) || done_.contains(r.smooth)) continue;
    RETURN_IF_ERROR(r.expert_down ? SmoothExpertDowns(ctx, r.observed)
                                  : Smooth(ctx, r));
  }
  return absl::OkStatus();
}

absl::Status AwqModifier::ResolveObserved(Resolved& r) const {
  std::string experts;
  const FusedLinear* down = nullptr;
  for (const std::string& b : r.balance) {
    if (const FusedLinear* fused = experts_.FindLinear(b)) {
      if (experts.empty()) experts = fused->experts;
      if (fused->slot == 2) down = fused;
    }
  }
  if (down != nullptr) {
    if (r.balance.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "awq: mapping ", r.smooth, " -> ", absl::StrJoin(r.balance, ", "),
          ": a fused expert's down projection is balanced alone (by its "
          "expert's up projection)"));
    }
    r.expert_down = true;
    r.observed = experts;
    return absl::OkStatus();
  }
  if (r.observed.empty()) r.observed = experts;
  if (r.observed.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "awq: mapping ", r.smooth, " -> ", absl::StrJoin(r.balance, ", "),
        ": no balance layer is a Linear whose input a run sees (a leaf "
        "module or a fused expert's projection)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AwqModifier::Stats> AwqModifier::TakeStats(RunContext& ctx,
                                                          size_t index,
                                                          int64_t channels) {
  const std::string where = absl::StrCat("awq: ", resolved_[index].smooth);
  Stats stats;
  if (auto it = stats_.find(index); it != stats_.end()) {
    stats = std::move(it->second);
    stats_.erase(it);
  }
  if (!Distributed()) return stats;
  ASSIGN_OR_RETURN(at::Tensor count, runtime::TorchCall(where, [&] {
                     if (!stats.sum.defined()) {
                       stats.sum = at::zeros({channels}, at::kFloat);
                     }
                     return at::full({1}, double(stats.count), at::kDouble);
                   }));
  RETURN_IF_ERROR(options_.collective->AllReduce(
      stats.sum, ReduceKind::kSum,
      absl::StrCat("the AWQ activation sums of ", resolved_[index].smooth)));
  RETURN_IF_ERROR(options_.collective->AllReduce(
      count, ReduceKind::kSum,
      absl::StrCat("the AWQ token count of ", resolved_[index].smooth)));
  stats.count = static_cast<int64_t>(count.item<double>());
  return stats;
}

absl::Status AwqModifier::Smooth(RunContext& ctx, const Resolved& mapping) {
  const std::string where = absl::StrCat("awq: ", mapping.smooth);
  ASSIGN_OR_RETURN(at::Tensor sw, LiveWeight(ctx, mapping.smooth));
  ASSIGN_OR_RETURN(at::Tensor first, LiveWeight(ctx, mapping.balance.front()));
  ASSIGN_OR_RETURN(Stats stats,
                   TakeStats(ctx, &mapping - resolved_.data(), first.size(1)));
  done_.insert(mapping.smooth);
  if (stats.count == 0) {
    ctx.Warn(absl::StrCat(where, ": no calibration token reached ",
                          mapping.balance.front(), "; not smoothed"));
    return absl::OkStatus();
  }

  // The parent's output with the weights as they are: what each candidate
  // is measured against.
  std::vector<at::Tensor> reference;
  auto capture = [&](std::vector<at::Tensor>& into) {
    return ctx.ReplaySubgraph(
        [&](const ModuleCall& call) -> absl::StatusOr<bool> {
          if (call.path != mapping.loss_leaf) return true;
          ASSIGN_OR_RETURN(at::Tensor out, OutputTensor(call));
          into.push_back(out);
          return false;  // The rest of the subgraph is not needed.
        });
  };
  RETURN_IF_ERROR(capture(reference));
  ASSIGN_OR_RETURN(bool finite, runtime::TorchCall(where, [&] {
                     bool ok = true;
                     for (const at::Tensor& t : reference) {
                       ok = ok && t.isfinite().all().item<bool>();
                     }
                     return ok;
                   }));
  if (reference.empty() || !finite) {
    ctx.Warn(absl::StrCat(
        where, ": the output of ", mapping.parent,
        reference.empty() ? " was never computed" : " is not finite",
        "; not smoothed"));
    return absl::OkStatus();
  }

  // The balance layers the quantizer quantizes: only they are quantized in
  // the search.
  std::vector<bool> quantized;        // Per balance layer.
  std::vector<at::Tensor> originals;  // Of every balance layer.
  std::vector<at::Tensor> quantized_weights;
  for (const std::string& b : mapping.balance) {
    ASSIGN_OR_RETURN(at::Tensor w, LiveWeight(ctx, b));
    ASSIGN_OR_RETURN(at::Tensor copy,
                     runtime::TorchCall(where, [&] { return w.clone(); }));
    originals.push_back(copy);
    quantized.push_back(IsQuantized(ctx, b));
    if (quantized.back()) quantized_weights.push_back(copy);
  }
  ASSIGN_OR_RETURN(auto means, Means(stats, quantized_weights));
  const auto& [x_mean, w_mean] = means;

  // Puts back the original weights, whatever happens in the search.
  auto restore = [&]() -> absl::Status {
    for (size_t k = 0; k < mapping.balance.size(); ++k) {
      ASSIGN_OR_RETURN(at::Tensor w, LiveWeight(ctx, mapping.balance[k]));
      RETURN_IF_ERROR(runtime::TorchCall(where, [&]() -> absl::Status {
        at::NoGradGuard no_grad;
        w.copy_(originals[k]);
        return absl::OkStatus();
      }));
    }
    return absl::OkStatus();
  };
  absl::Cleanup restore_on_error = [&] { restore().IgnoreError(); };

  ASSIGN_OR_RETURN(Search best, SearchScales(ctx, mapping, reference, originals,
                                             quantized, x_mean, w_mean));
  std::move(restore_on_error).Cancel();
  RETURN_IF_ERROR(restore());
  if (best.ratio < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no grid point gave a finite error on ",
                     mapping.parent, "'s output (NaN in its forward pass?)"));
  }

  return ApplyScales(ctx, mapping, sw, originals, reference, best);
}

absl::Status AwqModifier::ApplyScales(RunContext& ctx, const Resolved& mapping,
                                      const at::Tensor& sw,
                                      const std::vector<at::Tensor>& originals,
                                      const std::vector<at::Tensor>& reference,
                                      const Search& best) {
  const std::string where = absl::StrCat("awq: ", mapping.smooth);
  const at::Tensor& best_scales = best.scales;
  // W s on the balance layers, / s on the smooth layer (and its bias).
  for (size_t k = 0; k < mapping.balance.size(); ++k) {
    ASSIGN_OR_RETURN(at::Tensor w, runtime::TorchCall(where, [&] {
                       return (originals[k] * best_scales.view({1, -1}))
                           .to(originals[k].scalar_type());
                     }));
    RETURN_IF_ERROR(SetWeight(ctx, mapping.balance[k], w));
  }
  RETURN_IF_ERROR(experts_.Commit(ctx));
  // A norm's weight, or a Linear's last C output rows (and bias entries).
  auto divided = [&](const at::Tensor& t) {
    return runtime::TorchCall(where, [&] {
      const int64_t c = best_scales.size(0);
      at::Tensor s = t.dim() == 1 ? best_scales : best_scales.view({-1, 1});
      at::Tensor out = t.clone();
      out.narrow(0, t.size(0) - c, c)
          .copy_(at::div(t.narrow(0, t.size(0) - c, c), s));
      return out;
    });
  };
  bool has_bias = false;
  if (experts_.FindLinear(mapping.smooth) == nullptr) {
    ASSIGN_OR_RETURN(torch::jit::Module m,
                     ctx.model().GetSubmodule(mapping.smooth));
    has_bias = m.hasattr("bias") && m.attr("bias").isTensor();
  }
  if (has_bias) {
    const std::string bias_path = absl::StrCat(mapping.smooth, ".bias");
    ASSIGN_OR_RETURN(at::Tensor bias, ctx.model().GetTensor(bias_path));
    ASSIGN_OR_RETURN(at::Tensor new_bias, divided(bias));
    RETURN_IF_ERROR(ctx.UpdateTensor(bias_path, new_bias));
  }
  auto set_weight = [&](const at::Tensor& w) -> absl::Status {
    RETURN_IF_ERROR(SetWeight(ctx, mapping.smooth, w));
    return experts_.Commit(ctx);
  };
  // The smoothed model must compute what it did (output_drift.h).
  auto drift_of = [&]() -> absl::StatusOr<OutputDrift> {
    OutputDrift drift;
    size_t checked = 0;
    RETURN_IF_ERROR(
        ctx.ReplaySubgraph([&](const ModuleCall& call) -> absl::StatusOr<bool> {
          if (call.path != mapping.loss_leaf) return true;
          ASSIGN_OR_RETURN(at::Tensor out, OutputTensor(call));
          if (checked < reference.size()) {
            RETURN_IF_ERROR(drift.Add(reference[checked++], out));
          }
          return false;
        }));
    return drift;
  };
  OutputDrift drift;
  std::string norm_kind;
  if (sw.dim() == 1 && !has_bias) {
    ASSIGN_OR_RETURN(NormSmoothing n,
                     SmoothNormWeight(sw, best_scales, set_weight, drift_of));
    drift = n.drift;
    if (n.offset) norm_kind = " ((1 + weight) norm)";
  } else {
    ASSIGN_OR_RETURN(at::Tensor new_sw, divided(sw));
    RETURN_IF_ERROR(set_weight(new_sw));
    ASSIGN_OR_RETURN(drift, drift_of());
  }
  RETURN_IF_ERROR(drift.Check(sw.scalar_type(), where, mapping.parent));
  ctx.results()
      .Module(mapping.smooth)
      .notes.push_back(absl::StrFormat(
          "awq: scales for %s from ratio %.4g%s; %s output error %.4g -> "
          "%.4g%s",
          absl::StrJoin(mapping.balance, ", "), best.ratio,
          best.duo ? " (duo scaling)" : "", mapping.parent, best.initial_error,
          best.error, norm_kind));
  return absl::OkStatus();
}

absl::Status AwqModifier::OnRunEnd(RunContext& ctx) {
  std::vector<std::string> left;
  for (const Resolved& r : resolved_) {
    if (!done_.contains(r.smooth)) left.push_back(r.smooth);
  }
  if (!left.empty()) {
    ctx.Warn(absl::StrCat(
        "awq: not smoothed (their balance layers ran in no subgraph): ",
        absl::StrJoin(left, ", ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<c10::IValue> AwqModifier::SaveState() const {
  return NamesToState(done_);
}

absl::Status AwqModifier::RestoreState(const c10::IValue& state) {
  ASSIGN_OR_RETURN(done_, NamesFromState(state, "awq"));
  return absl::OkStatus();
}

}  // namespace tracecut::modifiers
