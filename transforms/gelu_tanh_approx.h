#ifndef TRACECUT_TRANSFORMS_GELU_TANH_APPROX_H_
#define TRACECUT_TRANSFORMS_GELU_TANH_APPROX_H_

// gelu-tanh-approx: exact (erf) GELU becomes its tanh approximation.
// Deliberately NOT computation-preserving (preserves_computation() is
// false): the two differ by up to about 5e-4 absolute per element. It exists
// to show what the layer-by-layer debugger (debugger.h) reports for a pass
// that changes numbers, and for models meant to run the tanh form.
//
// Before:  %gelu = call_function[aten::gelu](%x, "none")
// After:   %gelu = call_function[aten::gelu](%x, "tanh")
//
// Reverse restores the original nodes.

#include "transforms/transformation.h"

namespace tracecut::transforms {

class GeluTanhApprox : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "gelu-tanh-approx";
  absl::string_view name() const override { return kName; }
  bool preserves_computation() const override { return false; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_GELU_TANH_APPROX_H_
