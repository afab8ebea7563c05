#include "modifiers/gptq_modifier.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "quantization/gptq_typed.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

// Note [Output error from the errors] (gptq_typed.h): `out`'s output
// error's trace without an [out, in] x [in, in] product (from rows [begin,
// begin + out) of GPTQ's errors), when it holds for `weight` itself: GPTQ
// ran on `typed`, its cast to the scheme's dtype, which must lose nothing.
// Otherwise it stays NaN and Record computes the product.
absl::Status SetKnownError(const quantization::TypedGptqResult& r,
                           int64_t begin, const at::Tensor& weight,
                           const at::Tensor& typed, WeightQuantOutcome& out,
                           const std::string& where) {
  if (!r.row_output_errors.defined()) return absl::OkStatus();
  return runtime::TorchCall(where, [&]() -> absl::Status {
    if (typed.scalar_type() != weight.scalar_type() &&
        !typed.to(weight.scalar_type()).equal(weight)) {
      return absl::OkStatus();
    }
    out.known_error =
        r.row_output_errors.slice(0, begin, begin + weight.size(0))
            .sum()
            .item<double>();
    return absl::OkStatus();
  });
}

// RTN's output error, the baseline GPTQ is compared with, measured now (when
// the run measures baselines) so that RTN's weight is released before the
// solve.
absl::Status MeasureBaseline(bool measure, const at::Tensor& weight,
                             const at::Tensor& hessian,
                             WeightQuantOutcome& rtn) {
  if (measure) {
    ASSIGN_OR_RETURN(rtn.known_baseline_error,
                     OutputErrorNumerator(weight, rtn.weight, hessian));
  }
  rtn.weight.reset();
  return absl::OkStatus();
}

}  // namespace

using ::tracecut::quantization::GptqQuantize;
using ::tracecut::quantization::GptqResult;
using ::tracecut::quantization::QuantizeRtn;
using ::tracecut::quantization::RtnResult;

GptqModifier::GptqModifier(GptqModifierOptions options)
    : WeightQuantModifier(options.weights) {
  gptq_.scheme = options.weights.scheme;
  gptq_.dampening_frac = options.dampening_frac;
  gptq_.block_size = options.block_size;
  gptq_.act_order = options.act_order;
  gptq_.static_groups = options.static_groups;
}

absl::Status GptqModifier::OnRunStart(RunContext& ctx) {
  if (!(gptq_.dampening_frac >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gptq: dampening_frac must be >= 0, got ", gptq_.dampening_frac));
  }
  if (gptq_.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gptq: block_size must be > 0, got ", gptq_.block_size));
  }
  factors_.clear();
  measure_baselines_ = ctx.measure_baselines();
  return WeightQuantModifier::OnRunStart(ctx);
}

absl::Status GptqModifier::OnSubgraphEnd(RunContext& ctx,
                                         const SubgraphInfo& subgraph) {
  absl::Status s = WeightQuantModifier::OnSubgraphEnd(ctx, subgraph);
  factors_.clear();
  return s;
}

absl::Status GptqModifier::OnRunEnd(RunContext& ctx) {
  absl::Status s = WeightQuantModifier::OnRunEnd(ctx);
  factors_.clear();
  return s;
}

absl::StatusOr<WeightQuantOutcome> GptqModifier::QuantizeWeight(
    absl::string_view path, const at::Tensor& weight,
    const at::Tensor& hessian) {
  if (!hessian.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat("gptq: ", path, ": no calibration inputs"));
  }
  if (options().typed.has_value()) {
    return QuantizeTypedGptq(path, weight, hessian);
  }
  absl::StatusOr<GptqResult> r = GptqQuantize(weight, hessian, gptq_);
  if (!r.ok()) {
    return util::Annotate(r.status(), absl::StrCat("gptq: ", path));
  }
  WeightQuantOutcome out;
  if (measure_baselines_) {
    absl::StatusOr<RtnResult> rtn = QuantizeRtn(weight, gptq_.scheme);
    if (!rtn.ok()) {
      return util::Annotate(rtn.status(),
                            absl::StrCat("gptq: ", path, " (RTN baseline)"));
    }
    ASSIGN_OR_RETURN(out.known_baseline_error,
                     OutputErrorNumerator(weight, rtn->weight, hessian));
  }
  out.weight = std::move(r->weight);
  out.scale = std::move(r->scale);
  out.zero_point = std::move(r->zero_point);
  out.g_idx = std::move(r->g_idx);
  out.loss = r->loss;
  out.warning = std::move(r->warning);
  return out;
}

