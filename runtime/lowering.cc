#include "runtime/lowering.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/schema_matching.h>
#include <torch/csrc/jit/ir/named_value.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "runtime/lowering_internal.h"
#include "runtime/op_schema.h"
#include "runtime/prune_unused.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace internal {
namespace {

std::string ShortTypeName(const c10::ClassType& type) {
  return ir::Scope::ShortType(
      ir::Scope::DemangleType(type.name()->qualifiedName()));
}

// The type a placeholder gets from the first schema argument it feeds
// directly (or as a list element), or nullptr.
c10::TypePtr TypeFromUses(const ir::Node& placeholder,
                          const c10::ClassTypePtr& self_type) {
  for (const ir::Node* user : placeholder.users()) {
    const c10::FunctionSchema* schema = nullptr;
    size_t first = 0;
    std::shared_ptr<torch::jit::Operator> op;
    if (user->op() == ir::OpKind::kCallFunction &&
        user->target() != kGetItemTarget) {
      absl::StatusOr<std::shared_ptr<torch::jit::Operator>> r =
          ResolveOperator(user->target());
      if (!r.ok()) continue;
      op = *r;
      schema = &op->schema();
    } else if (user->op() == ir::OpKind::kCallModule) {
      c10::TypePtr t = self_type;
      for (absl::string_view part : absl::StrSplit(user->target(), '.')) {
        const auto* ct = t == nullptr ? nullptr : t->castRaw<c10::ClassType>();
        if (ct == nullptr || !ct->hasAttribute(std::string(part))) {
          t = nullptr;
          break;
        }
        t = ct->getAttribute(std::string(part));
      }
      const auto* ct = t == nullptr ? nullptr : t->castRaw<c10::ClassType>();
      torch::jit::Function* fn =
          ct == nullptr ? nullptr : ct->findMethod("forward");
      if (fn == nullptr) continue;
      schema = &fn->getSchema();
      first = 1;
    } else {
      continue;
    }
    absl::StatusOr<std::vector<const ir::Argument*>> bound =
        BindArguments(*user, *schema, first);
    if (!bound.ok()) continue;
    for (size_t i = 0; i < bound->size(); ++i) {
      const ir::Argument* arg = (*bound)[i];
      if (arg == nullptr || first + i >= schema->arguments().size()) continue;
      c10::TypePtr formal = schema->arguments()[first + i].type();
      c10::TypePtr candidate;
      if (arg->is_node() && arg->node() == &placeholder) {
        candidate = formal;
        if (const auto* opt = formal->castRaw<c10::OptionalType>()) {
          candidate = opt->getElementType();
        }
      } else if (arg->kind() == ir::Argument::Kind::kList) {
        for (const ir::Argument& e : arg->elements()) {
          if (e.is_node() && e.node() == &placeholder) {
            candidate = ListElementType(formal);
            if (candidate != nullptr) {
              if (const auto* opt = candidate->castRaw<c10::OptionalType>()) {
                candidate = opt->getElementType();
              }
            }
          }
        }
      }
      if (candidate != nullptr && !candidate->hasFreeVariables()) {
        return candidate;
      }
    }
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Graph>> Lowerer::Run() {
  frame_.self = frame_.graph->addInput("self")->setType(self_type_);
  RETURN_IF_ERROR(AddInputs());
  std::vector<const ir::Node*> nodes;
  for (const ir::Node* node : gm_.graph().nodes()) {
    position_[node] = position_.size();
    if (node->op() != ir::OpKind::kPlaceholder) nodes.push_back(node);
  }
  if (keep_hierarchy()) {
    RETURN_IF_ERROR(TorchCall("finding the modules whose forward must stay",
                              [&] { return KeptTypes(); }));
    for (const torch::jit::Module& m : root_->modules()) {
      ++instances_[m.type().get()];
    }
  }
  RETURN_IF_ERROR(LowerNodes(nodes, 1));
  if (frame_.graph->outputs().empty()) {
    return absl::InvalidArgumentError("graph has no output node");
  }
  RETURN_IF_ERROR(TorchCall("checking the lowered graph", [&] {
    torch::jit::EliminateDeadCode(frame_.graph);
    frame_.graph->lint();
  }));
  return frame_.graph;
}

absl::Status Lowerer::AddInputs() {
  std::vector<ir::Node*> placeholders = gm_.graph().placeholders();
  if (!options_.input_types.empty() &&
      options_.input_types.size() != placeholders.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LoweringOptions.input_types has ", options_.input_types.size(),
        " types for ", placeholders.size(), " placeholders"));
  }
  const c10::FunctionSchema* original = OriginalSchemaIfMatching();
  for (size_t i = 0; i < placeholders.size(); ++i) {
    const ir::Node& p = *placeholders[i];
    c10::TypePtr type;
    if (!options_.input_types.empty()) {
      type = options_.input_types[i];
    } else if (original != nullptr) {
      type = original->arguments()[i + 1].type();
    } else {
      type = TypeFromUses(p, self_type_);
    }
    if (type == nullptr) type = c10::TensorType::get();
    Value* v = frame_.graph->addInput()->setType(type);
    SetName(v, p.target());
    frame_.values[&p].value = v;
  }
  return absl::OkStatus();
}

const c10::FunctionSchema* Lowerer::OriginalSchemaIfMatching() const {
  torch::jit::Function* fn = self_type_->findMethod("forward");
  if (fn == nullptr) return nullptr;
  const c10::FunctionSchema& schema = fn->getSchema();
  std::vector<ir::Node*> placeholders = gm_.graph().placeholders();
  if (schema.arguments().size() != placeholders.size() + 1) return nullptr;
  for (size_t i = 0; i < placeholders.size(); ++i) {
    if (schema.arguments()[i + 1].name() != placeholders[i]->target()) {
      return nullptr;
    }
  }
  return &schema;
}

void Lowerer::SetName(Value* v, const std::string& name) {
  // IR names are identifiers; TorchScript rejects only empty and numeric
  // debug names.
  const bool numeric =
      !name.empty() && std::all_of(name.begin(), name.end(),
                                   [](char c) { return c >= '0' && c <= '9'; });
  if (!name.empty() && !numeric && name != "self") {
    v->setDebugName(name);
  }
}

absl::Status Lowerer::Lower(const ir::Node& node) {
  switch (node.op()) {
    case ir::OpKind::kPlaceholder:
      return absl::OkStatus();
    case ir::OpKind::kGetAttr: {
      ASSIGN_OR_RETURN(Value * v, Attr(node, node.target(), false));
      frame_.values[&node].value = v;
      return absl::OkStatus();
    }
    case ir::OpKind::kCallFunction:
      if (node.target() == kGetItemTarget) return LowerGetItem(node);
      return LowerOperator(node);
    case ir::OpKind::kCallModule:
      return LowerCallModule(node);
    case ir::OpKind::kCallMethod:
      return LowerCallMethod(node);
    case ir::OpKind::kOutput: {
      if (node.args().size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(node.Describe(), ": output takes one argument"));
      }
      ASSIGN_OR_RETURN(Value * v, ValueFor(node, node.args()[0], nullptr));
      frame_.graph->registerOutput(v);
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown op kind");
}

absl::StatusOr<Value*> Lowerer::Attr(const ir::Node& node,
                                     const std::string& path,
                                     bool want_module) {
  if (!frame_.path.empty() && !IsBelow(path, frame_.path)) {
    return absl::InternalError(absl::StrCat(
        node.Describe(), ": '", path,
        "' is not inside the module being lowered, '", frame_.path, "'"));
  }
  const absl::string_view relative =
      frame_.path.empty()
          ? absl::string_view(path)
          : absl::string_view(path).substr(frame_.path.size() + 1);
  Value* current = frame_.self;
  std::string prefix;
  for (absl::string_view part : absl::StrSplit(relative, '.')) {
    const std::string name(part);
    const std::string where = prefix.empty() ? "<root>" : prefix;
    prefix = prefix.empty() ? name : absl::StrCat(prefix, ".", name);
    auto it = frame_.attrs.find(prefix);
    if (it != frame_.attrs.end()) {
      current = it->second;
      continue;
    }
    const auto* type = current->type()->castRaw<c10::ClassType>();
    if (type == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(node.Describe(), ": bad attribute path '", path, "': '",
                       where, "' is not a module"));
    }
    if (!type->hasAttribute(name)) {
      return absl::NotFoundError(absl::StrCat(
          node.Describe(), ": bad attribute path '", path, "': module '", where,
          "' (", ShortTypeName(*type), ") has no attribute '", name, "'"));
    }
    current = frame_.graph->insertGetAttr(current, name);
    frame_.attrs[prefix] = current;
  }
  if (want_module && current->type()->castRaw<c10::ClassType>() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": '", path, "' is a ",
                     current->type()->repr_str(), ", not a module"));
  }
  return current;
}

