#ifndef TRACECUT_QUANTIZATION_QUANTIZE_H_
#define TRACECUT_QUANTIZATION_QUANTIZE_H_

// Integer weight quantization: schemes, min-max quantization parameters and
// round-to-nearest (RTN) quantize / dequantize / fake-quantize of a 2-D
// weight [out, in]. Pure functions; GPTQ (gptq.h) builds on them.
//
//   QuantScheme scheme;
//   scheme.bits = 4;
//   scheme.group_size = 128;
//   ASSIGN_OR_RETURN(QuantParams params, ComputeQuantParams(w, scheme));
//   ASSIGN_OR_RETURN(at::Tensor w_q, FakeQuantize(w, params, scheme));
//
// Note [Quantization convention]
// ------------------------------
// * Integer codes are signed: q in [qmin, qmax] = [-2^(b-1), 2^(b-1) - 1] for
//   both symmetric and asymmetric schemes (int8 storage for every b <= 8).
// * Granularity: per-tensor (one scale), per-channel (one scale per output
//   row, group_size == -1) or grouped (one scale per row and per run of
//   `group_size` consecutive input columns; a trailing partial group is
//   allowed). Parameters have shape [rows, num_groups]: [1, 1] per-tensor,
//   [rows, 1] per-channel, [rows, ceil(in / group_size)] grouped.
// * Symmetric: scale = max|w| / qmax, zero_point = 0. The code qmin is never
//   produced by a weight inside the observed range (|w| / scale <= qmax), so
//   the grid is symmetric around 0 (e.g. int4: -7..7).
// * Asymmetric: lo = min(min w, 0), hi = max(max w, 0) (the range always
//   contains 0, so 0 is exactly representable); scale = (hi - lo) /
//   (qmax - qmin); zero_point = clamp(round(qmin - lo / scale), qmin, qmax).
// * Zero scale guard: a range of zero width (an all-zero row or group) gets
//   scale = 1 and zero_point = 0, so every such weight quantizes to 0 exactly.
// * Quantize: q = clamp(round(w / scale) + zero_point, qmin, qmax), with
//   round = round-half-to-even (torch.round). Dequantize: (q - zero_point) *
//   scale. Fake-quantize = Dequantize(Quantize(w)).
// * Arithmetic is fp32 whatever the weight's dtype. Scales are returned as
//   fp32 and zero points as int32; fake-quantized weights come back in the
//   weight's dtype (fp32, fp16, bf16 or fp64).
// * Weights with NaN or infinite entries are rejected (InvalidArgument).
//
// All functions catch LibTorch exceptions and return them as absl::Status;
// the ones in `internal` do not (they are building blocks for callers that
// catch themselves).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::quantization {

struct QuantScheme {
  int bits = 8;             // 2..8.
  bool symmetric = true;    // false: asymmetric (min-max with a zero point).
  int64_t group_size = -1;  // -1: per-channel; > 0: columns per group.
  bool per_tensor = false;  // One scale for the whole weight (needs -1 above).

  int64_t qmin() const { return -(int64_t{1} << (bits - 1)); }
  int64_t qmax() const { return (int64_t{1} << (bits - 1)) - 1; }

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
  // Short description: "int4 sym g128", "int8 asym per-channel",
  // "int8 sym per-tensor".
  std::string ToString() const;
  // The scheme ToString describes; InvalidArgument for anything else.
  static absl::StatusOr<QuantScheme> Parse(absl::string_view text);
};

// Quantization parameters of one weight (see Note [Quantization convention]).
struct QuantParams {
  at::Tensor scale;       // fp32 [rows or 1, num_groups].
  at::Tensor zero_point;  // int32, same shape as scale.
};

// Number of parameter columns for a weight with `columns` input columns.
int64_t NumGroups(const QuantScheme& scheme, int64_t columns);

// Min-max parameters of a 2-D weight [out, in], computed in fp32.
absl::StatusOr<QuantParams> ComputeQuantParams(const at::Tensor& weight,
                                               const QuantScheme& scheme);

// Integer codes (int8, [out, in]) of `weight` under `params`.
absl::StatusOr<at::Tensor> Quantize(const at::Tensor& weight,
                                    const QuantParams& params,
                                    const QuantScheme& scheme);

// Real values of int codes [out, in], in `dtype`.
absl::StatusOr<at::Tensor> Dequantize(const at::Tensor& codes,
                                      const QuantParams& params,
                                      const QuantScheme& scheme,
                                      at::ScalarType dtype);

// Dequantize(Quantize(weight)), in the weight's dtype.
absl::StatusOr<at::Tensor> FakeQuantize(const at::Tensor& weight,
                                        const QuantParams& params,
                                        const QuantScheme& scheme);

// Round-to-nearest quantization of a weight: parameters from its own
// min-max, then fake-quantization.
struct RtnResult {
  at::Tensor weight;  // Fake-quantized, the input's dtype.
  QuantParams params;
};
absl::StatusOr<RtnResult> QuantizeRtn(const at::Tensor& weight,
                                      const QuantScheme& scheme);

namespace internal {

// Building blocks. They throw c10::Error on misuse; callers catch.

// Parameters of fp32 `w` [rows, cols] treated as ONE group per row (or one
// for the whole tensor when `per_tensor`): scale fp32 [rows, 1] (or [1, 1]),
// zero point int32 of the same shape.
QuantParams MinMaxParams(const at::Tensor& w, const QuantScheme& scheme,
                         bool per_tensor);

// Fake-quantizes fp32 `w` with broadcastable fp32 `scale` and int32 or fp32
// `zero_point`; the result is fp32.
at::Tensor FakeQuantizeFp32(const at::Tensor& w, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t qmin,
                            int64_t qmax);

// Expands [rows, num_groups] parameters to [rows, columns] (per column).
at::Tensor ExpandToColumns(const at::Tensor& param, const QuantScheme& scheme,
                           int64_t rows, int64_t columns);

// OK for a defined, non-empty, finite, floating-point 2-D tensor; otherwise
// InvalidArgument naming `what` ("weight").
absl::Status CheckWeight(const at::Tensor& weight, absl::string_view what);

// "float32[4, 8]"-style description for error messages.
std::string DescribeTensor(const at::Tensor& t);

}  // namespace internal

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_QUANTIZE_H_
