#ifndef TRACECUT_TRANSFORMS_ELIMINATE_DEAD_CODE_H_
#define TRACECUT_TRANSFORMS_ELIMINATE_DEAD_CODE_H_

// eliminate-dead-code: erases nodes whose value nobody reads and that have
// no side effects (purity.h), repeatedly, last node first, so chains of dead
// nodes go in one run (torch.fx's Graph.eliminate_dead_code).
//
// Before:                                   After:
//   %x = placeholder[x]()                     %x = placeholder[x]()
//   %w = get_attr[w]()                        %relu =
//   call_function[aten::relu](%x) %t = call_function[aten::t](%w) %output =
//   output[output](%relu) %relu = call_function[aten::relu](%x) %output =
//   output[output](%relu)
//
// Placeholders are kept (they are the signature). Not reversible: erased
// nodes are not recorded. Module attributes that become unreferenced stay.

#include "transforms/transformation.h"

namespace tracecut::transforms {

class EliminateDeadCode : public Transformation {
 public:
  static constexpr absl::string_view kName = "eliminate-dead-code";
  // With `modules_are_pure` false, dead call_module nodes are kept.
  explicit EliminateDeadCode(bool modules_are_pure = true)
      : modules_are_pure_(modules_are_pure) {}
  absl::string_view name() const override { return kName; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;

 private:
  bool modules_are_pure_;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_ELIMINATE_DEAD_CODE_H_
