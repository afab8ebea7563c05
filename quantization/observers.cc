#include "quantization/observers.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

// torch.finfo(dtype).max.
double FinfoMax(c10::ScalarType d) {
  switch (d) {
    case at::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
    case at::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::max());
    case at::kFloat:
      return std::numeric_limits<float>::max();
    default:
      return std::numeric_limits<double>::max();
  }
}

// The dtype compressed-tensors' initialize_qparams gives a scale parameter.
c10::ScalarType ScaleParamDtype(c10::ScalarType observed) {
  switch (observed) {
    case at::kHalf:
    case at::kBFloat16:
    case at::kFloat:
    case at::kDouble:
      return observed;
    default:
      return at::kHalf;
  }
}

// _grid_search_mse's _calculate_error.
at::Tensor MseError(const at::Tensor& observed, const QuantizationArgs& args,
                    const QuantizationArgs& token_args,
                    const at::Tensor& shrunk_min, const at::Tensor& shrunk_max,
                    double norm) {
  QParams candidate =
      internal::CalculateQParams(shrunk_min, shrunk_max, args, at::Tensor());
  candidate.scale = candidate.scale.unsqueeze(-1);
  candidate.zero_point = candidate.zero_point.unsqueeze(-1);
  at::Tensor q = internal::ProcessQuantization(observed, candidate, token_args,
                                               std::nullopt, true, true)
                     .to(observed.scalar_type());
  // IntArrayRef: with a braced list, torch 2.11's overloads (dims or
  // dimnames) are ambiguous (bench/gpu builds against it).
  return at::sum((q - observed).abs().pow(norm), at::IntArrayRef({0, -1}));
}

absl::StatusOr<double> KwargNumber(const QuantizationArgs& args,
                                   const char* key, double fallback) {
  const util::Json* v = util::FindMember(args.observer_kwargs, key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("observer_kwargs.", key,
                                                   ": expected a number, got ",
                                                   util::JsonTypeName(*v)));
  }
  return v->get<double>();
}

}  // namespace

absl::StatusOr<at::Tensor> FlattenWeight(const at::Tensor& weight,
                                         const QuantizationArgs& args) {
  if (weight.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight: expected a 2-D [out, in] weight, got ", Shape(weight)));
  }
  const Strategy s = args.resolved_strategy();
  switch (s) {
    case Strategy::kTensor:
      return weight.reshape({1, 1, -1});
    case Strategy::kChannel:
      return weight.unsqueeze(-2).unsqueeze(0);
    case Strategy::kGroup:
    case Strategy::kTensorGroup: {
      const int64_t g = *args.group_size;
      if (weight.size(1) % g != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("weight ", Shape(weight), ": ", weight.size(1),
                         " columns are not divisible by group_size ", g));
      }
      return weight.unflatten(-1, {-1, g}).unsqueeze(0);
    }
    case Strategy::kBlock: {
      const int64_t bh = (*args.block_structure)[0];
      const int64_t bw = (*args.block_structure)[1];
      const int64_t pad_rows = (bh - weight.size(0) % bh) % bh;
      const int64_t pad_cols = (bw - weight.size(1) % bw) % bw;
      at::Tensor padded =
          pad_rows == 0 && pad_cols == 0
              ? weight
              : at::constant_pad_nd(weight, {0, pad_cols, 0, pad_rows}, 0);
      const int64_t rows = padded.size(0), cols = padded.size(1);
      return padded.reshape({rows / bh, bh, cols / bw, bw})
          .transpose(1, 2)
          .flatten(-2, -1)
          .unsqueeze(0);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("weight: strategy ", StrategyName(s),
                       " cannot be applied to weights"));
  }
}

absl::StatusOr<at::Tensor> FlattenAttention(const at::Tensor& value,
                                            const QuantizationArgs& args) {
  if (value.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention states: expected [batch, heads, seq, head_dim], got ",
        Shape(value)));
  }
  const at::Tensor by_token = value.transpose(1, 2).flatten(0, 1);
  switch (args.resolved_strategy()) {
    case Strategy::kTensor:  // (batch * seq, 1, heads * head_dim)
      return by_token.flatten(-2, -1).unsqueeze(-2);
    case Strategy::kAttnHead:  // (batch * seq, heads, 1, 1, head_dim)
      return by_token.unsqueeze(-2).unsqueeze(-2);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "attention states: strategy ", StrategyName(args.resolved_strategy()),
          " cannot be applied to attention"));
  }
}

absl::StatusOr<at::Tensor> FlattenActivation(const at::Tensor& value,
                                             const QuantizationArgs& args) {
  const Strategy s = args.resolved_strategy();
  if (value.dim() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation: expected [..., hidden], got ", Shape(value)));
  }
  switch (s) {
    case Strategy::kTensor:
      return value.reshape({-1, 1, value.size(-1)});
    case Strategy::kToken:
      return value;
    case Strategy::kGroup:
    case Strategy::kTensorGroup: {
      const int64_t g = *args.group_size;
      if (value.size(-1) % g != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "activation ", Shape(value), ": hidden size ", value.size(-1),
            " is not divisible by group_size ", g));
      }
      // flatten(0, 1) of a [batch, seq, hidden] activation.
      at::Tensor v = value.dim() >= 3 ? value.flatten(0, 1) : value;
      return v.unflatten(-1, {-1, g});
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("activation: strategy ", StrategyName(s),
                       " cannot be applied to activations"));
  }
}

