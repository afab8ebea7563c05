#ifndef TRACECUT_TRANSFORMS_FOLD_CONSTANTS_H_
#define TRACECUT_TRANSFORMS_FOLD_CONSTANTS_H_

// fold-constants: evaluates pure operators whose operands are all constants
// (get_attr tensors and constant arguments) once, stores each result as a
// buffer `_folded_constant_<node>` on the root module and reads it with
// get_attr instead (torch.fx's const_fold).
//
// Before:
//   %w = get_attr[fc.weight]()
//   %t = call_function[aten::t](%w)
//   %mm = call_function[aten::mm](%x, %t)
// After:
//   %w = get_attr[fc.weight]()                       (now dead)
//   %t = get_attr[_folded_constant_t]()
//   %mm = call_function[aten::mm](%x, %t)
//
// Folds chains in one run. Skips impure and random operators (purity.h),
// results that are not a single tensor, and results over `max_bytes` (an
// expand of a small constant should stay an expand). With
// `fold_parameters` false, only buffers count as constants, so operators on
// parameters keep following later parameter updates (calibration).
// Results that alias an input are copied; nodes whose value an in-place
// operator downstream may write are not folded. Run eliminate-dead-code after
// it to drop the reads it leaves unused. Not reversible.

#include <cstdint>

#include "transforms/transformation.h"

namespace tracecut::transforms {

struct FoldConstantsOptions {
  bool fold_parameters = true;
  int64_t max_bytes = int64_t{64} << 20;
};

class FoldConstants : public Transformation {
 public:
  static constexpr absl::string_view kName = "fold-constants";
  explicit FoldConstants(FoldConstantsOptions options = {})
      : options_(options) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;

 private:
  FoldConstantsOptions options_;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_FOLD_CONSTANTS_H_
