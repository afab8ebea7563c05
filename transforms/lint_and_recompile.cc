#include "transforms/lint_and_recompile.h"

#include "ir/status_macros.h"
#include "transforms/pipeline.h"

namespace tracecut::transforms {

absl::StatusOr<bool> LintAndRecompile::Run(runtime::GraphModule& gm) {
  RETURN_IF_ERROR(VerifyGraph(gm));
  RETURN_IF_ERROR(CheckModuleReferences(gm));
  return false;
}

}  // namespace tracecut::transforms
