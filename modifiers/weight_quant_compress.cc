// WeightQuantModifier's compression of the modules it calibrated: each
// module's weight quantized (with its Hessian, when it has inputs) and
// recorded; Linears sharing a Hessian solved together when the method
// can (Note [Shared Hessians]).

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "modifiers/weight_quant_modifier.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

absl::StatusOr<WeightQuantModifier::Prepared> WeightQuantModifier::Prepare(
    RunContext& ctx, const std::string& path, Pending* pending) {
  Prepared p;
  p.start = absl::Now();
  p.fused = experts_.FindLinear(path) != nullptr;
  p.transposed = transposed_.count(path) > 0;
  at::Tensor w;  // The model's own tensor (not for fused experts).
  if (p.fused) {
    ASSIGN_OR_RETURN(p.original, experts_.Weight(ctx, path));
  } else {
    ASSIGN_OR_RETURN(w, ctx.model().GetTensor(absl::StrCat(path, ".weight")));
    // No copy: RunContext::UpdateTensor replaces the model's tensor, it
    // never writes into it, so `w` holds the original until Record.
    p.original = p.transposed ? w.detach().t().contiguous() : w.detach();
  }
  // A module no calibration token reached (never called, or called with
  // empty inputs: an MoE expert the router never picks) has no statistics:
  // its H is all zeros, from which GPTQ would zero the whole weight (every
  // column "dead"). It is quantized round-to-nearest from its own weights.
  p.tokens = pending != nullptr ? pending->tokens : 0;
  hessian_readers_left_ = 0;
  if (p.tokens > 0 && pending->hessian != nullptr) {
    p.hessian = pending->hessian->hessian();
    // Note [Output energy]: only while the weight is the tensor that
    // computed the outputs (AddOutputEnergy took no inference tensor, so
    // the same TensorImpl has a version counter), unmodified since.
    if (w.defined() && pending->energy_valid &&
        pending->output_energy.defined() &&
        pending->hessian->num_samples() > 0 &&
        w.unsafeGetTensorImpl() == pending->energy_weight &&
        w._version() == pending->energy_weight_version) {
      ASSIGN_OR_RETURN(double energy, runtime::TorchCall(path, [&] {
                         return pending->output_energy.item<double>();
                       }));
      p.weight_trace =
          energy * 2.0 / static_cast<double>(pending->hessian->num_samples());
    }
    // Note [Shared Hessians]: the Linears still to be compressed with it.
    hessian_readers_left_ = pending->hessian.use_count() - 1;
    pending->hessian.reset();
  }
  return p;
}

absl::Status WeightQuantModifier::Compress(RunContext& ctx,
                                           const std::string& path,
                                           Pending* pending) {
  ASSIGN_OR_RETURN(Prepared p, Prepare(ctx, path, pending));
  ASSIGN_OR_RETURN(global_scale_, FusedGlobalScale(ctx, path));
  WeightQuantOutcome outcome;
  if (p.tokens > 0) {
    ASSIGN_OR_RETURN(outcome, QuantizeWeight(path, p.original, p.hessian));
  } else {
    ASSIGN_OR_RETURN(outcome, QuantizeWithoutData(path, p.original));
  }
  return Record(ctx, path, pending, p, std::move(outcome), /*share=*/1);
}

absl::Status WeightQuantModifier::CompressPending(RunContext& ctx) {
  // Linears that share a Hessian, by it, in path order; then each one's
  // group.
  std::map<const quantization::HessianAccumulator*, std::vector<std::string>>
      sharing;
  if (SolvesTogether()) {
    for (const auto& [path, pending] : pending_) {
      if (pending.tokens > 0 && pending.hessian.use_count() > 1) {
        sharing[pending.hessian.get()].push_back(path);
      }
    }
  }
  std::map<std::string, const std::vector<std::string>*> group_of;
  for (const auto& [hessian, paths] : sharing) {
    if (paths.size() < 2) continue;
    for (const std::string& path : paths) group_of[path] = &paths;
  }
  // std::map: modules in path order, so results do not depend on call
  // order; a group at its first member.
  std::set<std::string> solved;  // With their group.
  for (auto& [path, pending] : pending_) {
    if (solved.count(path) > 0) continue;
    auto group = group_of.find(path);
    if (group == group_of.end()) {
      RETURN_IF_ERROR(Compress(ctx, path, &pending));
    } else {
      RETURN_IF_ERROR(CompressTogether(ctx, *group->second));
      solved.insert(group->second->begin(), group->second->end());
    }
  }
  pending_.clear();
  return absl::OkStatus();
}

