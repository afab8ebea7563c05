// Plan::Execute: running a planned graph, node by node, with hooks.

#include <ATen/core/function.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "runtime/interpreter.h"
#include "runtime/interpreter_internal.h"
#include "runtime/op_schema.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

using internal::NodePlan;
using internal::Operand;
using internal::ShortTypeName;
using internal::Step;

// Runtime state of one Execute.
struct Frame {
  std::vector<c10::IValue> env;
  torch::jit::Stack stack;
  std::vector<c10::IValue> hook_inputs;
};

c10::IValue Materialize(const Operand& o, std::vector<c10::IValue>& env);

c10::IValue MaterializeList(const Operand& o, std::vector<c10::IValue>& env) {
  if (o.element_type != nullptr) {
    c10::impl::GenericList list(o.element_type);
    list.reserve(o.elements.size());
    for (const Operand& e : o.elements) list.push_back(Materialize(e, env));
    return list;
  }
  std::vector<c10::IValue> values;
  values.reserve(o.elements.size());
  for (const Operand& e : o.elements) values.push_back(Materialize(e, env));
  absl::StatusOr<c10::TypePtr> type = UnifiedElementType(values);
  TORCH_CHECK(type.ok(), std::string(type.status().message()));
  c10::impl::GenericList list(*type);
  list.reserve(values.size());
  for (c10::IValue& v : values) list.push_back(std::move(v));
  return list;
}

c10::IValue Materialize(const Operand& o, std::vector<c10::IValue>& env) {
  switch (o.kind) {
    case Operand::Kind::kConstant:
      return o.constant;
    case Operand::Kind::kValue:
      return o.move ? std::move(env[o.slot]) : env[o.slot];
    case Operand::Kind::kList:
      return MaterializeList(o, env);
    case Operand::Kind::kTuple: {
      std::vector<c10::IValue> values;
      values.reserve(o.elements.size());
      for (const Operand& e : o.elements) values.push_back(Materialize(e, env));
      return c10::ivalue::Tuple::create(std::move(values));
    }
  }
  return c10::IValue();
}

c10::IValue WalkSlots(const c10::IValue& root,
                      const std::vector<size_t>& slots) {
  const c10::IValue* v = &root;
  for (size_t s : slots) v = &v->toObjectRef().getSlot(s);
  return *v;
}

absl::StatusOr<c10::IValue> GetItem(const NodePlan& p,
                                    const c10::IValue& container,
                                    const c10::IValue& index) {
  auto bad_index = [&](int64_t i, size_t size) {
    return absl::OutOfRangeError(absl::StrCat(p.node->Describe(), ": index ", i,
                                              " out of range for size ", size));
  };
  if (container.isGenericDict()) {
    const c10::Dict<c10::IValue, c10::IValue> dict = container.toGenericDict();
    auto it = dict.find(index);
    if (it == dict.end()) {
      return absl::NotFoundError(absl::StrCat(p.node->Describe(), ": key ",
                                              c10::str(index), " not found"));
    }
    return it->value();
  }
  if (!index.isInt()) {
    return absl::InvalidArgumentError(
        absl::StrCat(p.node->Describe(), ": getitem index is a ",
                     index.type()->repr_str(), ", not an int"));
  }
  int64_t i = index.toInt();
  if (container.isTuple()) {
    const auto& elems = container.toTupleRef().elements();
    const int64_t n = static_cast<int64_t>(elems.size());
    if (i < -n || i >= n) return bad_index(i, elems.size());
    return elems[i < 0 ? i + n : i];
  }
  if (container.isList()) {
    c10::ArrayRef<c10::IValue> elems = container.toListRef();
    const int64_t n = static_cast<int64_t>(elems.size());
    if (i < -n || i >= n) return bad_index(i, elems.size());
    return elems[i < 0 ? i + n : i];
  }
  return absl::InvalidArgumentError(absl::StrCat(
      p.node->Describe(), ": getitem on a ", container.type()->repr_str(),
      " (expected a tuple, list or dict)"));
}

