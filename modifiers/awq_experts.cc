// AWQ over fused MoE experts (awq_modifier.h): weights that are slices of
// a fused parameter, the activation statistics of a run, and each expert's
// up -> down smoothing, searched on the Hessian of the down projection's
// inputs because the expert's down projection is no module to replay.

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/layout.h"
#include "modifiers/awq_modifier.h"
#include "modifiers/output_drift.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

absl::StatusOr<at::Tensor> AwqModifier::LiveWeight(RunContext& ctx,
                                                   const std::string& path) {
  const FusedLinear* fused = experts_.FindLinear(path);
  if (fused == nullptr) {
    return ctx.model().GetTensor(absl::StrCat(path, ".weight"));
  }
  ASSIGN_OR_RETURN(at::Tensor t, ctx.model().GetTensor(fused->tensor));
  return runtime::TorchCall(absl::StrCat("awq: ", path), [&] {
    return checkpoint::BoxOf(t, fused->piece).view(fused->shape);
  });
}

absl::Status AwqModifier::SetWeight(RunContext& ctx, const std::string& path,
                                    const at::Tensor& weight) {
  if (experts_.FindLinear(path) != nullptr) {
    return experts_.StageWeight(ctx, path, weight);
  }
  return ctx.UpdateTensor(absl::StrCat(path, ".weight"), weight);
}

bool AwqModifier::IsQuantized(RunContext& ctx, const std::string& path) const {
  if (experts_.FindLinear(path) != nullptr) {
    return options_.quantized.Matches(path, kFusedLinearType);
  }
  const LeafModule* leaf = ctx.FindLeaf(path);
  return leaf != nullptr && options_.quantized.Matches(path, leaf->type);
}

absl::Status AwqModifier::AddStats(size_t index, const at::Tensor& x,
                                   bool hessian) {
  return runtime::TorchCall("awq", [&]() -> absl::Status {
    if (x.dim() == 0) return absl::OkStatus();
    at::Tensor flat = x.detach().abs().flatten(0, -2);
    at::Tensor sum = flat.to(at::kFloat).sum(0);
    Stats& s = stats_[index];
    s.sum = s.sum.defined() ? s.sum + sum : sum;
    s.count += flat.size(0);
    if (hessian) {
      at::Tensor f = x.detach().flatten(0, -2).to(at::kFloat);
      at::Tensor h = f.t().matmul(f);
      s.hessian = s.hessian.defined() ? s.hessian.add_(h) : h;
    }
    return absl::OkStatus();
  });
}

absl::Status AwqModifier::SmoothExpertDowns(RunContext& ctx,
                                            const std::string& experts) {
  const std::string where = absl::StrCat("awq: ", experts);
  // The experts module's output as it is: the smoothed module must still
  // compute it.
  std::vector<at::Tensor> reference;
  auto replay = [&](auto&& visit) {
    return ctx.ReplaySubgraph(
        [&](const ModuleCall& call) -> absl::StatusOr<bool> {
          if (call.path != experts) return true;
          ASSIGN_OR_RETURN(at::Tensor out, OutputTensor(call));
          RETURN_IF_ERROR(visit(out));
          return false;
        });
  };
  RETURN_IF_ERROR(replay([&](const at::Tensor& out) {
    reference.push_back(out);
    return absl::OkStatus();
  }));
  at::ScalarType dtype = at::kFloat;
  int smoothed = 0;
  std::vector<std::string> unreached;
  for (size_t index = 0; index < resolved_.size(); ++index) {
    const Resolved& r = resolved_[index];
    if (!r.expert_down || r.observed != experts || done_.contains(r.smooth)) {
      continue;
    }
    done_.insert(r.smooth);
    const std::string& down = r.balance.front();
    ASSIGN_OR_RETURN(at::Tensor w, LiveWeight(ctx, down));       // [out, C]
    ASSIGN_OR_RETURN(at::Tensor up, LiveWeight(ctx, r.smooth));  // [C, in]
    ASSIGN_OR_RETURN(Stats stats, TakeStats(ctx, index, w.size(1)));
    if (stats.count == 0) {
      unreached.push_back(down);
      continue;
    }
    dtype = w.scalar_type();
    ASSIGN_OR_RETURN(auto means, Means(stats, {w}));
    const auto& [x_mean, w_mean] = means;
    // The mean squared error of x (Q(W s) / s - W)^T over the expert's
    // tokens: sum over rows of d H d^T, H = sum of x^T x.
    const double elements = double(stats.count) * double(w.size(0));
    Search best;
    for (const auto& [ratio, duo] :
         AwqGrid(options_.duo_scaling, options_.n_grid)) {
      ASSIGN_OR_RETURN(at::Tensor scales,
                       AwqScales(x_mean, w_mean, ratio, duo));
      ASSIGN_OR_RETURN(at::Tensor candidate, Candidate(w, scales, dtype));
      ASSIGN_OR_RETURN(double error, runtime::TorchCall(where, [&] {
                         at::Tensor d =
                             candidate.to(at::kFloat) - w.to(at::kFloat);
                         return (d.matmul(stats.hessian) * d)
                                    .sum(at::kDouble)
                                    .item<double>() /
                                elements;
                       }));
      best.Offer(error, ratio, duo, scales);
    }
    if (best.ratio < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no grid point gave a finite error on ", down,
                       "'s output (NaN in its inputs?)"));
    }
    // W s on the down projection, / s on the up projection's rows.
    ASSIGN_OR_RETURN(at::Tensor new_down, runtime::TorchCall(where, [&] {
                       return (w * best.scales.view({1, -1})).to(dtype);
                     }));
    ASSIGN_OR_RETURN(
        at::Tensor new_up, runtime::TorchCall(where, [&] {
          return at::div(up, best.scales.view({-1, 1})).to(up.scalar_type());
        }));
    RETURN_IF_ERROR(SetWeight(ctx, down, new_down));
    RETURN_IF_ERROR(SetWeight(ctx, r.smooth, new_up));
    ++smoothed;
    ctx.results().Module(r.smooth).notes.push_back(absl::StrFormat(
        "awq: scales for %s from ratio %.4g%s; its output error %.4g -> %.4g",
        down, best.ratio, best.duo ? " (duo scaling)" : "", best.initial_error,
        best.error));
  }
  RETURN_IF_ERROR(experts_.Commit(ctx));
  if (!unreached.empty()) {
    ctx.Warn(absl::StrCat(where, ": no calibration token reached ",
                          unreached.size(), " expert(s) (", unreached.front(),
                          unreached.size() > 1 ? ", ..." : "",
                          "); their down projections are not smoothed"));
  }
  if (smoothed == 0) return absl::OkStatus();
  // The smoothed experts must compute what they did (output_drift.h).
  OutputDrift drift;
  size_t checked = 0;
  RETURN_IF_ERROR(replay([&](const at::Tensor& out) -> absl::Status {
    if (checked >= reference.size()) return absl::OkStatus();
    return drift.Add(reference[checked++], out);
  }));
  return drift.Check(dtype, where, experts);
}

}  // namespace tracecut::modifiers