Value* Lowerer::WholeValue(Lowered& l) {
  if (l.value == nullptr) {
    l.value = frame_.graph->insertNode(frame_.graph->createTuple(l.outputs))
                  ->output();
  }
  return l.value;
}

absl::StatusOr<Value*> Lowerer::ValueFor(const ir::Node& node,
                                         const ir::Argument& arg,
                                         const c10::TypePtr& type) {
  if (arg.IsConstant()) {
    c10::TypePtr t = type;
    if (t != nullptr && t->hasFreeVariables()) t = nullptr;
    ASSIGN_OR_RETURN(c10::IValue v, ConstantToIValue(arg, t));
    return frame_.graph->insertConstant(v);
  }
  switch (arg.kind()) {
    case ir::Argument::Kind::kNode: {
      auto it = frame_.values.find(arg.node());
      if (it == frame_.values.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(node.Describe(), ": reads %", arg.node()->name(),
                         ", which has no value"));
      }
      return WholeValue(it->second);
    }
    case ir::Argument::Kind::kList: {
      c10::TypePtr elem = ListElementType(type);
      if (elem != nullptr && elem->hasFreeVariables()) elem = nullptr;
      std::vector<Value*> elements;
      for (const ir::Argument& e : arg.elements()) {
        ASSIGN_OR_RETURN(Value * v, ValueFor(node, e, elem));
        elements.push_back(v);
      }
      if (elem == nullptr) {
        std::vector<c10::TypePtr> types;
        for (Value* v : elements) types.push_back(v->type());
        std::ostringstream why;
        std::optional<c10::TypePtr> unified = c10::unifyTypeList(types, why);
        if (!unified.has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat(node.Describe(),
                           ": list elements have no common type: ", why.str()));
        }
        elem = *unified;
      }
      return frame_.graph->insertNode(frame_.graph->createList(elem, elements))
          ->output();
    }
    case ir::Argument::Kind::kTuple: {
      const auto* tuple_type =
          type == nullptr ? nullptr : type->castRaw<c10::TupleType>();
      std::vector<Value*> elements;
      for (size_t i = 0; i < arg.elements().size(); ++i) {
        c10::TypePtr et;
        if (tuple_type != nullptr && i < tuple_type->elements().size()) {
          et = tuple_type->elements()[i];
        }
        ASSIGN_OR_RETURN(Value * v, ValueFor(node, arg.elements()[i], et));
        elements.push_back(v);
      }
      return frame_.graph->insertNode(frame_.graph->createTuple(elements))
          ->output();
    }
    default:
      break;
  }
  return absl::InternalError("unexpected argument kind");
}

