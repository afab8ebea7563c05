#ifndef TRACECUT_QUANTIZATION_GPTQ_TYPED_H_
#define TRACECUT_QUANTIZATION_GPTQ_TYPED_H_

// GPTQ for every compressed-tensors weight scheme (int, float8, NVFP4, MXFP4;
// tensor, channel, group, tensor_group and block strategies), as
// llm-compressor 0.14's GPTQModifier runs it on the CPU
// (modifiers/gptq/gptq_quantize.py, eager backend):
//
//   ASSIGN_OR_RETURN(QParams q, WeightQParams(w, args));   // observers.h
//   ASSIGN_OR_RETURN(TypedGptqResult r, TypedGptq(w, hessian, q, args, {}));
//
// * The quantization parameters are fixed before any column is quantized:
//   the observer's, from the original weight (llm-compressor has only
//   "static" groups since compressed-tensors dropped actorder="group").
// * actorder "weight" / "static": columns in order of decreasing H_ii
//   (torch.argsort, descending), undone at the end.
// * Dead columns (H_ii == 0) get H_ii = 1 and zero weights; H += percdamp *
//   mean(diag H) * I; Hinv = upper Cholesky factor of H^-1; a Hessian that
//   is not positive definite falls back to Hinv = I (round-to-nearest) and
//   says so.
// * Each column is fake-quantized on its own per-row scale (the group's or
//   block's, divided by the global scale for tensor_group, as
//   column_scale_window does), in fp32; its error (w - q) / Hinv_ii updates
//   the rest of the block at once and later columns once per block.
// * Note [Output error from the errors]: with Hinv = U^T U and the errors
//   E (row r, column j: (w - q) / U_jj), W' - Q = E U, where W' is W with
//   the dead columns zeroed and H' the Hessian they factored (dead H_jj = 1,
//   damped by d). Since U H' U^T = I, tr((W' - Q) H' (W' - Q)^T) = |E|^2:
//   the output error GPTQ minimizes is known without a product. Undamped
//   and on the original W (dead columns have zero rows in H; Q is 0 there,
//   as W' is, since U has zeros off their diagonal): |E|^2 - d |W' - Q|^2,
//   per row, instead of an [out, in] x [in, in] product.
// The result is returned in the weight's dtype (llm-compressor's final cast),
// so it lies on the scheme's grid: FakeQuantize(result, q) == result.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "quantization/fake_quant.h"
#include "quantization/quant_args.h"

namespace tracecut::quantization {

struct TypedGptqOptions {
  double dampening_frac = 0.01;  // percdamp.
  int64_t block_size = 128;
  // Integer schemes on the CPU: the column loop row by row (same bits as
  // the tensor loop, several times faster); false runs the tensor loop.
  bool row_kernel = true;
};

struct TypedGptqResult {
  at::Tensor weight;      // [out, in], the input's dtype.
  double loss = 0;        // sum of error^2 / 2, as llm-compressor logs it.
  at::Tensor row_losses;  // fp32 [out]: each output row's share of `loss`.
  // fp64 [out]: each row's share of tr((W - Q) H (W - Q)^T), H undamped,
  // from GPTQ's own errors (Note [Output error from the errors]); undefined
  // when it fell back to round-to-nearest.
  at::Tensor row_output_errors;
  bool fell_back_to_rtn = false;
  std::string warning;
};

// What GPTQ derives from the Hessian alone (factorize_hessian after
// apply_activation_ordering): the same for every Linear that reads the same
// inputs, so they can share it (q/k/v, gate/up).
struct HessianFactor {
  at::Tensor perm;  // [1, in] column order (actorder), or undefined.
  at::Tensor dead;  // [1, in] bool, in that order: H_ii == 0.
  at::Tensor hinv;  // [1, in, in] upper Cholesky factor of H^-1, in order.
  double damp = 0;  // What was added to the diagonal.
  bool fell_back_to_rtn = false;  // Not positive definite: Hinv = I.
};
absl::StatusOr<HessianFactor> FactorizeHessian(const at::Tensor& hessian,
                                               ActOrder actorder,
                                               double dampening_frac);

// `weight` [out, in] with its parameters `q` (WeightQParams of the same
// weight) and the Hessian [in, in] of its inputs. InvalidArgument for
// shapes, NaN/Inf, or options out of range.
absl::StatusOr<TypedGptqResult> TypedGptq(const at::Tensor& weight,
                                          const at::Tensor& hessian,
                                          const QParams& q,
                                          const QuantizationArgs& args,
                                          const TypedGptqOptions& options);
// The same from the Hessian's factor (FactorizeHessian with args.actorder
// and options.dampening_frac).
absl::StatusOr<TypedGptqResult> TypedGptq(const at::Tensor& weight,
                                          const HessianFactor& factor,
                                          const QParams& q,
                                          const QuantizationArgs& args,
                                          const TypedGptqOptions& options);

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_GPTQ_TYPED_H_
