// Keeping the module hierarchy while lowering (Note [Keeping the module
// hierarchy] in lowering_internal.h): outlining a module's nodes into its
// own forward, and the TorchScript method surgery that needs.

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/schema_matching.h>
#include <torch/csrc/jit/passes/canonicalize.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "runtime/lowering_internal.h"
#include "runtime/prune_unused.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime::internal {
namespace {

// Every module type in the tree under `root`, `root` first.
std::vector<c10::ClassTypePtr> ModuleTypes(const c10::ClassTypePtr& root) {
  std::vector<c10::ClassTypePtr> all = {root};
  absl::flat_hash_set<const c10::ClassType*> seen = {root.get()};
  for (size_t i = 0; i < all.size(); ++i) {
    for (const c10::TypePtr& attr : all[i]->containedTypes()) {
      auto type = attr->cast<c10::ClassType>();
      if (type != nullptr && type->is_module() &&
          seen.insert(type.get()).second) {
        all.push_back(type);
      }
    }
  }
  return all;
}

// The prim::CallMethod nodes of `graph`, blocks included.
std::vector<const torch::jit::Node*> MethodCalls(const Graph& graph) {
  std::vector<const torch::jit::Node*> calls;
  std::vector<const torch::jit::Block*> blocks = {graph.block()};
  while (!blocks.empty()) {
    const torch::jit::Block* block = blocks.back();
    blocks.pop_back();
    for (const torch::jit::Node* n : block->nodes()) {
      if (n->kind() == c10::prim::CallMethod) calls.push_back(n);
      for (const torch::jit::Block* b : n->blocks()) blocks.push_back(b);
    }
  }
  return calls;
}

// Removes `names` (those it has) from `type`'s methods.
void RemoveMethods(const c10::ClassTypePtr& type,
                   const std::vector<std::string>& names) {
  std::shared_ptr<torch::jit::CompilationUnit> cu = type->compilation_unit();
  for (const std::string& name : names) {
    if (type->findMethod(name) == nullptr) continue;
    type->unsafeRemoveMethod(name);
    const c10::QualifiedName qualified(*type->name(), name);
    if (cu->find_function(qualified) != nullptr) {
      cu->unsafeRemoveMethod(qualified);
    }
  }
}

// The methods only `type`'s forward calls, forward first.
std::vector<std::string> ForwardAndHelpers(const c10::ClassType& type) {
  std::vector<std::string> names = {"forward"};
  for (const std::string& name : OldForwardMethods(type)) {
    names.push_back(name);
  }
  std::sort(names.begin() + 1, names.end());
  return names;
}

}  // namespace

// Replaces `type`'s forward by `graph`; with `drop_helpers`, also removes
// the methods only the old forward called (they would call the children's
// new forwards the old way).
void InstallForward(const c10::ClassTypePtr& type,
                    const std::shared_ptr<Graph>& graph,
                    const c10::FunctionSchema& schema, bool drop_helpers) {
  RemoveMethods(type, drop_helpers ? ForwardAndHelpers(*type)
                                   : std::vector<std::string>{"forward"});
  torch::jit::Function* fn = type->compilation_unit()->create_function(
      c10::QualifiedName(*type->name(), "forward"), graph);
  fn->setSchema(schema);
  type->addMethod(fn);
}

// After outlining: a module that kept its old forward but whose forward (or
// a helper of it) calls an outlined forward the old way loses them, and so
// on up. The graph never calls those; the saved file must still compile.
void RemoveStaleForwards(const c10::ClassTypePtr& root,
                         const std::vector<c10::ClassTypePtr>& outlined) {
  absl::flat_hash_set<const c10::ClassType*> changed;
  for (const c10::ClassTypePtr& type : outlined) changed.insert(type.get());
  const std::vector<c10::ClassTypePtr> all = ModuleTypes(root);
  for (bool again = true; again;) {
    again = false;
    for (const c10::ClassTypePtr& type : all) {
      if (type == root || changed.contains(type.get()) ||
          type->findMethod("forward") == nullptr) {
        continue;
      }
      const std::vector<std::string> methods = ForwardAndHelpers(*type);
      bool stale = false;
      for (const std::string& name : methods) {
        torch::jit::Function* fn = type->findMethod(name);
        if (fn == nullptr || !fn->isGraphFunction()) continue;
        for (const torch::jit::Node* call :
             MethodCalls(*torch::jit::toGraphFunction(*fn).graph())) {
          stale |= changed.contains(
              call->input(0)->type()->castRaw<c10::ClassType>());
        }
      }
      if (!stale) continue;
      RemoveMethods(type, methods);
      changed.insert(type.get());
      again = true;
    }
  }
}