absl::StatusOr<std::vector<NamedValue>> Lowerer::SchemaInputs(
    const ir::Node& node, const c10::FunctionSchema& schema, size_t first) {
  ASSIGN_OR_RETURN(std::vector<const ir::Argument*> bound,
                   BindArguments(node, schema, first));
  std::vector<NamedValue> named;
  for (size_t i = 0; i < bound.size(); ++i) {
    if (bound[i] == nullptr) continue;  // matchSchema fills the default.
    const c10::Argument* formal = first + i < schema.arguments().size()
                                      ? &schema.arguments()[first + i]
                                      : nullptr;
    ASSIGN_OR_RETURN(Value * v, ValueFor(node, *bound[i],
                                         formal ? formal->type() : nullptr));
    // By name, except for vararg schemas (whose extra arguments have no
    // names, so everything goes positionally).
    if (formal != nullptr && !schema.is_vararg()) {
      named.emplace_back(formal->name(), v);
    } else {
      named.emplace_back(v);
    }
  }
  return named;
}

absl::Status Lowerer::LowerOperator(const ir::Node& node) {
  absl::StatusOr<std::shared_ptr<torch::jit::Operator>> op =
      ResolveOperator(node.target());
  if (!op.ok()) return util::Annotate(op.status(), node.Describe());
  const c10::FunctionSchema& schema = (*op)->schema();
  ASSIGN_OR_RETURN(std::vector<NamedValue> inputs,
                   SchemaInputs(node, schema, 0));
  std::vector<NamedValue> args, kwargs;
  for (NamedValue& v : inputs) {
    (v.name().empty() ? args : kwargs).push_back(std::move(v));
  }
  torch::jit::MatchedSchema matched = torch::jit::matchSchema(
      schema, torch::jit::SourceRange(), *frame_.graph, args, kwargs);
  torch::jit::Node* n =
      frame_.graph->create(c10::Symbol::fromQualString(schema.name()),
                           matched.inputs, matched.return_types.size());
  for (size_t i = 0; i < matched.return_types.size(); ++i) {
    n->output(i)->setType(matched.return_types[i]);
  }
  frame_.graph->insertNode(n);
  Lowered& l = frame_.values[&node];
  if (n->outputs().size() == 1) {
    l.value = n->output();
    SetName(l.value, node.name());
  } else {
    l.outputs.assign(n->outputs().begin(), n->outputs().end());
  }
  return absl::OkStatus();
}