MinMax ObservedMinMax(const at::Tensor& observed) {
  return {at::amin(observed, {0, -1}), at::amax(observed, {0, -1})};
}

absl::StatusOr<MseOptions> MseOptions::FromArgs(const QuantizationArgs& args) {
  MseOptions o;
  ASSIGN_OR_RETURN(o.maxshrink, KwargNumber(args, "maxshrink", o.maxshrink));
  ASSIGN_OR_RETURN(
      double patience,
      KwargNumber(args, "patience", static_cast<double>(o.patience)));
  o.patience = static_cast<int64_t>(patience);
  ASSIGN_OR_RETURN(o.grid, KwargNumber(args, "grid", o.grid));
  ASSIGN_OR_RETURN(o.norm, KwargNumber(args, "norm", o.norm));
  ASSIGN_OR_RETURN(o.expand, KwargNumber(args, "expand", o.expand));
  if (o.expand < 1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "observer_kwargs.expand: must be at least 1.0, got ", o.expand));
  }
  if (o.grid <= 0 || o.maxshrink < 0 || o.maxshrink >= 1) {
    return absl::InvalidArgumentError(
        "observer_kwargs: need grid > 0 and 0 <= maxshrink < 1");
  }
  return o;
}

absl::StatusOr<MinMax> MseMinMax(const at::Tensor& observed,
                                 const QuantizationArgs& in_args,
                                 const MseOptions& o) {
  QuantizationArgs args = in_args;
  if (args.resolved_strategy() == Strategy::kTensorGroup) {
    args.scale_dtype.reset();  // The search ignores NVFP4's fp8 rounding.
  }
  QuantizationArgs token_args = args;
  token_args.strategy = Strategy::kToken;
  return runtime::TorchCall("mse observer", [&] {
    at::Tensor min_val = at::amin(observed, {0, -1}) * o.expand;
    at::Tensor max_val = at::amax(observed, {0, -1}) * o.expand;
    at::Tensor best_error =
        at::full_like(min_val, FinfoMax(min_val.scalar_type()));
    at::Tensor best_min = min_val.clone();
    at::Tensor best_max = max_val.clone();
    const auto total_steps = static_cast<int64_t>(o.maxshrink * o.grid);
    int64_t no_improve = 0;
    for (int64_t i = 0; i < total_steps; ++i) {
      const double p = 1 - static_cast<double>(i) / o.grid;
      at::Tensor shrunk_min = min_val * p;
      at::Tensor shrunk_max = max_val * p;
      at::Tensor err =
          MseError(observed, args, token_args, shrunk_min, shrunk_max, o.norm);
      at::Tensor improved = err < best_error;
      if (improved.any().item<bool>()) {
        best_error = at::where(improved, err, best_error);
        best_min = at::where(improved, shrunk_min, best_min);
        best_max = at::where(improved, shrunk_max, best_max);
        no_improve = 0;
      } else if (++no_improve >= o.patience) {
        break;
      }
    }
    return MinMax{best_min, best_max};
  });
}

absl::StatusOr<MinMax> WeightMinMax(const at::Tensor& weight,
                                    const QuantizationArgs& args) {
  RETURN_IF_ERROR(CheckFinite(weight, "weight"));
  ASSIGN_OR_RETURN(at::Tensor observed, FlattenWeight(weight, args));
  const std::string observer = args.observer.value_or("minmax");
  // llm-compressor always uses the memoryless variants for weights.
  if (observer == "mse" || observer == "memoryless_mse") {
    ASSIGN_OR_RETURN(MseOptions options, MseOptions::FromArgs(args));
    return MseMinMax(observed, args, options);
  }
  return runtime::TorchCall("minmax observer",
                            [&] { return ObservedMinMax(observed); });
}

absl::StatusOr<at::Tensor> FusedGlobalScale(const std::vector<MinMax>& stats) {
  if (stats.empty()) {
    return absl::InvalidArgumentError("global scale of no weights");
  }
  ASSIGN_OR_RETURN(at::Tensor absmax,
                   runtime::TorchCall("fused global scale", [&] {
                     // Observer.get_global_scale.
                     at::Tensor m = stats[0].max_vals.max();
                     for (const MinMax& s : stats) {
                       m = at::max(m, -s.min_vals.min());
                       m = at::max(m, s.max_vals.max());
                     }
                     return m;
                   }));
  return GenerateGlobalScale(-absmax.reshape({1}), absmax.reshape({1}));
}