absl::Status Lowerer::LowerOne(const ir::Node& node) {
  if (node.op() == ir::OpKind::kPlaceholder || frame_.values.contains(&node)) {
    return absl::OkStatus();
  }
  return TorchCall(node.Describe(), [&] { return Lower(node); });
}

const ir::ScopeEntry* Lowerer::ChildOf(const ir::Node& node,
                                       size_t depth) const {
  if (!keep_hierarchy()) return nullptr;
  const std::vector<ir::ScopeEntry>& stack = node.scope().stack();
  if (stack.size() <= depth) return nullptr;
  const ir::ScopeEntry& entry = stack[depth];
  if (node.op() == ir::OpKind::kCallModule && node.target() == entry.path) {
    return nullptr;  // The leaf itself.
  }
  if (!IsBelow(entry.path, frame_.path)) return nullptr;
  return &entry;
}

absl::Status Lowerer::LowerNodes(absl::Span<const ir::Node* const> nodes,
                                 size_t depth) {
  absl::flat_hash_map<std::string, int> runs;
  const ir::ScopeEntry* previous = nullptr;
  for (const ir::Node* node : nodes) {
    const ir::ScopeEntry* child = ChildOf(*node, depth);
    if (child != nullptr &&
        (previous == nullptr || previous->path != child->path)) {
      ++runs[child->path];
    }
    previous = child;
  }
  for (size_t i = 0; i < nodes.size();) {
    const ir::ScopeEntry* child = ChildOf(*nodes[i], depth);
    if (child == nullptr) {
      RETURN_IF_ERROR(LowerOne(*nodes[i]));
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < nodes.size()) {
      const ir::ScopeEntry* next = ChildOf(*nodes[end], depth);
      if (next == nullptr || next->path != child->path) break;
      ++end;
    }
    absl::Span<const ir::Node* const> run = nodes.subspan(i, end - i);
    bool outlined = false;
    if (runs[child->path] == 1) {
      ASSIGN_OR_RETURN(outlined, Outline(run, child->path, depth + 1));
    }
    if (!outlined) RETURN_IF_ERROR(LowerNodes(run, depth + 1));
    i = end;
  }
  return absl::OkStatus();
}

c10::ClassTypePtr Lowerer::ModuleTypeAt(absl::string_view path) const {
  c10::ClassTypePtr type = self_type_;
  if (path.empty()) return type;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    const std::string name(part);
    if (!type->hasAttribute(name)) return nullptr;
    type = type->getAttribute(name)->cast<c10::ClassType>();
    if (type == nullptr || !type->is_module()) return nullptr;
  }
  return type;
}

absl::Status Lowerer::KeptTypes() {
  const std::vector<c10::ClassTypePtr> all = ModuleTypes(self_type_);
  std::vector<c10::ClassTypePtr> kept;
  auto keep = [&](const c10::ClassTypePtr& type) {
    if (type != nullptr && type != self_type_ &&
        kept_types_.insert(type.get()).second) {
      kept.push_back(type);
    }
  };
  for (const ir::Node* node : gm_.graph().nodes()) {
    if (node->op() == ir::OpKind::kCallModule ||
        node->op() == ir::OpKind::kGetAttr) {
      keep(ModuleTypeAt(node->target()));
    }
  }
  for (const c10::ClassTypePtr& type : all) {
    if (type != self_type_ && HasHooksOrState(*type)) keep(type);
    const absl::flat_hash_set<std::string> dead = OldForwardMethods(*type);
    std::vector<torch::jit::Function*> live;
    for (torch::jit::Function* fn : type->methods()) {
      if (fn->name() != "forward" && !dead.contains(fn->name())) {
        live.push_back(fn);
      }
    }
    for (const auto* hooks :
         {&type->getForwardHooks(), &type->getForwardPreHooks()}) {
      live.insert(live.end(), hooks->begin(), hooks->end());
    }
    // What they call must stay as it is: forward on self, anything on
    // children (their other methods may call their forward).
    for (torch::jit::Function* fn : live) {
      if (!fn->isGraphFunction()) continue;
      const std::shared_ptr<Graph> graph =
          torch::jit::toGraphFunction(*fn).graph();
      for (const torch::jit::Node* call : MethodCalls(*graph)) {
        if (call->input(0) != graph->inputs()[0]) {
          keep(call->input(0)->type()->cast<c10::ClassType>());
        } else if (call->s(c10::attr::name) == "forward") {
          keep(type);
        }
      }
    }
  }
  // Inside a kept module, everything stays.
  for (size_t i = 0; i < kept.size(); ++i) {
    for (const c10::TypePtr& attr : kept[i]->containedTypes()) {
      auto type = attr->cast<c10::ClassType>();
      if (type != nullptr && type->is_module()) keep(type);
    }
  }
  return absl::OkStatus();
}

