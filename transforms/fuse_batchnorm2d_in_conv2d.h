#ifndef TRACECUT_TRANSFORMS_FUSE_BATCHNORM2D_IN_CONV2D_H_
#define TRACECUT_TRANSFORMS_FUSE_BATCHNORM2D_IN_CONV2D_H_

// fuse-batchnorm2d-in-conv2d: an inference-mode BatchNorm2d right after a
// Conv2d is folded into the convolution (Optimum's FuseBatchNorm2dInConv2d,
// TorchScript's FoldConvBatchNorm).
//
// Before:
//   %conv1 = call_module[conv1](%x)
//   %bn1 = call_module[bn1](%conv1)
//   %relu = call_function[aten::relu](%bn1)
// After:
//   %conv1 = call_module[conv1_bn1_fused](%x)
//   %relu = call_function[aten::relu](%conv1)
//
// Arithmetic: Note [BatchNorm folding] in fusion_math.h, with the correct
// bias (b - mu) * gamma / sqrt(var + eps) + beta, b = 0 for a conv without
// bias, gamma = 1 and beta = 0 for affine=False; computed in float64 and
// stored in the conv weight's dtype and device.
//
// Preconditions: the BatchNorm reads the conv's output as its only operand
// and nothing else reads the conv's output; the BatchNorm is in inference
// mode with running statistics; the conv uses zero padding and integer
// padding, is not transposed, and has as many output channels as the
// BatchNorm has features. Call sites that do not qualify are left alone.
//
// Each fused pair gets a new Conv2d module next to the conv; the original
// conv and BatchNorm modules stay registered and untouched, so Reverse is
// exact.

#include "transforms/transformation.h"

namespace tracecut::transforms {

class FuseBatchNorm2dInConv2d : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "fuse-batchnorm2d-in-conv2d";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_FUSE_BATCHNORM2D_IN_CONV2D_H_
