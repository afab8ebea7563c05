#ifndef TRACECUT_TRANSFORMS_FUSE_BATCHNORM1D_IN_LINEAR_H_
#define TRACECUT_TRANSFORMS_FUSE_BATCHNORM1D_IN_LINEAR_H_

// fuse-batchnorm1d-in-linear: an inference-mode BatchNorm1d right after or
// right before a torch.nn Linear is folded into the Linear (Optimum's
// FuseBatchNorm1dInLinear).
//
// Linear -> BatchNorm1d:            BatchNorm1d -> Linear:
//   %fc1 = call_module[fc1](%x)       %bn2 = call_module[bn2](%h)
//   %bn1 = call_module[bn1](%fc1)     %fc2 = call_module[fc2](%bn2)
// becomes                           becomes
//   %fc1 = call_module[fc1_bn1_fused](%x)
//                                     %fc2 = call_module[fc2_bn2_fused](%h)
//
// Arithmetic: Note [BatchNorm folding] in fusion_math.h (computed in
// float64, stored in the Linear weight's dtype).
//
// Shapes decide legality, from meta.outputs: BatchNorm1d normalises dim 1.
// On a 2-D value [N, C] that is the Linear's feature dimension and folding
// is exact. On a 3-D value [N, C, L] it is not (the Linear acts on L), so
// the pair is left alone even when C happens to equal the Linear's feature
// count; so is a pair whose shared value has no known rank.
//
// Also required: the two calls feed only each other; the BatchNorm is in
// inference mode with running statistics; feature counts match. The fused
// Linear always has a bias. Originals stay registered and untouched, so
// Reverse is exact.

#include "transforms/transformation.h"

namespace tracecut::transforms {

class FuseBatchNorm1dInLinear : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "fuse-batchnorm1d-in-linear";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_FUSE_BATCHNORM1D_IN_LINEAR_H_
