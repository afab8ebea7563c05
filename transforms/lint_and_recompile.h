#ifndef TRACECUT_TRANSFORMS_LINT_AND_RECOMPILE_H_
#define TRACECUT_TRANSFORMS_LINT_AND_RECOMPILE_H_

// lint-and-recompile: checks the GraphModule (the IR verifier and
// CheckModuleReferences, see pipeline.h), failing with the first problem,
// then lowers the graph back to TorchScript (runtime/lowering.h) and makes
// the result the GraphModule's module, so module().forward runs the current
// graph (Optimum's LintAndRecompile: graph.lint() + recompile()).
//
// The new module holds the same tensors under the same paths (fresh module
// objects and types), so the graph's targets still resolve and parameters
// are unchanged bit for bit. Reports "unchanged": the graph and what it
// computes are the same. Reverse does the same again.

#include "transforms/transformation.h"

namespace tracecut::transforms {

class LintAndRecompile : public ReversibleTransformation {
 public:
  static constexpr absl::string_view kName = "lint-and-recompile";
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override {
    return Run(gm);
  }
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_LINT_AND_RECOMPILE_H_