// The result of an operator from what it left on the stack.
c10::IValue TakeResult(const NodePlan& p, torch::jit::Stack& stack) {
  if (stack.size() == 1 && (p.num_returns == 1 || p.var_returns)) {
    c10::IValue v = std::move(stack.back());
    stack.clear();
    return v;
  }
  if (stack.empty()) return c10::IValue();
  c10::IValue v = c10::ivalue::Tuple::create(std::move(stack));
  stack.clear();
  return v;
}

using NodeHooks = std::vector<std::pair<Interpreter::HookId, NodeHook>>;
using ModuleHooks = std::vector<std::pair<Interpreter::HookId, ModuleHook>>;

void FireNode(const NodeHooks& hooks, const NodePlan& p,
              absl::Span<const c10::IValue> in, const c10::IValue* out) {
  for (const auto& [id, hook] : hooks) hook(*p.node, in, out);
}

// A call_module step: the submodule's forward between the node hooks and
// the module hooks (which see the module object). Throws as LibTorch does.
c10::IValue CallModule(const NodePlan& p, const c10::IValue& root_value,
                       const NodeHooks& node_hooks,
                       const ModuleHooks& module_hooks, Frame& f) {
  c10::IValue module = WalkSlots(root_value, p.attr_slots);
  const c10::ClassType* type = module.toObjectRef().type().get();
  torch::jit::Function* forward =
      type == p.module_type ? p.forward : type->findMethod("forward");
  TORCH_CHECK(forward != nullptr, "module has no forward method");
  f.stack.clear();
  f.stack.push_back(module);
  for (const Operand& o : p.operands) {
    f.stack.push_back(Materialize(o, f.env));
  }
  const bool node_hooked = !node_hooks.empty();
  const bool module_hooked = !module_hooks.empty();
  std::optional<torch::jit::Module> hooked_module;
  if (node_hooked || module_hooked) {
    f.hook_inputs.assign(f.stack.begin() + 1, f.stack.end());
    if (node_hooked) FireNode(node_hooks, p, f.hook_inputs, nullptr);
    if (module_hooked) {
      hooked_module.emplace(module.toObject());
      for (const auto& [id, hook] : module_hooks) {
        hook(*p.node, *hooked_module, f.hook_inputs, nullptr);
      }
    }
  }
  forward->run(f.stack);
  c10::IValue out = std::move(f.stack.back());
  f.stack.clear();
  if (module_hooked) {
    for (const auto& [id, hook] : module_hooks) {
      hook(*p.node, *hooked_module, f.hook_inputs, &out);
    }
  }
  return out;
}

// A call_method step: the named method of the object in the first operand.
absl::StatusOr<c10::IValue> CallMethod(const NodePlan& p,
                                       const NodeHooks& node_hooks, Frame& f) {
  f.stack.clear();
  for (const Operand& o : p.operands) {
    f.stack.push_back(Materialize(o, f.env));
  }
  const c10::IValue& self = f.stack[0];
  if (!self.isObject()) {
    return absl::InvalidArgumentError(absl::StrCat(
        p.node->Describe(), ": call_method on a ", self.type()->repr_str(),
        " (only objects have methods here)"));
  }
  torch::jit::Function* method =
      self.toObjectRef().type()->findMethod(p.node->target());
  if (method == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        p.node->Describe(), ": ", ShortTypeName(*self.toObjectRef().type()),
        " has no method '", p.node->target(), "'"));
  }
  if (!node_hooks.empty()) {
    f.hook_inputs.assign(f.stack.begin() + 1, f.stack.end());
    FireNode(node_hooks, p, f.hook_inputs, nullptr);
  }
  method->run(f.stack);
  c10::IValue out = std::move(f.stack.back());
  f.stack.clear();
  return out;
}

}  // namespace

