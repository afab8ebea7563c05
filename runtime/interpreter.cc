#include "runtime/interpreter.h"

#include <ATen/core/function.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/interpreter_internal.h"
#include "runtime/op_schema.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace internal {

std::string ShortTypeName(const c10::ClassType& type) {
  return ir::Scope::ShortType(
      ir::Scope::DemangleType(type.name()->qualifiedName()));
}

}  // namespace internal

namespace {

using internal::NodePlan;
using internal::Operand;
using internal::ShortTypeName;
using internal::Step;

using SlotMap = absl::flat_hash_map<const ir::Node*, int32_t>;

// Resolves a dotted path from `root` to attribute slot indices. When
// `want_module`, the final attribute must be a module.
absl::Status ResolveAttributePath(const ir::Node& node,
                                  const torch::jit::Module& root,
                                  bool want_module, std::vector<size_t>* slots,
                                  c10::IValue* value) {
  const std::string& path = node.target();
  if (path.empty()) {
    if (want_module) {
      *value = root._ivalue();
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": empty attribute path"));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  c10::IValue current = root._ivalue();
  std::string where = "<root>";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!current.isObject()) {
      return absl::InvalidArgumentError(absl::StrCat(
          node.Describe(), ": bad attribute path '", path, "': '", where,
          "' is a ", current.type()->repr_str(), ", not a module"));
    }
    const c10::ClassType& type = *current.toObjectRef().type();
    std::string name(parts[i]);
    std::optional<size_t> slot = type.findAttributeSlot(name);
    if (!slot.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          node.Describe(), ": bad attribute path '", path, "': module '", where,
          "' (", ShortTypeName(type), ") has no attribute '", name, "'"));
    }
    slots->push_back(*slot);
    current = current.toObjectRef().getSlot(*slot);
    where = std::string(path.substr(
        0,
        static_cast<size_t>(parts[i].data() + parts[i].size() - path.data())));
  }
  if (want_module &&
      !(current.isObject() && current.toObjectRef().type()->is_module())) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": '", path, "' is a ",
                     current.type()->repr_str(), ", not a module"));
  }
  *value = std::move(current);
  return absl::OkStatus();
}

class Planner {
 public:
  Planner(const ir::Node& node, const SlotMap& slots)
      : node_(node), slots_(slots) {}

  // An operand for `arg` where the consumer expects `type` (may be null).
  absl::StatusOr<Operand> Make(const ir::Argument& arg,
                               const c10::TypePtr& type,
                               absl::string_view what) {
    Operand o;
    if (arg.IsConstant()) {
      absl::StatusOr<c10::IValue> v = ConstantToIValue(arg, type);
      if (!v.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            node_.Describe(), ": ", what, ": ", v.status().message()));
      }
      if (type != nullptr && !type->hasFreeVariables() &&
          !v->type()->isSubtypeOf(*type)) {
        return absl::InvalidArgumentError(absl::StrCat(
            node_.Describe(), ": ", what, " expects ", type->repr_str(),
            ", got a constant ", v->type()->repr_str()));
      }
      o.kind = Operand::Kind::kConstant;
      o.constant = *std::move(v);
      return o;
    }
    switch (arg.kind()) {
      case ir::Argument::Kind::kNode: {
        auto it = slots_.find(arg.node());
        if (it == slots_.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(node_.Describe(), ": ", what, " reads %",
                           arg.node()->name(), ", which has no value"));
        }
        o.kind = Operand::Kind::kValue;
        o.slot = it->second;
        return o;
      }
      case ir::Argument::Kind::kList: {
        o.kind = Operand::Kind::kList;
        c10::TypePtr elem = ListElementType(type);
        if (elem != nullptr && !elem->hasFreeVariables()) {
          o.element_type = elem;
        } else {
          elem = nullptr;
        }
        for (const ir::Argument& e : arg.elements()) {
          ASSIGN_OR_RETURN(Operand eo, Make(e, elem, what));
          o.elements.push_back(std::move(eo));
        }
        return o;
      }
      case ir::Argument::Kind::kTuple: {
        o.kind = Operand::Kind::kTuple;
        const auto* tuple_type =
            type == nullptr ? nullptr : type->castRaw<c10::TupleType>();
        for (size_t i = 0; i < arg.elements().size(); ++i) {
          c10::TypePtr et;
          if (tuple_type != nullptr && i < tuple_type->elements().size()) {
            et = tuple_type->elements()[i];
          }
          ASSIGN_OR_RETURN(Operand eo, Make(arg.elements()[i], et, what));
          o.elements.push_back(std::move(eo));
        }
        return o;
      }
      default:
        break;
    }
    return absl::InternalError(
        absl::StrCat(node_.Describe(), ": unexpected argument kind"));
  }

  // Operands for every argument of `schema` from `first` on, defaults
  // filled in.
  absl::StatusOr<std::vector<Operand>> ForSchema(
      const c10::FunctionSchema& schema, size_t first) {
    ASSIGN_OR_RETURN(std::vector<const ir::Argument*> bound,
                     BindArguments(node_, schema, first));
    const auto& formals = schema.arguments();
    std::vector<Operand> operands;
    operands.reserve(bound.size());
    for (size_t i = 0; i < bound.size(); ++i) {
      const c10::Argument* formal =
          first + i < formals.size() ? &formals[first + i] : nullptr;
      if (bound[i] == nullptr) {
        Operand o;
        o.constant = *formal->default_value();
        operands.push_back(std::move(o));
        continue;
      }
      std::string what = formal != nullptr
                             ? absl::StrCat("argument '", formal->name(), "'")
                             : absl::StrCat("argument ", i);
      ASSIGN_OR_RETURN(
          Operand o,
          Make(*bound[i], formal != nullptr ? formal->type() : nullptr, what));
      operands.push_back(std::move(o));
    }
    return operands;
  }

  // Operands for the positional args, no schema.
  absl::StatusOr<std::vector<Operand>> Positional() {
    if (!node_.kwargs().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(node_.Describe(), ": kwargs are not supported here"));
    }
    std::vector<Operand> operands;
    for (size_t i = 0; i < node_.args().size(); ++i) {
      ASSIGN_OR_RETURN(Operand o, Make(node_.args()[i], nullptr,
                                       absl::StrCat("argument ", i)));
      operands.push_back(std::move(o));
    }
    return operands;
  }

 private:
  const ir::Node& node_;
  const SlotMap& slots_;
};