absl::StatusOr<QParams> WeightQParams(const at::Tensor& weight,
                                      const QuantizationArgs& args,
                                      const at::Tensor& global_scale) {
  ASSIGN_OR_RETURN(MinMax stats, WeightMinMax(weight, args));
  at::Tensor gs = global_scale;
  if (args.resolved_strategy() == Strategy::kTensorGroup && !gs.defined()) {
    ASSIGN_OR_RETURN(gs, FusedGlobalScale({stats}));
  }
  ASSIGN_OR_RETURN(QParams q,
                   CalculateQParams(stats.min_vals, stats.max_vals, args, gs));
  // update_offload_parameter copies into the module's parameters.
  return runtime::TorchCall("weight quantization parameters", [&] {
    q.scale = q.scale.to(ScaleParamDtype(weight.scalar_type()));
    q.zero_point = q.zero_point.to(*args.zp_dtype);
    if (gs.defined()) q.global_scale = gs.to(at::kFloat);
    return q;
  });
}

absl::StatusOr<ActivationObserver> ActivationObserver::Create(
    const QuantizationArgs& args) {
  const Strategy s = args.resolved_strategy();
  const bool local = args.dynamic == Dynamic::kLocal;
  if (args.dynamic == Dynamic::kDynamic ||
      !(s == Strategy::kTensor || (local && s == Strategy::kTensorGroup))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input_activations: ", args.ToString(),
        " is not calibrated (static activations are per tensor, or "
        "tensor_group with dynamic \"local\")"));
  }
  return Make(args, /*attention=*/false);
}

absl::StatusOr<ActivationObserver> ActivationObserver::CreateForAttention(
    const QuantizationArgs& args) {
  const Strategy s = args.resolved_strategy();
  if (args.dynamic != Dynamic::kStatic ||
      !(s == Strategy::kTensor || s == Strategy::kAttnHead)) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.ToString(),
                     " is not calibrated (a KV cache is static, per tensor "
                     "or per head, attn_head)"));
  }
  return Make(args, /*attention=*/true);
}

absl::StatusOr<ActivationObserver> ActivationObserver::Make(
    const QuantizationArgs& args, bool attention) {
  const std::string observer = args.observer.value_or("minmax");
  if (observer != "minmax" && observer != "static_minmax") {
    return absl::InvalidArgumentError(absl::StrCat(
        attention ? "" : "input_activations.", "observer: \"", observer,
        "\" is not an activation observer (minmax, "
        "static_minmax)"));
  }
  ASSIGN_OR_RETURN(double c, KwargNumber(args, "averaging_constant", 0.01));
  return ActivationObserver(args, observer == "minmax", c, attention);
}

absl::Status ActivationObserver::Observe(const at::Tensor& value) {
  if (value.numel() == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckFinite(value, "activation"));
  ASSIGN_OR_RETURN(at::Tensor observed, attention_
                                            ? FlattenAttention(value, args_)
                                            : FlattenActivation(value, args_));
  return runtime::TorchCall("activation observer", [&] {
    MinMax now = ObservedMinMax(observed);
    if (!stats_.min_vals.defined()) {
      stats_ = now;
    } else if (moving_average_) {
      if (averaging_constant_ != 1.0) {  // lerp(old, new, c)
        now.min_vals = stats_.min_vals * (1.0 - averaging_constant_) +
                       now.min_vals * averaging_constant_;
        now.max_vals = stats_.max_vals * (1.0 - averaging_constant_) +
                       now.max_vals * averaging_constant_;
      }
      stats_ = now;
    } else {
      stats_.min_vals = at::min(now.min_vals, stats_.min_vals);
      stats_.max_vals = at::max(now.max_vals, stats_.max_vals);
    }
  });
}

absl::StatusOr<QParams> ActivationObserver::Finish(
    c10::ScalarType scale_dtype) const {
  if (!has_statistics()) {
    return absl::FailedPreconditionError(
        "activation observer saw no calibration data");
  }
  at::Tensor gs;
  if (args_.resolved_strategy() == Strategy::kTensorGroup) {
    ASSIGN_OR_RETURN(gs, FusedGlobalScale({stats_}));
  }
  if (args_.dynamic == Dynamic::kLocal) {
    QParams q;
    q.global_scale = gs;
    return q;
  }
  ASSIGN_OR_RETURN(
      QParams q, CalculateQParams(stats_.min_vals, stats_.max_vals, args_, gs));
  return runtime::TorchCall("activation quantization parameters", [&] {
    q.scale = q.scale.to(ScaleParamDtype(scale_dtype));
    q.zero_point = q.zero_point.to(*args_.zp_dtype);
    return q;
  });
}

absl::Status CheckTypedSchemeRuns(const QuantizationScheme& s) {
  if (s.output_activations.has_value()) {
    return absl::UnimplementedError(absl::StrCat(
        "output_activations (", s.output_activations->ToString(),
        ") are not supported yet; quantize weights and input activations"));
  }
  const auto& in = s.input_activations;
  if (in.has_value() && in->dynamic != Dynamic::kDynamic) {
    // Static ones are calibrated (modifiers/weight_quant_modifier.h Note
    // [Static input activations]) where an observer can: per tensor, or NVFP4's
    // global scale.
    RETURN_IF_ERROR(ActivationObserver::Create(*in).status());
  }
  return absl::OkStatus();
}

}  // namespace tracecut::quantization