absl::StatusOr<WeightQuantOutcome> GptqModifier::QuantizeTypedGptq(
    absl::string_view path, const at::Tensor& weight,
    const at::Tensor& hessian) {
  const quantization::QuantizationArgs& args = *options().typed->weights;
  ASSIGN_OR_RETURN(WeightQuantOutcome rtn, QuantizeTyped(path, weight));
  RETURN_IF_ERROR(MeasureBaseline(measure_baselines_, weight, hessian, rtn));
  const quantization::QParams q{rtn.scale, rtn.zero_point, rtn.global_scale};
  quantization::TypedGptqOptions o;
  o.dampening_frac = gptq_.dampening_frac;
  o.block_size = gptq_.block_size;
  // The factor depends on the Hessian alone: made once for the Linears
  // sharing it, kept until the last of them.
  auto it = factors_.find(hessian.unsafeGetTensorImpl());
  if (it == factors_.end()) {
    absl::StatusOr<quantization::HessianFactor> f =
        quantization::FactorizeHessian(hessian, args.actorder,
                                       o.dampening_frac);
    if (!f.ok()) {
      return util::Annotate(f.status(), absl::StrCat("gptq: ", path));
    }
    it = factors_
             .insert_or_assign(hessian.unsafeGetTensorImpl(),
                               SharedFactor{hessian, *std::move(f)})
             .first;
  }
  const std::string where = absl::StrCat("gptq: ", path);
  const at::Tensor typed = TypedWeight(weight);
  absl::StatusOr<quantization::TypedGptqResult> r =
      quantization::TypedGptq(typed, it->second.factor, q, args, o);
  if (!r.ok()) return util::Annotate(r.status(), where);
  WeightQuantOutcome out = rtn;
  out.weight = r->weight.to(weight.scalar_type());
  out.loss = r->loss;
  out.warning = r->warning;
  RETURN_IF_ERROR(SetKnownError(*r, 0, weight, typed, out, where));
  if (hessian_readers_left() == 0) factors_.erase(it);
  return out;
}

bool GptqModifier::SolvesTogether() const {
  if (!options().typed.has_value() || !options().typed->weights.has_value()) {
    return false;
  }
  const quantization::Strategy s =
      options().typed->weights->resolved_strategy();
  return s == quantization::Strategy::kChannel ||
         s == quantization::Strategy::kGroup;
}

absl::StatusOr<std::vector<WeightQuantOutcome>> GptqModifier::QuantizeTogether(
    const std::vector<std::string>& paths,
    const std::vector<at::Tensor>& weights, const at::Tensor& hessian) {
  const quantization::QuantizationArgs& args = *options().typed->weights;
  const std::string where = absl::StrCat("gptq: ", absl::StrJoin(paths, ", "));
  // Each Linear's round-to-nearest: its parameters and baseline.
  std::vector<WeightQuantOutcome> out;
  std::vector<at::Tensor> stacked, scales, zero_points;
  for (size_t i = 0; i < paths.size(); ++i) {
    ASSIGN_OR_RETURN(WeightQuantOutcome rtn,
                     QuantizeTyped(paths[i], weights[i]));
    RETURN_IF_ERROR(
        MeasureBaseline(measure_baselines_, weights[i], hessian, rtn));
    stacked.push_back(TypedWeight(weights[i]));
    scales.push_back(rtn.scale);
    if (rtn.zero_point.defined()) zero_points.push_back(rtn.zero_point);
    out.push_back(std::move(rtn));
  }
  absl::StatusOr<quantization::HessianFactor> factor =
      quantization::FactorizeHessian(hessian, args.actorder,
                                     gptq_.dampening_frac);
  if (!factor.ok()) return util::Annotate(factor.status(), where);
  quantization::QParams q;
  ASSIGN_OR_RETURN(at::Tensor w, runtime::TorchCall(where, [&] {
                     q.scale = at::cat(scales, 0);
                     if (zero_points.size() == paths.size()) {
                       q.zero_point = at::cat(zero_points, 0);
                     }
                     return at::cat(stacked, 0);
                   }));
  quantization::TypedGptqOptions o;
  o.dampening_frac = gptq_.dampening_frac;
  o.block_size = gptq_.block_size;
  absl::StatusOr<quantization::TypedGptqResult> r =
      quantization::TypedGptq(w, *factor, q, args, o);
  if (!r.ok()) return util::Annotate(r.status(), where);
  int64_t row = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    const int64_t rows = weights[i].size(0);
    WeightQuantOutcome& o_i = out[i];
    RETURN_IF_ERROR(runtime::TorchCall(where, [&]() -> absl::Status {
      o_i.weight =
          r->weight.slice(0, row, row + rows).to(weights[i].scalar_type());
      o_i.loss = r->row_losses.slice(0, row, row + rows).sum().item<double>();
      return absl::OkStatus();
    }));
    RETURN_IF_ERROR(SetKnownError(*r, row, weights[i], stacked[i], o_i, where));
    o_i.warning = r->warning;
    row += rows;
  }
  return out;
}

}  // namespace tracecut::modifiers