// Operators without a ready Operation are built for a specific node (they
// look at its inputs and outputs): give them a stand-in node.
absl::StatusOr<torch::jit::Operation> OperationFor(
    const torch::jit::Operator& op, size_t num_inputs,
    torch::jit::Graph& scratch) {
  if (op.hasOperation()) return op.getOperation();
  const c10::FunctionSchema& schema = op.schema();
  std::vector<torch::jit::Value*> inputs;
  for (size_t i = 0; i < num_inputs; ++i) {
    torch::jit::Value* v = scratch.addInput();
    if (i < schema.arguments().size() &&
        !schema.arguments()[i].type()->hasFreeVariables()) {
      v->setType(schema.arguments()[i].type());
    }
    inputs.push_back(v);
  }
  torch::jit::Node* n =
      scratch.create(c10::Symbol::fromQualString(schema.name()), inputs,
                     schema.returns().size());
  scratch.insertNode(n);
  return op.getOperation(n);
}

// Visits every operand, depth first, left to right.
template <typename F>
void ForEachOperand(std::vector<Operand>& operands, F&& fn) {
  for (Operand& o : operands) {
    fn(o);
    ForEachOperand(o.elements, fn);
  }
}

absl::Status PlanNode(const ir::Node& node, const torch::jit::Module& root,
                      const SlotMap& slots, int32_t placeholder_index,
                      torch::jit::Graph& scratch, NodePlan& plan) {
  plan.node = &node;
  Planner planner(node, slots);
  switch (node.op()) {
    case ir::OpKind::kPlaceholder:
      plan.step = Step::kPlaceholder;
      plan.input_index = placeholder_index;
      return absl::OkStatus();
    case ir::OpKind::kGetAttr: {
      plan.step = Step::kGetAttr;
      c10::IValue value;
      return ResolveAttributePath(node, root, /*want_module=*/false,
                                  &plan.attr_slots, &value);
    }
    case ir::OpKind::kCallFunction: {
      if (node.target() == kGetItemTarget) {
        plan.step = Step::kGetItem;
        if (node.args().size() != 2 || !node.kwargs().empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              node.Describe(), ": getitem takes (value, index), got ",
              node.args().size(), " args and ", node.kwargs().size(),
              " kwargs"));
        }
        ASSIGN_OR_RETURN(plan.operands, planner.Positional());
        return absl::OkStatus();
      }
      plan.step = Step::kOperator;
      absl::StatusOr<std::shared_ptr<torch::jit::Operator>> op =
          ResolveOperator(node.target());
      if (!op.ok()) return util::Annotate(op.status(), node.Describe());
      const c10::FunctionSchema& schema = (*op)->schema();
      ASSIGN_OR_RETURN(plan.operands, planner.ForSchema(schema, 0));
      plan.num_returns = schema.returns().size();
      plan.var_returns = schema.is_varret();
      absl::StatusOr<torch::jit::Operation> operation = TorchCall(
          node.Describe(),
          [&] { return OperationFor(**op, plan.operands.size(), scratch); });
      if (!operation.ok()) return operation.status();
      plan.op = *std::move(operation);
      return absl::OkStatus();
    }
    case ir::OpKind::kCallModule: {
      plan.step = Step::kCallModule;
      c10::IValue module;
      RETURN_IF_ERROR(ResolveAttributePath(node, root, /*want_module=*/true,
                                           &plan.attr_slots, &module));
      plan.module_type = module.toObjectRef().type().get();
      plan.forward = plan.module_type->findMethod("forward");
      if (plan.forward == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            node.Describe(), ": module '", node.target(), "' (",
            ShortTypeName(*plan.module_type), ") has no forward method"));
      }
      absl::StatusOr<std::vector<Operand>> operands = TorchCall(
          node.Describe(),
          [&] { return planner.ForSchema(plan.forward->getSchema(), 1); });
      if (!operands.ok()) return operands.status();
      plan.operands = *std::move(operands);
      return absl::OkStatus();
    }
    case ir::OpKind::kCallMethod: {
      plan.step = Step::kCallMethod;
      if (node.args().empty() || !node.args()[0].is_node()) {
        return absl::InvalidArgumentError(absl::StrCat(
            node.Describe(),
            ": call_method needs the object as its first argument"));
      }
      ASSIGN_OR_RETURN(plan.operands, planner.Positional());
      return absl::OkStatus();
    }
    case ir::OpKind::kOutput: {
      plan.step = Step::kOutput;
      if (node.args().size() != 1 || !node.kwargs().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            node.Describe(), ": output takes exactly one argument, got ",
            node.args().size()));
      }
      ASSIGN_OR_RETURN(Operand o,
                       planner.Make(node.args()[0], nullptr, "output"));
      plan.operands.push_back(std::move(o));
      return absl::OkStatus();
    }
  }
  return absl::InternalError(absl::StrCat(node.Describe(), ": unknown op"));
}

}  // namespace

