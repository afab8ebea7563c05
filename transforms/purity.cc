#include "transforms/purity.h"

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

namespace tracecut::transforms {
namespace {

// "aten::add_.Tensor" -> {"aten", "add_", "Tensor"}.
struct OpName {
  absl::string_view ns, name, overload;
};

OpName Split(absl::string_view target) {
  OpName op;
  const size_t colons = target.find("::");
  if (colons != absl::string_view::npos) {
    op.ns = target.substr(0, colons);
    target.remove_prefix(colons + 2);
  }
  const size_t dot = target.find('.');
  op.name = target.substr(0, dot);
  if (dot != absl::string_view::npos) op.overload = target.substr(dot + 1);
  return op;
}

}  // namespace

bool IsRandomOperator(absl::string_view target) {
  const OpName op = Split(target);
  for (absl::string_view prefix :
       {"rand", "bernoulli", "normal", "multinomial", "poisson", "dropout",
        "feature_dropout", "alpha_dropout", "feature_alpha_dropout", "rrelu",
        "uniform", "exponential", "geometric", "cauchy", "log_normal",
        "native_dropout"}) {
    if (absl::StartsWith(op.name, prefix)) return true;
  }
  return false;
}

bool IsImpureOperator(absl::string_view target) {
  const OpName op = Split(target);
  if (absl::EndsWith(op.name, "_") && !absl::StartsWith(op.name, "__")) {
    return true;  // In place.
  }
  if (op.overload == "out" || absl::EndsWith(op.overload, "_out")) return true;
  if (op.ns == "prim") {
    return op.name == "RaiseException" || op.name == "Print" ||
           op.name == "SetAttr" || op.name == "Uninitialized";
  }
  if (op.ns == "aten") {
    for (absl::string_view name :
         {"warn", "manual_seed", "seed", "set_grad_enabled", "copy_",
          "_assert_async", "record_stream", "backward", "set_", "append",
          "insert", "pop", "clear", "_set_item", "__setitem__"}) {
      if (op.name == name) return true;
    }
  }
  return IsRandomOperator(target);
}

bool IsPureNode(const ir::Node& node, bool modules_are_pure) {
  switch (node.op()) {
    case ir::OpKind::kPlaceholder:
    case ir::OpKind::kOutput:
      return false;
    case ir::OpKind::kGetAttr:
      return true;
    case ir::OpKind::kCallModule:
      return modules_are_pure;
    case ir::OpKind::kCallMethod:
      return !absl::EndsWith(node.target(), "_") ||
             absl::StartsWith(node.target(), "__");
    case ir::OpKind::kCallFunction:
      return node.target() == "getitem" || !IsImpureOperator(node.target());
  }
  return false;
}

}  // namespace tracecut::transforms
