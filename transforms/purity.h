#ifndef TRACECUT_TRANSFORMS_PURITY_H_
#define TRACECUT_TRANSFORMS_PURITY_H_

// Which nodes have effects beyond their output value, for dead-code
// elimination and constant folding. No LibTorch here.
//
// Impure: placeholders and the output; in-place and out= operators (name
// ending in '_' before the overload, or an "out" overload); operators that
// write state, print, raise or draw random numbers (removing or folding
// those changes the random stream); call_method of in-place methods.
// call_module is pure unless `modules_are_pure` is false (a training-mode
// BatchNorm updates its running statistics, for example).

#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::transforms {

// Whether an operator (call_function target) has side effects or draws
// random numbers.
bool IsImpureOperator(absl::string_view target);

bool IsPureNode(const ir::Node& node, bool modules_are_pure = true);

// Whether an operator is nondeterministic (random) even without side
// effects visible in the graph.
bool IsRandomOperator(absl::string_view target);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_PURITY_H_
