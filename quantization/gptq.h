#ifndef TRACECUT_QUANTIZATION_GPTQ_H_
#define TRACECUT_QUANTIZATION_GPTQ_H_

// GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for
// Generative Pre-trained Transformers", 2022) as pure functions on tensors:
// a Hessian accumulator fed with a layer's calibration inputs, and the
// column-by-column quantizer that spreads each column's rounding error over
// the columns not yet quantized, weighted by the inverse Hessian.
//
//   HessianAccumulator acc(/*columns=*/w.size(1));
//   for (const at::Tensor& x : layer_inputs) RETURN_IF_ERROR(acc.Add(x));
//   GptqOptions options;
//   options.scheme.bits = 4;
//   options.scheme.group_size = 128;
//   ASSIGN_OR_RETURN(GptqResult r, GptqQuantize(w, acc.hessian(), options));
//   if (r.fell_back_to_rtn) std::cerr << r.warning << "\n";
//
// Note [GPTQ in tracecut]
// -----------------------
// The procedure follows the published fasterquant:
// 1. Dead columns (H_ii == 0: the input feature is always zero) get H_ii = 1
//    and W[:, i] = 0.
// 2. act_order: columns are processed in order of decreasing H_ii (stable
//    sort, so ties keep their index order) and un-permuted at the end.
// 3. H += dampening_frac * mean(diag H) * I; Hinv = upper Cholesky factor of
//    H^-1 (Cholesky, cholesky_inverse, Cholesky again).
// 4. Columns are quantized one at a time inside blocks of `block_size`; the
//    error (w - q) / Hinv_ii updates the rest of the block at once and the
//    columns after the block lazily, with one matmul per block.
// 5. Per-tensor and per-channel parameters come from the weight before any
//    update (after step 1, so a dead column does not widen the range).
//    Group parameters are computed when the first column of a group is
//    reached, from the weights as updated by then (as the reference does).
//    Columns past the current block do not yet carry the block's pending
//    lazy update; with group_size dividing block_size (the default 128/128)
//    no group straddles a block and the parameters see every update.
// 6. act_order with groups: groups are runs of `group_size` consecutive
//    columns in the PERMUTED order (GPTQ-for-LLaMa / AutoGPTQ "desc_act",
//    llm-compressor actorder="group"). Scales and zero points are indexed by
//    that group number, and `g_idx[c]` gives the group of original column c,
//    so dequantization is w[:, c] = (q[:, c] - zp[:, g_idx[c]]) *
//    scale[:, g_idx[c]]. Without act_order or without groups g_idx is left
//    undefined (it would be the identity column / group_size).
// 7. loss = sum over columns of (w - q)^2 / Hinv_ii^2, halved, as the
//    reference reports it (its scale depends on how H was normalized).
// 8. static_groups: every group's parameters come from the weight before
//    any update (after step 1), for runs of `group_size` consecutive columns
//    in the ORIGINAL order, whatever order the columns are then quantized
//    in (AutoGPTQ static_groups, llm-compressor actorder="weight"). No
//    g_idx: the groups are the plain layout's, which compressed-tensors
//    (which has no actorder="group" any more) stores.
//
// When H is not positive definite even after damping (Cholesky fails), or
// has NaN / infinite entries, GPTQ falls back to round-to-nearest (Hinv = I:
// no error feedback; group parameters are then exactly RTN's) and says so
// in `warning` and `fell_back_to_rtn`; it does not fail.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "quantization/quantize.h"

namespace tracecut::quantization {

// Accumulates H = 2/n * sum_x x x^T in fp32 over a layer's inputs x (the
// rows of [..., columns] tensors), with the running-average update of the
// reference: before adding m new samples, H *= n / (n + m).
//
// n counts samples the way the reference does: a [batch, seq, columns]
// input adds `batch` samples (every leading dimension but the token
// dimension), a [tokens, columns] or [columns] input adds one. GPTQ's
// quantized weights do not depend on this normalization (damping is relative
// to mean(diag H)); the reported loss does, and matches the reference's.
// Tokens (rows x) are counted separately.
//
// Thread-compatible. The Hessian lives on the device of the first input.
//
// Note [Symmetric accumulation]
// H is symmetric, so on the CPU only its blocks on and above the diagonal
// are updated (x_i^T x_j for column blocks i <= j: 5/8 of the product's
// multiply-adds with 4 blocks, 9/16 with 8), each by the operations the
// whole matrix's update applies to it (the running average's rescaling,
// then addmm_); the blocks below the diagonal are copied from those above
// when the Hessian is read. Blocks are at least kMinSymmetricBlock columns
// wide, so the products keep their efficiency; a narrower Hessian is
// updated whole.
class HessianAccumulator {
 public:
  explicit HessianAccumulator(int64_t columns);

