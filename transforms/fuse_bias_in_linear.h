#ifndef TRACECUT_TRANSFORMS_FUSE_BIAS_IN_LINEAR_H_
#define TRACECUT_TRANSFORMS_FUSE_BIAS_IN_LINEAR_H_

// fuse-bias-in-linear: a Linear with a bias becomes a bias-free Linear on
// the input padded with a column of ones (Optimum's FuseBiasInLinear), so
// y = [W | b] [x; 1]. Useful where a backend only runs bias-free GEMMs.
//
// Before:
//   %fc = call_module[fc](%x)                       Linear(I -> O, bias)
// After:
//   %constant_pad_nd = call_function[aten::constant_pad_nd](%x, [0, 1], 1.0)
//   %fc = call_module[fc_bias_fused](%constant_pad_nd)   Linear(I+1 -> O)
//
// Applies to torch.nn Linear call sites with a bias and one positional
// operand; each call site gets its own fused module (registered next to the
// original, which stays untouched so Reverse is exact). Not worth running
// for CPU inference: the padded copy of the input costs more than the bias
// add it saves.
//
// Computation: the bias is added inside the dot product instead of after
// it, which changes rounding only (tested within 1e-5 relative, fp32).

#include "transforms/transformation.h"

namespace tracecut::transforms {

class FuseBiasInLinear : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "fuse-bias-in-linear";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_FUSE_BIAS_IN_LINEAR_H_
