// AWQ's grid search: each grid point's scales, the balance layers'
// quantized candidates Q(W s) / s, and the loss of the replayed parent.
#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "modifiers/awq_modifier.h"
#include "quantization/fake_quant.h"
#include "quantization/observers.h"
#include "runtime/collective.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::tracecut::runtime::ReduceKind;

void AwqModifier::Search::Offer(double e, double r, bool d,
                                const at::Tensor& s) {
  if (std::isnan(initial_error)) initial_error = e;
  if (e < error) {
    error = e;
    ratio = r;
    duo = d;
    scales = s;
  }
}

absl::StatusOr<std::pair<at::Tensor, at::Tensor>> AwqModifier::Means(
    const Stats& stats, const std::vector<at::Tensor>& quantized) const {
  ASSIGN_OR_RETURN(at::Tensor x_mean, runtime::TorchCall("awq", [&] {
                     return stats.sum / at::full({}, stats.count, at::kLong);
                   }));
  at::Tensor w_mean;
  if (options_.duo_scaling != AwqDuoScaling::kOff) {
    ASSIGN_OR_RETURN(w_mean, AwqWeightMeans(quantized, options_.weights));
  }
  return std::make_pair(x_mean, w_mean);
}

absl::StatusOr<at::Tensor> AwqModifier::Candidate(const at::Tensor& w,
                                                  const at::Tensor& scales,
                                                  at::ScalarType dtype) const {
  ASSIGN_OR_RETURN(at::Tensor scaled, runtime::TorchCall("awq", [&] {
                     return (w * scales.view({1, -1})).to(dtype);
                   }));
  ASSIGN_OR_RETURN(quantization::QParams q,
                   quantization::WeightQParams(scaled, options_.weights));
  ASSIGN_OR_RETURN(at::Tensor fq,
                   quantization::FakeQuantize(scaled, q, options_.weights));
  return runtime::TorchCall("awq", [&] {
    return (fq / scales.view({1, -1})).to(dtype);
  });
}

absl::StatusOr<AwqModifier::Search> AwqModifier::SearchScales(
    RunContext& ctx, const Resolved& mapping,
    const std::vector<at::Tensor>& reference,
    const std::vector<at::Tensor>& originals,
    const std::vector<bool>& quantized, const at::Tensor& x_mean,
    const at::Tensor& w_mean) {
  const std::string where = absl::StrCat("awq: ", mapping.smooth);
  Search best;
  for (const auto& [ratio, duo] :
       AwqGrid(options_.duo_scaling, options_.n_grid)) {
    ASSIGN_OR_RETURN(at::Tensor scales, AwqScales(x_mean, w_mean, ratio, duo));
    // Q(W s) / s on each quantized balance layer, in place.
    for (size_t k = 0; k < mapping.balance.size(); ++k) {
      if (!quantized[k]) continue;
      ASSIGN_OR_RETURN(at::Tensor w, LiveWeight(ctx, mapping.balance[k]));
      ASSIGN_OR_RETURN(at::Tensor candidate,
                       Candidate(originals[k], scales, w.scalar_type()));
      RETURN_IF_ERROR(runtime::TorchCall(where, [&]() -> absl::Status {
        at::NoGradGuard no_grad;
        w.copy_(candidate);
        return absl::OkStatus();
      }));
    }
    ASSIGN_OR_RETURN(double error, ReplayError(ctx, mapping, reference));
    best.Offer(error, ratio, duo, scales);
  }
  return best;
}

absl::StatusOr<double> AwqModifier::ReplayError(
    RunContext& ctx, const Resolved& mapping,
    const std::vector<at::Tensor>& reference) {
  const std::string where = absl::StrCat("awq: ", mapping.smooth);
  at::Tensor loss;
  int64_t elements = 0;
  size_t batch = 0;
  absl::Status replayed =
      ctx.ReplaySubgraph([&](const ModuleCall& call) -> absl::StatusOr<bool> {
        if (call.path != mapping.loss_leaf) return true;
        ASSIGN_OR_RETURN(at::Tensor out, OutputTensor(call));
        if (batch >= reference.size()) {
          return absl::InternalError(
              absl::StrCat(where, ": more batches replayed than captured"));
        }
        const at::Tensor& want = reference[batch++];
        RETURN_IF_ERROR(runtime::TorchCall(where, [&]() -> absl::Status {
          at::Tensor l =
              at::mse_loss(want, out.to(want.device()), at::Reduction::Sum);
          loss = loss.defined() ? loss + l : l.to(at::kFloat);
          elements += want.numel();
          return absl::OkStatus();
        }));
        return false;
      });
  RETURN_IF_ERROR(replayed);
  ASSIGN_OR_RETURN(at::Tensor total, runtime::TorchCall(where, [&] {
                     return loss.defined() ? loss.reshape({1}).to(at::kFloat)
                                           : at::zeros({1}, at::kFloat);
                   }));
  at::Tensor count = at::full({1}, elements, total.options().dtype(at::kLong));
  if (Distributed()) {
    at::Tensor count_f = count.to(at::kDouble);
    RETURN_IF_ERROR(options_.collective->AllReduce(
        total, ReduceKind::kSum,
        absl::StrCat("the AWQ error of ", mapping.smooth)));
    RETURN_IF_ERROR(options_.collective->AllReduce(
        count_f, ReduceKind::kSum,
        absl::StrCat("the AWQ element count of ", mapping.smooth)));
    count = count_f.to(at::kLong);
  }
  return runtime::TorchCall(where, [&] {
    return static_cast<double>((total / count).item<float>());
  });
}

}  // namespace tracecut::modifiers