absl::Status WeightQuantModifier::CompressTogether(
    RunContext& ctx, const std::vector<std::string>& paths) {
  std::vector<Prepared> prepared;
  std::vector<at::Tensor> originals;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(Prepared p, Prepare(ctx, path, &pending_.at(path)));
    originals.push_back(p.original);
    prepared.push_back(std::move(p));
  }
  global_scale_ = at::Tensor();  // SolvesTogether() schemes have none.
  ASSIGN_OR_RETURN(
      std::vector<WeightQuantOutcome> outcomes,
      QuantizeTogether(paths, originals, prepared.front().hessian));
  if (outcomes.size() != paths.size()) {
    return absl::InternalError(absl::StrCat(
        name(), ": ", outcomes.size(), " outcomes for ", paths.size(),
        " Linears sharing a Hessian (", paths.front(), ", ...)"));
  }
  solved_together_ += static_cast<int64_t>(paths.size());
  // The time is the group's: each member is given its share.
  for (size_t i = 0; i < paths.size(); ++i) {
    prepared[i].start = prepared.front().start;
    RETURN_IF_ERROR(Record(ctx, paths[i], &pending_.at(paths[i]), prepared[i],
                           std::move(outcomes[i]), 1.0 / paths.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WeightQuantOutcome>>
WeightQuantModifier::QuantizeTogether(const std::vector<std::string>& paths,
                                      const std::vector<at::Tensor>& weights,
                                      const at::Tensor& hessian) {
  return absl::UnimplementedError(
      absl::StrCat(name(), " does not solve Linears together"));
}

absl::Status WeightQuantModifier::Record(RunContext& ctx,
                                         const std::string& path,
                                         Pending* pending, const Prepared& p,
                                         WeightQuantOutcome outcome,
                                         double share) {
  ModuleRecord& r = ctx.results().Module(path);
  if (const LeafModule* leaf = ctx.FindLeaf(path)) r.type = leaf->type;
  if (p.fused) r.type = "torch.nn.modules.linear.Linear";
  if (pending != nullptr) r.subgraph = pending->subgraph;
  r.calibration_tokens = p.tokens;
  r.weight_method = p.tokens > 0 ? method() : "rtn";
  if (p.tokens == 0) {
    std::string why = absl::StrCat(
        pending == nullptr ? "never called during calibration"
                           : "called only with empty inputs (0 tokens)",
        ": no calibration data; quantized round-to-nearest from its own "
        "weights",
        NeedsHessian() ? absl::StrCat(" instead of ", method()) : "",
        ", output error not measured");
    r.notes.push_back(why);
    ctx.Warn(absl::StrCat(name(), ": ", path, ": ", why));
  }
  r.weight_scheme = options_.typed.has_value()
                        ? options_.typed->weights->ToString()
                        : options_.scheme.ToString();
  r.weight_quantization = TypedRecord();
  r.weight_scale = outcome.scale;
  r.weight_zero_point = outcome.zero_point;
  r.weight_global_scale = outcome.global_scale;
  r.weight_g_idx = outcome.g_idx;
  r.gptq_loss = outcome.loss;
  if (static_input_.has_value()) {
    RETURN_IF_ERROR(RecordInput(ctx, path, pending, r));
  }
  if (p.hessian.defined()) {
    std::vector<at::Tensor> quantized = {outcome.weight};
    std::vector<double> known = {outcome.known_error};
    if (std::isfinite(outcome.known_baseline_error)) {
      quantized.emplace_back();  // Known: no weight needed.
      known.push_back(outcome.known_baseline_error);
    }
    ASSIGN_OR_RETURN(std::vector<double> errors,
                     RelativeOutputErrors(p.original, quantized, p.hessian,
                                          known, p.weight_trace));
    r.weight_error = errors[0];
    if (errors.size() > 1) r.rtn_error = errors[1];
  }
  if (p.fused) {
    RETURN_IF_ERROR(experts_.StageWeight(ctx, path, outcome.weight));
  } else {
    RETURN_IF_ERROR(ctx.UpdateTensor(
        absl::StrCat(path, ".weight"),
        p.transposed ? outcome.weight.t().contiguous() : outcome.weight));
  }
  if (!outcome.warning.empty()) {
    r.notes.push_back(outcome.warning);
    ctx.Warn(absl::StrCat(name(), ": ", path, ": ", outcome.warning));
  }
  r.compress_seconds = share * absl::ToDoubleSeconds(absl::Now() - p.start);
  done_.insert(path);
  return absl::OkStatus();
}

}  // namespace tracecut::modifiers