absl::Status Lowerer::LowerGetItem(const ir::Node& node) {
  if (node.args().size() != 2 || !node.args()[0].is_node()) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": getitem takes (value, index)"));
  }
  auto it = frame_.values.find(node.args()[0].node());
  if (it == frame_.values.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": reads a value not lowered yet"));
  }
  Lowered& container = it->second;
  const ir::Argument& index = node.args()[1];
  Value* result = nullptr;
  if (index.kind() == ir::Argument::Kind::kInt && container.value == nullptr) {
    const int64_t n = static_cast<int64_t>(container.outputs.size());
    int64_t i = index.as_int();
    if (i < -n || i >= n) {
      return absl::OutOfRangeError(absl::StrCat(
          node.Describe(), ": index ", i, " out of range for ", n, " outputs"));
    }
    result = container.outputs[i < 0 ? i + n : i];
  } else {
    Value* c = WholeValue(container);
    const auto* tuple_type = c->type()->castRaw<c10::TupleType>();
    if (tuple_type != nullptr && index.kind() == ir::Argument::Kind::kInt) {
      const int64_t n = static_cast<int64_t>(tuple_type->elements().size());
      int64_t i = index.as_int();
      if (i < -n || i >= n) {
        return absl::OutOfRangeError(absl::StrCat(node.Describe(), ": index ",
                                                  i, " out of range for a ", n,
                                                  "-tuple"));
      }
      if (i < 0) i += n;
      result = frame_.graph
                   ->insertNode(frame_.graph->createTupleIndex(
                       c, frame_.graph->insertConstant(i),
                       tuple_type->elements()[i]))
                   ->output();
    } else {
      ASSIGN_OR_RETURN(Value * idx, ValueFor(node, index, nullptr));
      result = frame_.graph->insert(
          c10::Symbol::fromQualString("aten::__getitem__"), {c, idx});
    }
  }
  frame_.values[&node].value = result;
  return absl::OkStatus();
}

absl::Status Lowerer::LowerCallModule(const ir::Node& node) {
  ASSIGN_OR_RETURN(Value * module, Attr(node, node.target(), true));
  const auto& type = module->type()->expectRef<c10::ClassType>();
  torch::jit::Function* forward = type.findMethod("forward");
  if (forward == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": module '", node.target(), "' (",
                     ShortTypeName(type), ") has no forward method"));
  }
  return CallMethod(node, module, "forward", forward->getSchema(), true);
}

absl::Status Lowerer::LowerCallMethod(const ir::Node& node) {
  if (node.args().empty() || !node.args()[0].is_node()) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(),
                     ": call_method needs the object as its first argument"));
  }
  ASSIGN_OR_RETURN(Value * self, ValueFor(node, node.args()[0], nullptr));
  const auto* type = self->type()->castRaw<c10::ClassType>();
  torch::jit::Function* method =
      type == nullptr ? nullptr : type->findMethod(node.target());
  if (method == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(node.Describe(), ": ", self->type()->repr_str(),
                     " has no method '", node.target(), "'"));
  }
  return CallMethod(node, self, node.target(), method->getSchema(), false);
}

