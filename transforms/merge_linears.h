#ifndef TRACECUT_TRANSFORMS_MERGE_LINEARS_H_
#define TRACECUT_TRANSFORMS_MERGE_LINEARS_H_

// merge-linears: parallel Linear (or Hugging Face Conv1D) layers reading the
// same value become one wider layer whose output is split back (Optimum's
// MergeLinears; typical for attention q/k/v and MLP gate/up projections).
//
// Before:
//   %q = call_module[attn.q_proj](%h)     Linear(64 -> 64, bias)
//   %k = call_module[attn.k_proj](%h)     Linear(64 -> 16, no bias)
// After:
//   %q_proj_k_proj_merged = call_module[attn.q_proj_k_proj_merged](%h)
//   %split_with_sizes = call_function[aten::split_with_sizes](
//       %q_proj_k_proj_merged, [64, 16], -1)
//   %q = call_function[getitem](%split_with_sizes, 0)
//   %k = call_function[getitem](%split_with_sizes, 1)
//
// Preconditions, per group: at least two layers of the same kind reading the
// same node as their only operand, each module called from exactly one
// place in the graph, with equal in_features, dtype and device. Output sizes
// may differ. The merged module (registered next to the first layer, typed
// torch.nn Linear or like the Conv1D it replaces) has a bias only when some
// layer had one, zeros standing in for the others, in the layers' dtype and
// device.
//
// The original modules stay registered (unreferenced) and untouched, so
// Reverse restores the graph and every parameter bit for bit; their memory
// stays allocated in the transformed copy.
//
// Computation: each output slice is the same dot products as before; the
// wider GEMM may block/accumulate differently, so results can differ in the
// last bits (tested within 1e-5 relative, fp32).

#include "transforms/transformation.h"

namespace tracecut::transforms {

class MergeLinears : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "merge-linears";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_MERGE_LINEARS_H_
