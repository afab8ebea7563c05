#ifndef TRACECUT_TRANSFORMS_LINT_AND_RECOMPILE_H_
#define TRACECUT_TRANSFORMS_LINT_AND_RECOMPILE_H_

// lint-and-recompile: checks the GraphModule (the IR verifier and
// CheckModuleReferences, see pipeline.h) and fails with the first problem
// (Optimum's LintAndRecompile: graph.lint() + recompile()). Changes nothing
// and reports "unchanged"; Reverse does the same checks.

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