Interpreter::Interpreter(std::unique_ptr<Plan> plan) : plan_(std::move(plan)) {}
Interpreter::Interpreter(Interpreter&&) noexcept = default;
Interpreter& Interpreter::operator=(Interpreter&&) noexcept = default;
Interpreter::~Interpreter() = default;

absl::StatusOr<Interpreter> Interpreter::Create(const GraphModule& gm) {
  return Create(gm.graph(), gm.module());
}

absl::StatusOr<Interpreter> Interpreter::Create(
    const ir::Graph& graph, const torch::jit::Module& root) {
  auto plan = std::make_unique<Plan>();
  plan->graph = &graph;
  plan->root = root;
  plan->scratch = std::make_shared<torch::jit::Graph>();

  SlotMap slots;
  int32_t num_outputs = 0;
  for (const ir::Node* node : graph.nodes()) {
    if (node->op() == ir::OpKind::kOutput) {
      ++num_outputs;
      continue;
    }
    slots[node] = plan->num_slots++;
  }
  if (num_outputs != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph has ", num_outputs, " output nodes, expected 1"));
  }
  if (graph.last()->op() != ir::OpKind::kOutput) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output node must be last; ", graph.last()->Describe(),
                     " follows it"));
  }

  plan->nodes.resize(graph.size());
  size_t i = 0;
  for (const ir::Node* node : graph.nodes()) {
    NodePlan& np = plan->nodes[i++];
    int32_t placeholder_index = -1;
    if (node->op() == ir::OpKind::kPlaceholder) {
      placeholder_index = static_cast<int32_t>(plan->placeholders.size());
      plan->placeholders.push_back(node);
    }
    RETURN_IF_ERROR(
        PlanNode(*node, root, slots, placeholder_index, *plan->scratch, np));
    if (node->op() != ir::OpKind::kOutput) np.out = slots.at(node);
  }

  // Last reads: that read moves the value, and the value is released after
  // its reader. Values nobody reads are released right after they are made.
  std::vector<Operand*> last_read(plan->num_slots, nullptr);
  std::vector<int32_t> last_reader(plan->num_slots, -1);
  for (size_t n = 0; n < plan->nodes.size(); ++n) {
    ForEachOperand(plan->nodes[n].operands, [&](Operand& o) {
      if (o.kind != Operand::Kind::kValue) return;
      last_read[o.slot] = &o;
      last_reader[o.slot] = static_cast<int32_t>(n);
    });
  }
  for (size_t n = 0; n < plan->nodes.size(); ++n) {
    const int32_t out = plan->nodes[n].out;
    if (out >= 0 && last_reader[out] < 0) {
      plan->nodes[n].release.push_back(out);
    }
  }
  for (int32_t s = 0; s < plan->num_slots; ++s) {
    if (last_reader[s] < 0) continue;
    last_read[s]->move = true;
    plan->nodes[last_reader[s]].release.push_back(s);
  }
  return Interpreter(std::move(plan));
}

