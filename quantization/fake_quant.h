#ifndef TRACECUT_QUANTIZATION_FAKE_QUANT_H_
#define TRACECUT_QUANTIZATION_FAKE_QUANT_H_

// Quantization parameters and quantize / dequantize / fake-quantize for every
// type and strategy of QuantizationArgs, bit-exact with compressed-tensors 0.19
// on the CPU: CalculateQParams is `calculate_qparams`, GenerateGlobalScale is
// `generate_gparam`, Quantize / Dequantize / FakeQuantize are `quantize` /
// `dequantize` / `fake_quantize` (lifecycle/forward.py), DynamicQParams is
// `compute_dynamic_scales_and_zp`.
//
//   ASSIGN_OR_RETURN(QParams q, WeightQParams(w, *scheme.weights));  //
//   observers.h ASSIGN_OR_RETURN(at::Tensor w_q, FakeQuantize(w, q,
//   *scheme.weights));
//
// Note [Bit-exact with compressed-tensors]
// ----------------------------------------
// LibTorch here is the library compressed-tensors runs on, so issuing the
// same ATen operators on tensors of the same dtypes gives the same bits.
// Every function below therefore follows compressed-tensors' operator
// sequence and its dtype flow, not a tidier one:
// * arithmetic happens in the dtype torch's type promotion picks: a bf16
//   weight's scale is computed in bf16 (max|w| / 7.5 for int4), an NVFP4
//   scale in fp32 (global_scale fp32 [1] x bf16 local scale);
// * symmetric int: scale = absmax / ((qmax - qmin) / 2), so int4 uses
//   absmax / 7.5 and codes in the full [-8, 7]; asymmetric: scale =
//   (max - min) / (qmax - qmin), zero point = round(clamp(qmin - min /
//   scale)); the range always contains 0;
// * a zero scale becomes the scale dtype's epsilon (fp8: 0.125, uint8: 1);
// * rounding: int by torch.round (half to even), float8 by the e4m3fn cast
//   (round to nearest even), float4 by compressed-tensors' threshold table
//   (ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
//   5 -> 4), MX scales by round_to_power_2 and e8m0 exponents;
// * a zero point, when given, is added even when it is 0 (-0.0 becomes +0.0
//   as in compressed-tensors: callers pass the zero point the module holds).
// compressed-tensors' Triton kernels (CUDA) are not the reference.
//
// Errors: InvalidArgument for NaN/Inf inputs, shapes a strategy cannot take
// (a group that does not divide the columns), or parameters of the wrong
// shape; LibTorch exceptions never escape.

#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "quantization/quant_args.h"

namespace tracecut::quantization {

// Scale, zero point and (tensor_group only) global scale of one quantized
// tensor, in the dtypes the caller keeps them in (see WeightQParams).
struct QParams {
  at::Tensor scale;
  at::Tensor zero_point;    // Undefined: none (compressed-tensors' None).
  at::Tensor global_scale;  // fp32 [1]; undefined unless tensor_group.
};

// calculate_range: (q_min, q_max) as 0-dim fp32 tensors on `device`.
std::pair<at::Tensor, at::Tensor> QuantRange(const QuantizationArgs& args,
                                             const c10::Device& device);

// calculate_qparams from per-parameter min/max values.
absl::StatusOr<QParams> CalculateQParams(const at::Tensor& min_vals,
                                         const at::Tensor& max_vals,
                                         const QuantizationArgs& args,
                                         const at::Tensor& global_scale = {});

// generate_gparam: from the min / max of a whole tensor ([1] each), the fp32
// [1] global scale mapping its absmax to 448 * 6 (fp8 max times fp4 max); 1
// where that is not finite.
absl::StatusOr<at::Tensor> GenerateGlobalScale(const at::Tensor& min_vals,
                                               const at::Tensor& max_vals);

// quantize(): the grid values of `x` (float dtype of the computation, or
// `dtype` when given: int8 codes, float8_e4m3fn).
absl::StatusOr<at::Tensor> Quantize(const at::Tensor& x, const QParams& q,
                                    const QuantizationArgs& args,
                                    std::optional<c10::ScalarType> dtype = {});

// dequantize(): real values of grid values `x_q` in `dtype` (default: the
// scale's dtype).
absl::StatusOr<at::Tensor> Dequantize(
    const at::Tensor& x_q, const QParams& q, const QuantizationArgs& args,
    std::optional<c10::ScalarType> dtype = {});

// fake_quantize(): quantize then dequantize in one pass.
absl::StatusOr<at::Tensor> FakeQuantize(const at::Tensor& x, const QParams& q,
                                        const QuantizationArgs& args);

// compute_dynamic_scales_and_zp for an activation [..., hidden] under
// dynamic (or "local") args: token, tensor, group and tensor_group.
absl::StatusOr<QParams> DynamicQParams(const at::Tensor& value,
                                       const QuantizationArgs& args,
                                       const at::Tensor& global_scale = {});

// cast_to_fp4: each value rounded to the nearest e2m1 value (same dtype).
at::Tensor CastToFp4(const at::Tensor& x);

// round_to_power_2 of the MX scale computation (bf16/fp16/fp32/fp64).
at::Tensor RoundToPowerOf2(const at::Tensor& x);

// OK when `t` is defined, floating point and finite; otherwise
// InvalidArgument "<what>: contains NaN" (or Inf, or "is not floating point").
absl::Status CheckFinite(const at::Tensor& t, absl::string_view what);

namespace internal {

// The unchecked operator sequences (they throw c10::Error); for callers in a
// loop that checked their inputs once and catch themselves (GPTQ's columns).
at::Tensor ProcessQuantization(const at::Tensor& x, const QParams& q,
                               const QuantizationArgs& args,
                               std::optional<c10::ScalarType> dtype,
                               bool do_quantize, bool do_dequantize);
QParams CalculateQParams(const at::Tensor& min_vals, const at::Tensor& max_vals,
                         const QuantizationArgs& args,
                         const at::Tensor& global_scale);

}  // namespace internal

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_FAKE_QUANT_H_