  // Data-parallel calibration (distributed.h): each rank accumulates the
  // plain sum S = sum_x x x^T of its inputs (no running mean, so partial
  // results add up exactly as sums do); the owner of the layer adds the
  // ranks' sums and takes H = 2/n * S once, with FromSum.
  static HessianAccumulator Summing(int64_t columns);
  static HessianAccumulator FromSum(at::Tensor sum, int64_t num_samples,
                                    int64_t num_tokens);
  bool summing() const { return summing_; }
  // A copy with its own matrix (a copy of the object shares it).
  HessianAccumulator Clone() const;

  // Adds inputs [..., columns] (any floating dtype, rank >= 1). Rejects a
  // wrong last dimension, non-floating dtypes and NaN / infinite entries.
  absl::Status Add(const at::Tensor& inputs);

  // fp32 [columns, columns]; all zeros before the first Add. S for a
  // Summing accumulator. (Completes the lower blocks first: Note
  // [Symmetric accumulation].)
  const at::Tensor& hessian() const;
  int64_t columns() const { return columns_; }
  int64_t num_samples() const { return num_samples_; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  int64_t columns_;
  int64_t num_samples_ = 0;
  int64_t num_tokens_ = 0;
  bool summing_ = false;
  // Mutable: hessian() fills the lower blocks the updates leave stale.
  mutable at::Tensor hessian_;
  mutable bool lower_stale_ = false;
};

// tr(x H x^T) for x [rows, n] and a symmetric H [n, n] (a Hessian): the
// output energy of weights x, or of a weight error. The products of Note
// [Symmetric accumulation]'s blocks on and above the diagonal only (those
// above counted twice): 9/16 of [rows, n] x [n, n]'s work for 8 blocks.
// fp32 products, summed in fp64 across blocks.
absl::StatusOr<double> SymmetricQuadraticForm(const at::Tensor& x,
                                              const at::Tensor& h);

struct GptqOptions {
  QuantScheme scheme;
  double dampening_frac = 0.01;  // percdamp; >= 0.
  int64_t block_size = 128;      // > 0.
  bool act_order = false;
  // Note [GPTQ in tracecut] 8.
  bool static_groups = false;
};

struct GptqResult {
  at::Tensor weight;             // Fake-quantized [out, in], the input's dtype.
  at::Tensor scale;              // fp32 [out or 1, num_groups].
  at::Tensor zero_point;         // int32, same shape as scale.
  at::Tensor g_idx;              // int32 [in] with act_order and groups; else
                                 // undefined (see Note [GPTQ in tracecut] 6).
  double loss = 0;               // Note [GPTQ in tracecut] 7.
  int64_t num_dead_columns = 0;  // Columns with H_ii == 0, zeroed.
  bool fell_back_to_rtn = false;
  std::string warning;  // Empty unless something was worked around.
};

// GPTQ-quantizes `weight` [out, in] (fp32, fp16, bf16 or fp64) given the
// Hessian [in, in] of its inputs (any floating dtype; used in fp32).
// InvalidArgument for bad shapes, dtypes, options or non-finite weights.
absl::StatusOr<GptqResult> GptqQuantize(const at::Tensor& weight,
                                        const at::Tensor& hessian,
                                        const GptqOptions& options);

// Fake-quantizes result.weight again with the result's own scales, zero
// points and g_idx, in fp32. Equal to result.weight (after a cast to its
// dtype) when the parameters are consistent with the weights: a check for
// tests and exporters.
absl::StatusOr<at::Tensor> GptqRequantize(const GptqResult& result,
                                          const QuantScheme& scheme);

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_GPTQ_H_