absl::StatusOr<c10::IValue> Interpreter::Run(std::vector<c10::IValue> inputs,
                                             RunStats* stats) const {
  return plan_->Execute(std::move(inputs), stats);
}

absl::StatusOr<c10::IValue> Interpreter::RunNamed(
    absl::flat_hash_map<std::string, c10::IValue> inputs,
    RunStats* stats) const {
  std::vector<c10::IValue> ordered;
  ordered.reserve(plan_->placeholders.size());
  std::vector<std::string> missing;
  size_t used = 0;
  for (const ir::Node* p : plan_->placeholders) {
    auto it = inputs.find(p->target());
    if (it == inputs.end()) it = inputs.find(p->name());
    if (it == inputs.end()) {
      missing.push_back(p->target());
      ordered.emplace_back();
      continue;
    }
    ordered.push_back(std::move(it->second));
    inputs.erase(it);
    ++used;
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing input", missing.size() == 1 ? "" : "s", ": ",
                     absl::StrJoin(missing, ", ")));
  }
  if (!inputs.empty()) {
    std::vector<std::string> unknown;
    for (const auto& [name, v] : inputs) unknown.push_back(name);
    std::sort(unknown.begin(), unknown.end());
    return absl::InvalidArgumentError(
        absl::StrCat("no placeholder named ", absl::StrJoin(unknown, ", ")));
  }
  return plan_->Execute(std::move(ordered), stats);
}

Interpreter::HookId Interpreter::AddNodeHook(NodeHook hook) {
  HookId id = plan_->next_hook_id++;
  plan_->node_hooks.emplace_back(id, std::move(hook));
  return id;
}

Interpreter::HookId Interpreter::AddModuleHook(ModuleHook hook) {
  HookId id = plan_->next_hook_id++;
  plan_->module_hooks.emplace_back(id, std::move(hook));
  return id;
}

namespace {

void PlaceOperand(internal::Operand& o, c10::Device device) {
  if (o.kind != internal::Operand::Kind::kConstant) {
    for (internal::Operand& e : o.elements) PlaceOperand(e, device);
    return;
  }
  if (o.constant.isDevice()) {
    o.constant = device;
  } else if (o.constant.isTensor()) {
    o.constant = o.constant.toTensor().to(device);
  }
}

}  // namespace

void Interpreter::PlaceOn(c10::Device device) {
  if (device.is_cpu()) return;
  for (internal::NodePlan& p : plan_->nodes) {
    for (internal::Operand& o : p.operands) PlaceOperand(o, device);
  }
}

bool Interpreter::RemoveHook(HookId id) {
  auto remove = [id](auto& hooks) {
    auto it = std::find_if(hooks.begin(), hooks.end(),
                           [id](const auto& h) { return h.first == id; });
    if (it == hooks.end()) return false;
    hooks.erase(it);
    return true;
  };
  return remove(plan_->node_hooks) || remove(plan_->module_hooks);
}

void Interpreter::ClearHooks() {
  plan_->node_hooks.clear();
  plan_->module_hooks.clear();
}

const ir::Graph& Interpreter::graph() const { return *plan_->graph; }

const std::vector<const ir::Node*>& Interpreter::placeholders() const {
  return plan_->placeholders;
}

}  // namespace tracecut::runtime