c10::ClassTypePtr Lowerer::OwnType(const std::string& path) {
  const size_t dot = path.rfind('.');
  const std::string parent_path =
      dot == std::string::npos ? "" : path.substr(0, dot);
  const std::string name = path.substr(dot + 1);
  c10::ivalue::Object* parent = root_->_ivalue().get();
  if (!parent_path.empty()) {
    for (absl::string_view part : absl::StrSplit(parent_path, '.')) {
      parent = parent->getAttr(std::string(part)).toObject().get();
    }
  }
  const c10::ClassTypePtr parent_type = parent->type();
  if (instances_[parent_type.get()] != 1) return nullptr;
  const c10::intrusive_ptr<c10::ivalue::Object> old =
      parent->getAttr(name).toObject();
  const c10::ClassTypePtr type = old->type();
  if (type->methods().size() != 1 || HasHooksOrState(*type)) return nullptr;
  std::shared_ptr<torch::jit::CompilationUnit> cu = type->compilation_unit();
  c10::ClassTypePtr own =
      c10::ClassType::create(cu->mangle(*type->name()), cu, /*is_module=*/true);
  cu->register_type(own);
  for (size_t i = 0; i < type->numAttributes(); ++i) {
    own->addAttribute(type->getAttributeName(i), type->getAttribute(i),
                      type->is_parameter(i), type->is_buffer(i));
  }
  for (size_t i = 0; i < type->numConstants(); ++i) {
    own->addConstant(type->getConstantName(i), type->getConstant(i));
  }
  auto object = c10::ivalue::Object::create(c10::StrongTypePtr(cu, own),
                                            type->numAttributes());
  for (size_t i = 0; i < type->numAttributes(); ++i) {
    object->setSlot(i, old->getSlot(i));
  }
  parent->setAttr(name, object);
  parent_type->unsafeChangeAttributeType(name, own);
  instances_[own.get()] = 1;
  // GetAttr chains cached for the old object have its old type.
  const std::string relative =
      frame_.path.empty() ? path : path.substr(frame_.path.size() + 1);
  absl::erase_if(frame_.attrs, [&](const auto& entry) {
    return entry.first == relative ||
           absl::StartsWith(entry.first, relative + ".");
  });
  return own;
}