absl::StatusOr<c10::IValue> Interpreter::Plan::Execute(
    std::vector<c10::IValue> inputs, RunStats* stats) const {
  if (inputs.size() != placeholders.size()) {
    std::vector<std::string> names;
    for (const ir::Node* p : placeholders) names.push_back(p->target());
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", placeholders.size(), " input",
                     placeholders.size() == 1 ? "" : "s", " (",
                     absl::StrJoin(names, ", "), "), got ", inputs.size()));
  }
  Frame f;
  f.env.resize(num_slots);
  f.stack.reserve(16);
  const bool node_hooked = !node_hooks.empty();
  const c10::IValue root_value = root._ivalue();
  int64_t live = 0;
  int64_t peak = 0;
  int64_t released = 0;
  c10::IValue result;
  NodePlan* current = nullptr;

  auto fire_node = [&](const NodePlan& p, absl::Span<const c10::IValue> in,
                       const c10::IValue* out) {
    FireNode(node_hooks, p, in, out);
  };

  try {
    for (NodePlan& p : nodes) {
      current = &p;
      c10::IValue out;
      switch (p.step) {
        case Step::kPlaceholder:
          if (node_hooked) fire_node(p, {}, nullptr);
          out = std::move(inputs[p.input_index]);
          break;
        case Step::kGetAttr:
          if (node_hooked) fire_node(p, {}, nullptr);
          out = WalkSlots(root_value, p.attr_slots);
          break;
        case Step::kOperator: {
          f.stack.clear();
          for (const Operand& o : p.operands) {
            f.stack.push_back(Materialize(o, f.env));
          }
          if (node_hooked) {
            f.hook_inputs = f.stack;
            fire_node(p, f.hook_inputs, nullptr);
          }
          p.op(f.stack);
          out = TakeResult(p, f.stack);
          break;
        }
        case Step::kGetItem: {
          c10::IValue container = Materialize(p.operands[0], f.env);
          c10::IValue index = Materialize(p.operands[1], f.env);
          if (node_hooked) {
            f.hook_inputs = {container, index};
            fire_node(p, f.hook_inputs, nullptr);
          }
          absl::StatusOr<c10::IValue> item = GetItem(p, container, index);
          if (!item.ok()) return item.status();
          out = *std::move(item);
          break;
        }
        case Step::kCallModule:
          out = CallModule(p, root_value, node_hooks, module_hooks, f);
          break;
        case Step::kCallMethod: {
          absl::StatusOr<c10::IValue> called = CallMethod(p, node_hooks, f);
          if (!called.ok()) return called.status();
          out = *std::move(called);
          break;
        }
        case Step::kOutput:
          result = Materialize(p.operands[0], f.env);
          if (node_hooked) {
            f.hook_inputs = {result};
            fire_node(p, f.hook_inputs, nullptr);
            fire_node(p, f.hook_inputs, &result);
          }
          break;
      }
      if (p.out >= 0) {
        f.env[p.out] = std::move(out);
        ++live;
        if (node_hooked) {
          fire_node(p,
                    p.step == Step::kPlaceholder || p.step == Step::kGetAttr
                        ? absl::Span<const c10::IValue>()
                        : absl::Span<const c10::IValue>(f.hook_inputs),
                    &f.env[p.out]);
        }
      }
      peak = std::max(peak, live);
      for (int32_t s : p.release) {
        f.env[s] = c10::IValue();
        --live;
        ++released;
      }
      if (node_hooked) f.hook_inputs.clear();
    }
  } catch (...) {
    return StatusFromException(
        std::current_exception(),
        current == nullptr ? absl::string_view() : current->node->Describe());
  }
  if (stats != nullptr) {
    stats->nodes_run = static_cast<int64_t>(nodes.size());
    stats->peak_live_values = peak;
    stats->values_released = released;
  }
  return result;
}

}  // namespace tracecut::runtime
