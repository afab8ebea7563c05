#ifndef TRACECUT_TRANSFORMS_FUSION_MATH_H_
#define TRACECUT_TRANSFORMS_FUSION_MATH_H_

// The arithmetic of every fusion pass, as pure functions of tensors (no
// graphs, no modules), so that each formula is unit-tested on its own. See
// Note [BatchNorm folding] and Note [Compute in fp64, store in model dtype].
//
//   ASSIGN_OR_RETURN(WeightAndBias fused,
//                    FoldBatchNormIntoPreceding(conv_w, conv_b, bn));
//
// Every function validates shapes, dtypes and devices and returns an
// InvalidArgument error (never throws) when they do not fit.

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tracecut::transforms::fusion_math {

// Inference-mode BatchNorm statistics. `weight` (gamma) and `bias` (beta) are
// absent when the BatchNorm was built with affine=False: then gamma = 1 and
// beta = 0 (not 1).
struct BatchNormParams {
  at::Tensor running_mean;  // [C]
  at::Tensor running_var;   // [C]
  std::optional<at::Tensor> weight;
  std::optional<at::Tensor> bias;
  double eps = 1e-5;
};

// A weight and an optional bias, as a Linear / Conv holds them.
struct WeightAndBias {
  at::Tensor weight;
  std::optional<at::Tensor> bias;
};

// Note [BatchNorm folding]
// In inference, BatchNorm is the per-channel affine map
//   bn(y) = (y - mu) * s + beta,   s = gamma / sqrt(var + eps).
// Folded into a preceding Conv/Linear y = W x + b (output channel c on
// `out_dim` of W):
//   W'[c] = W[c] * s[c]
//   b'[c] = (b[c] - mu[c]) * s[c] + beta[c]
// with b = 0 when the conv/linear had no bias, gamma = 1 and beta = 0 when
// the BatchNorm is affine=False. (Optimum computes b - mu*s + beta, which is
// wrong whenever b != 0, and takes beta = 1 for affine=False.)
// Folded into a following Linear z = V bn(x) + c (features on dim 1 of V):
//   V'[:, j] = V[:, j] * s[j]
//   c'       = c + V (beta - mu * s)
// The result always has a bias.
//
// Note [Compute in fp64, store in model dtype]
// Folded parameters are computed in float64 (complex dtypes are rejected)
// and cast back to the dtype and device of the original weight, so an fp16 or
// bf16 model stays fp16/bf16 and its fused weights are the correctly rounded
// values of the exact products.

// Folds `bn` into the preceding weight/bias whose output channels lie on
// `out_dim` of `weight` (0 for Conv2d [O, I/g, kH, kW] and Linear [O, I]).
absl::StatusOr<WeightAndBias> FoldBatchNormIntoPreceding(
    const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const BatchNormParams& bn, int64_t out_dim = 0);

// Folds `bn` into the following Linear (weight [O, I], BatchNorm over I).
absl::StatusOr<WeightAndBias> FoldBatchNormIntoFollowingLinear(
    const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const BatchNormParams& bn);

// Concatenates parallel linear layers along their output dimension
// (`out_dim` 0 for nn.Linear weights [O, I], 1 for Hugging Face Conv1D
// weights [I, O]). The merged bias exists only when at least one part has
// one; parts without a bias contribute zeros of the weight's dtype/device.
// Every part must share in_features, dtype and device. Concatenation copies
// values, so slicing the result gives back each part bit for bit.
absl::StatusOr<WeightAndBias> ConcatLinears(
    absl::Span<const WeightAndBias> parts, int64_t out_dim = 0);

// The sizes of `parts` along `out_dim` (what split_with_sizes needs).
std::vector<int64_t> OutFeatures(absl::Span<const WeightAndBias> parts,
                                 int64_t out_dim = 0);

// Linear with bias -> bias-free linear on [x, 1]: W' = [W | b] (shape
// [O, I + 1]), so that W' [x; 1] = W x + b. Requires a 1-D bias of O
// elements in W's dtype and device.
absl::StatusOr<at::Tensor> AppendBiasColumn(const at::Tensor& weight,
                                            const at::Tensor& bias);
// The inverse, exact: {W'[:, :-1], W'[:, -1]} (copies).
absl::StatusOr<WeightAndBias> SplitBiasColumn(const at::Tensor& fused);

// Division by a constant as multiplication by its reciprocal.
//
// x / d == x * (1/d) bit for bit exactly when 1/d is representable, i.e. d is
// a power of two whose reciprocal is a normal number of the dtype the
// product is computed in (both sides are then correctly rounded values of the
// same real number). `ExactReciprocal` returns 1/d in that case and nullopt
// otherwise. `max_exponent` bounds |log2 d|: 14 keeps 2^k and 2^-k normal in
// float16, 126 in float32/bfloat16, 1022 in float64.
std::optional<double> ExactReciprocal(double d, int max_exponent = 14);
// The largest |log2 d| that keeps reciprocals exact for a dtype.
int MaxExactExponent(at::ScalarType dtype);
// Elementwise reciprocal of a floating-point tensor, in its own dtype;
// nullopt unless every element is a power of two within MaxExactExponent.
std::optional<at::Tensor> ExactReciprocalTensor(const at::Tensor& divisor);

// Exact bitwise equality of two tensors: same dtype, shape and bytes (so NaN
// payloads and -0.0 count). What "restored bit for bit" means.
bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b);

// Errors of `actual` against `expected`, computed in float64: max_abs is
// max |a - b|; max_rel is max_abs / max |b| (relative to the largest expected
// magnitude, so values near zero do not blow it up; 0 when both are all
// zero). Non-finite differences give +inf. Shapes must match (else +inf).
struct ErrorStats {
  double max_abs = 0;
  double max_rel = 0;
};
ErrorStats CompareTensors(const at::Tensor& actual, const at::Tensor& expected);

}  // namespace tracecut::transforms::fusion_math

#endif  // TRACECUT_TRANSFORMS_FUSION_MATH_H_
