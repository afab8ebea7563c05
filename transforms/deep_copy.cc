#include "transforms/deep_copy.h"

#include "util/status_macros.h"

namespace tracecut::transforms {

absl::StatusOr<bool> DeepCopy::Run(runtime::GraphModule& gm) {
  ASSIGN_OR_RETURN(runtime::GraphModule copy, gm.Clone());
  gm = std::move(copy);
  return false;
}

}  // namespace tracecut::transforms
