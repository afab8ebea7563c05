#ifndef TRACECUT_TRANSFORMS_CHANGE_TRUEDIV_TO_MUL_BY_INVERSE_H_
#define TRACECUT_TRANSFORMS_CHANGE_TRUEDIV_TO_MUL_BY_INVERSE_H_

// change-truediv-to-mul-by-inverse: division by a constant becomes
// multiplication by its reciprocal (Optimum's ChangeTrueDivToMulByInverse),
// e.g. the 1/sqrt(head_dim) scaling of attention scores.
//
// Before:
//   %div = call_function[aten::div.Scalar](%scores, 8.0)
//   %div_1 = call_function[aten::div.Tensor](%x, %_tensor_constant0)
// After:
//   %div = call_function[aten::mul.Scalar](%scores, 0.125)
//   %_tensor_constant0_reciprocal = get_attr[_tensor_constant0_reciprocal]()
//   %div_1 = call_function[aten::mul.Tensor](%x, %_tensor_constant0_reciprocal)
//
// Divisors: a constant int/double operand, or a get_attr tensor (the traced
// form of `x / 8.0`: a lifted _tensor_constant). The rounding mode variant
// (div.Tensor_mode) is never touched.
//
// Exactness (Note [Exact reciprocals] in fusion_math.h): x / d == x * (1/d)
// bit for bit when every divisor is a power of two whose reciprocal is a
// normal number of the dtype the product is computed in. By default only
// such divisors are rewritten and the pass preserves computation exactly.
// With allow_inexact, every constant divisor is rewritten; 1/d is then
// rounded and results may differ in the last bit, so preserves_computation()
// is false.
//
// Reverse restores the original nodes and removes the reciprocal buffers.

#include "transforms/transformation.h"

namespace tracecut::transforms {

class ChangeTrueDivToMulByInverse : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "change-truediv-to-mul-by-inverse";
  explicit ChangeTrueDivToMulByInverse(bool allow_inexact = false)
      : allow_inexact_(allow_inexact) {}

  absl::string_view name() const override { return kName; }
  bool preserves_computation() const override { return !allow_inexact_; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override;

 private:
  bool allow_inexact_;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_CHANGE_TRUEDIV_TO_MUL_BY_INVERSE_H_