absl::StatusOr<bool> Lowerer::Outline(absl::Span<const ir::Node* const> run,
                                      const std::string& path, size_t depth) {
  c10::ClassTypePtr type = ModuleTypeAt(path);
  if (type == nullptr || type == self_type_ ||
      kept_types_.contains(type.get())) {
    return false;
  }
  // get_attr of tensors outside the module are read by the caller.
  absl::flat_hash_set<const ir::Node*> body;
  std::vector<const ir::Node*> body_nodes, outside_attrs;
  for (const ir::Node* node : run) {
    switch (node->op()) {
      case ir::OpKind::kGetAttr:
        if (!IsBelow(node->target(), path)) {
          outside_attrs.push_back(node);
          continue;
        }
        break;
      case ir::OpKind::kCallModule:
        if (!IsBelow(node->target(), path)) return false;
        break;
      case ir::OpKind::kCallFunction:
        break;
      default:
        return false;
    }
    body.insert(node);
    body_nodes.push_back(node);
  }
  std::vector<const ir::Node*> inputs;
  absl::flat_hash_set<const ir::Node*> seen;
  std::function<void(const ir::Argument&)> visit =
      [&](const ir::Argument& arg) {
        if (arg.is_node()) {
          if (!body.contains(arg.node()) && seen.insert(arg.node()).second) {
            inputs.push_back(arg.node());
          }
        } else if (arg.kind() == ir::Argument::Kind::kList ||
                   arg.kind() == ir::Argument::Kind::kTuple) {
          for (const ir::Argument& e : arg.elements()) visit(e);
        }
      };
  for (const ir::Node* node : body_nodes) {
    for (const ir::Argument& arg : node->args()) visit(arg);
    for (const auto& [name, arg] : node->kwargs()) visit(arg);
  }
  std::sort(inputs.begin(), inputs.end(),
            [&](const ir::Node* a, const ir::Node* b) {
              return position_.at(a) < position_.at(b);
            });
  std::vector<const ir::Node*> outputs;
  for (const ir::Node* node : body_nodes) {
    for (const ir::Node* user : node->users()) {
      if (!body.contains(user)) {
        outputs.push_back(node);
        break;
      }
    }
  }
  if (outputs.empty()) return false;
  for (const ir::Node* node : outside_attrs) RETURN_IF_ERROR(LowerOne(*node));
  std::vector<Value*> arguments;
  for (const ir::Node* input : inputs) {
    auto it = frame_.values.find(input);
    if (it == frame_.values.end()) return false;  // Lowered flat, it fails.
    arguments.push_back(WholeValue(it->second));
  }

  Frame child;
  child.graph = std::make_shared<Graph>();
  child.path = path;
  child.self = child.graph->addInput("self")->setType(type);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Value* v = child.graph->addInput()->setType(arguments[i]->type());
    SetName(v, inputs[i]->name());
    child.values[inputs[i]].value = v;
  }
  std::swap(frame_, child);
  absl::Status lowered = LowerNodes(body_nodes, depth);
  if (lowered.ok()) {
    lowered = TorchCall("outlining module '" + path + "'", [&] {
      std::vector<Value*> results;
      for (const ir::Node* node : outputs) {
        results.push_back(WholeValue(frame_.values.at(node)));
      }
      frame_.graph->registerOutput(
          results.size() == 1
              ? results[0]
              : frame_.graph->insertNode(frame_.graph->createTuple(results))
                    ->output());
      torch::jit::EliminateDeadCode(frame_.graph);
      frame_.graph->lint();
    });
  }
  std::swap(frame_, child);
  RETURN_IF_ERROR(lowered);
  const std::shared_ptr<Graph>& graph = child.graph;

  // One forward per type: instances share it only if it is the same.
  ASSIGN_OR_RETURN(
      std::string text, TorchCall("outlining", [&] {
        return torch::jit::Canonicalize(graph, false)->toString(false);
      }));
  auto [it, inserted] = installed_.try_emplace(type.get(), text);
  if (!inserted && it->second != text) {
    ASSIGN_OR_RETURN(type,
                     TorchCall("giving module '" + path + "' a type of its own",
                               [&] { return OwnType(path); }));
    if (type == nullptr) return false;
    graph->inputs()[0]->setType(type);
    inserted = true;
  }
  std::vector<c10::Argument> schema_args = {c10::Argument("self", type)};
  for (size_t i = 1; i < graph->inputs().size(); ++i) {
    schema_args.emplace_back(graph->inputs()[i]->debugName(),
                             graph->inputs()[i]->type());
  }
  c10::FunctionSchema schema("forward", "", std::move(schema_args),
                             {c10::Argument("", graph->outputs()[0]->type())});
  if (inserted) {
    RETURN_IF_ERROR(
        TorchCall("installing the forward of module '" + path + "'",
                  [&] { InstallForward(type, graph, schema, true); }));
    outlined_.push_back(type);
  }
  outlined_paths_.push_back(path);
  RETURN_IF_ERROR(
      TorchCall("calling module '" + path + "'", [&]() -> absl::Status {
        ASSIGN_OR_RETURN(Value * module, Attr(*run.front(), path, true));
        std::vector<NamedValue> args = {NamedValue(module)};
        for (Value* v : arguments) args.emplace_back(v);
        torch::jit::MatchedSchema matched = torch::jit::matchSchema(
            schema, torch::jit::SourceRange(), *frame_.graph, args, {});
        Value* result = frame_.graph->insertMethodCall("forward", matched);
        std::vector<Value*> results = {result};
        if (outputs.size() > 1) {
          results =
              frame_.graph->insertNode(frame_.graph->createTupleUnpack(result))
                  ->outputs()
                  .vec();
        }
        for (size_t i = 0; i < outputs.size(); ++i) {
          SetName(results[i], outputs[i]->name());
          frame_.values[outputs[i]] = Lowered{results[i], {}};
        }
        return absl::OkStatus();
      }));
  return true;
}

}  // namespace tracecut::runtime::internal