absl::Status Lowerer::CallMethod(const ir::Node& node, Value* self,
                                 const std::string& name,
                                 const c10::FunctionSchema& schema,
                                 bool args_skip_self) {
  std::vector<NamedValue> args = {NamedValue(self)};
  std::vector<NamedValue> kwargs;
  if (args_skip_self) {
    ASSIGN_OR_RETURN(std::vector<NamedValue> inputs,
                     SchemaInputs(node, schema, 1));
    for (NamedValue& v : inputs) kwargs.push_back(std::move(v));
  } else {
    if (!node.kwargs().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          node.Describe(), ": call_method kwargs are not supported"));
    }
    for (size_t i = 1; i < node.args().size(); ++i) {
      const c10::TypePtr formal = i < schema.arguments().size()
                                      ? schema.arguments()[i].type()
                                      : nullptr;
      ASSIGN_OR_RETURN(Value * v, ValueFor(node, node.args()[i], formal));
      args.emplace_back(v);
    }
  }
  torch::jit::MatchedSchema matched = torch::jit::matchSchema(
      schema, torch::jit::SourceRange(), *frame_.graph, args, kwargs);
  Value* out = frame_.graph->insertMethodCall(name, matched);
  SetName(out, node.name());
  frame_.values[&node].value = out;
  return absl::OkStatus();
}

}  // namespace internal

namespace {

using internal::Graph;
using internal::Value;

// The forward schema to install: the original's arguments (names, types,
// defaults) when the graph's inputs kept them, else the graph's.
c10::FunctionSchema ForwardSchema(const c10::FunctionSchema* original,
                                  const Graph& graph) {
  std::vector<c10::Argument> args;
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    const Value* in = graph.inputs()[i];
    if (original != nullptr && i < original->arguments().size() &&
        *original->arguments()[i].type() == *in->type()) {
      const c10::Argument& a = original->arguments()[i];
      args.emplace_back(i == 0 ? "self" : a.name(), in->type(), std::nullopt,
                        a.default_value());
    } else {
      args.emplace_back(i == 0 ? "self" : in->debugName(), in->type());
    }
  }
  std::vector<c10::Argument> returns;
  for (const Value* out : graph.outputs())
    returns.emplace_back("", out->type());
  return c10::FunctionSchema("forward", "", std::move(args),
                             std::move(returns));
}

}  // namespace

absl::StatusOr<std::shared_ptr<torch::jit::Graph>> BuildTorchScriptGraph(
    const GraphModule& gm, const c10::ClassTypePtr& self_type,
    const LoweringOptions& options) {
  // Outlining changes the module's types: LowerToTorchScript's copy only.
  return internal::Lowerer(gm, self_type, options).Run();
}

absl::StatusOr<torch::jit::Module> LowerToTorchScript(
    const GraphModule& gm, const LoweringOptions& options) {
  // Fresh objects and types, same tensors: replacing forward on the copy's
  // types cannot affect gm.module().
  ASSIGN_OR_RETURN(torch::jit::Module lowered,
                   TorchCall("copying the module", [&] {
                     return gm.module().clone(/*inplace=*/true);
                   }));
  const c10::ClassTypePtr& type = lowered.type();
  std::optional<c10::FunctionSchema> original;
  if (torch::jit::Function* old = type->findMethod("forward")) {
    original = old->getSchema();
  }
  internal::Lowerer lowerer(gm, type, options, &lowered);
  ASSIGN_OR_RETURN(std::shared_ptr<torch::jit::Graph> graph, lowerer.Run());
  const std::vector<c10::ClassTypePtr>& outlined = lowerer.outlined();
  RETURN_IF_ERROR(TorchCall("installing forward", [&] {
    internal::InstallForward(
        type, graph, ForwardSchema(original ? &*original : nullptr, *graph),
        /*drop_helpers=*/!outlined.empty());
    internal::RemoveStaleForwards(type, outlined);
  }));
  if (options.prune_unused) {
    RETURN_IF_ERROR(
        PruneUnused(gm, lowered, lowerer.outlined_paths()).status());
  }
  return lowered;
}

}  // namespace tracecut::runtime
