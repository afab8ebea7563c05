#include "transforms/lint_and_recompile.h"

#include <memory>
#include <utility>

#include "runtime/lowering.h"
#include "transforms/pass_pipeline.h"
#include "util/status_macros.h"

namespace tracecut::transforms {

absl::StatusOr<bool> LintAndRecompile::Run(runtime::GraphModule& gm) {
  RETURN_IF_ERROR(VerifyGraph(gm));
  RETURN_IF_ERROR(CheckModuleReferences(gm));
  ASSIGN_OR_RETURN(torch::jit::Module lowered, runtime::LowerToTorchScript(gm));
  runtime::GraphModule recompiled(std::move(lowered), gm.graph().Clone());
  recompiled.mutable_extra_files() = gm.extra_files();
  gm = std::move(recompiled);
  return false;
}

}  // namespace tracecut::transforms
