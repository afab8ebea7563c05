#include "runtime/lowering.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/schema_matching.h>
#include <torch/csrc/jit/ir/named_value.h>
#include <torch/csrc/jit/passes/canonicalize.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "runtime/op_schema.h"
#include "runtime/prune_unused.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

using torch::jit::Graph;
using torch::jit::NamedValue;
using torch::jit::Value;

// A lowered IR value: one Value, or the outputs of a multi-output operator
// (read with getitem; packed into a tuple only if used whole).
struct Lowered {
  Value* value = nullptr;
  std::vector<Value*> outputs;
};

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

class Lowerer {
 public:
  // `root`, the object of `self_type`, is needed to outline (and may then
  // change: an instance whose forward differs from its type's gets a type of
  // its own); without it the result is flat.
  Lowerer(const GraphModule& gm, c10::ClassTypePtr self_type,
          const LoweringOptions& options, torch::jit::Module* root = nullptr)
      : gm_(gm),
        self_type_(std::move(self_type)),
        options_(options),
        root_(root) {
    frame_.graph = std::make_shared<Graph>();
  }

  absl::StatusOr<std::shared_ptr<Graph>> Run() {
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

  // The module types that got an outlined forward, in order.
  const std::vector<c10::ClassTypePtr>& outlined() const { return outlined_; }
  // The paths of the module instances whose forward runs outlined nodes.
  const std::vector<std::string>& outlined_paths() const {
    return outlined_paths_;
  }

 private:
  // Note [Keeping the module hierarchy]
  // With LoweringOptions::keep_hierarchy, the nodes of one call of a module
  // (consecutive nodes whose scope holds it) become that module's forward,
  // and its parent calls it, so that a saved model traces again to the same
  // scopes. A module's nodes stay inline in its parent (as without the
  // option) when they cannot be outlined exactly:
  //  * its type's forward must stay as it is (KeptTypes): a leaf, a module
  //    read by get_attr, one whose forward a kept method calls, one with
  //    hooks or __getstate__, or anything inside those;
  //  * its nodes are not one run (called twice, or interleaved by a pass),
  //    call_method, call a module outside it, or return nothing;
  //  * another instance of its type got a different forward (types share
  //    methods), e.g. a pass changed one layer only.
  // Tensors outside the module (tied weights, lifted constants) are read by
  // the caller and passed in.

  absl::Status LowerOne(const ir::Node& node) {
    if (node.op() == ir::OpKind::kPlaceholder ||
        frame_.values.contains(&node)) {
      return absl::OkStatus();
    }
    return TorchCall(node.Describe(), [&] { return Lower(node); });
  }

  // The module, below the frame's, that `node` belongs to at scope depth
  // `depth`, or null when it is lowered in the frame itself.
  const ir::ScopeEntry* ChildOf(const ir::Node& node, size_t depth) const {
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

  bool keep_hierarchy() const {
    return options_.keep_hierarchy && root_ != nullptr;
  }

  // True if `path` is strictly inside module `module` ("" = the root).
  static bool IsBelow(absl::string_view path, absl::string_view module) {
    if (module.empty()) return !path.empty();
    return path.size() > module.size() && absl::StartsWith(path, module) &&
           path[module.size()] == '.';
  }

  absl::Status LowerNodes(absl::Span<const ir::Node* const> nodes,
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

  // The type of the module at `path` from the root, or null.
  c10::ClassTypePtr ModuleTypeAt(absl::string_view path) const {
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

  // Types whose forward stays: see Note [Keeping the module hierarchy].
  absl::Status KeptTypes() {
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

  // Gives the instance at `path` a fresh copy of its type (attributes and
  // constants; its methods are its type's old forward, now replaced, and
  // helpers, now removed), so that it can get a forward of its own. Null
  // when that would change other instances: its parent's type is shared, or
  // its type has other methods.
  c10::ClassTypePtr OwnType(const std::string& path) {
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
    c10::ClassTypePtr own = c10::ClassType::create(cu->mangle(*type->name()),
                                                   cu, /*is_module=*/true);
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

  // Outlines `run` (the nodes of the module at `path`) into that module's
  // forward and calls it; false if it cannot be (Note [Keeping the module
  // hierarchy]), with nothing but dead values added to the frame.
  absl::StatusOr<bool> Outline(absl::Span<const ir::Node* const> run,
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
      ASSIGN_OR_RETURN(
          type, TorchCall("giving module '" + path + "' a type of its own",
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
    c10::FunctionSchema schema(
        "forward", "", std::move(schema_args),
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
            results = frame_.graph
                          ->insertNode(frame_.graph->createTupleUnpack(result))
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

 private:
  absl::Status AddInputs() {
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

  // The module's current forward schema when its arguments match the
  // placeholders by name.
  const c10::FunctionSchema* OriginalSchemaIfMatching() const {
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

  static void SetName(Value* v, const std::string& name) {
    // IR names are identifiers; TorchScript rejects only empty and numeric
    // debug names.
    const bool numeric =
        !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
          return c >= '0' && c <= '9';
        });
    if (!name.empty() && !numeric && name != "self") {
      v->setDebugName(name);
    }
  }

  absl::Status Lower(const ir::Node& node) {
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

  // The value at a dotted path from self; GetAttr nodes are shared per
  // prefix.
  absl::StatusOr<Value*> Attr(const ir::Node& node, const std::string& path,
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
            absl::StrCat(node.Describe(), ": bad attribute path '", path,
                         "': '", where, "' is not a module"));
      }
      if (!type->hasAttribute(name)) {
        return absl::NotFoundError(
            absl::StrCat(node.Describe(), ": bad attribute path '", path,
                         "': module '", where, "' (", ShortTypeName(*type),
                         ") has no attribute '", name, "'"));
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

  // A single Value for a lowered node (tuple of outputs if multi-output).
  Value* WholeValue(Lowered& l) {
    if (l.value == nullptr) {
      l.value = frame_.graph->insertNode(frame_.graph->createTuple(l.outputs))
                    ->output();
    }
    return l.value;
  }

  // A Value for an Argument where the consumer expects `type` (may be null
  // or generic).
  absl::StatusOr<Value*> ValueFor(const ir::Node& node, const ir::Argument& arg,
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
            return absl::InvalidArgumentError(absl::StrCat(
                node.Describe(),
                ": list elements have no common type: ", why.str()));
          }
          elem = *unified;
        }
        return frame_.graph
            ->insertNode(frame_.graph->createList(elem, elements))
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

  // Named values for `schema`'s arguments from `first` on.
  absl::StatusOr<std::vector<NamedValue>> SchemaInputs(
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

  absl::Status LowerOperator(const ir::Node& node) {
    absl::StatusOr<std::shared_ptr<torch::jit::Operator>> op =
        ResolveOperator(node.target());
    if (!op.ok()) {
      return absl::Status(
          op.status().code(),
          absl::StrCat(node.Describe(), ": ", op.status().message()));
    }
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

  absl::Status LowerGetItem(const ir::Node& node) {
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
    if (index.kind() == ir::Argument::Kind::kInt &&
        container.value == nullptr) {
      const int64_t n = static_cast<int64_t>(container.outputs.size());
      int64_t i = index.as_int();
      if (i < -n || i >= n) {
        return absl::OutOfRangeError(absl::StrCat(node.Describe(), ": index ",
                                                  i, " out of range for ", n,
                                                  " outputs"));
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
                                                    i, " out of range for a ",
                                                    n, "-tuple"));
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

  absl::Status LowerCallModule(const ir::Node& node) {
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

  absl::Status LowerCallMethod(const ir::Node& node) {
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

  // `args_skip_self`: the node's args exclude self (call_module) or start
  // with it (call_method).
  absl::Status CallMethod(const ir::Node& node, Value* self,
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

  // What is being lowered into: the root's forward, or an outlined module's.
  struct Frame {
    std::shared_ptr<Graph> graph;
    Value* self = nullptr;
    std::string path;  // The module's path in the root; "" for the root.
    absl::flat_hash_map<const ir::Node*, Lowered> values;
    absl::flat_hash_map<std::string, Value*> attrs;  // By relative path.
  };

  const GraphModule& gm_;
  c10::ClassTypePtr self_type_;
  const LoweringOptions& options_;
  Frame frame_;
  // keep_hierarchy: types whose forward must stay (KeptTypes), the forward
  // installed per outlined type (canonical text, to share it between
  // instances), and those types in order.
  absl::flat_hash_set<const c10::ClassType*> kept_types_;
  torch::jit::Module* root_;
  absl::flat_hash_map<const c10::ClassType*, std::string> installed_;
  absl::flat_hash_map<const c10::ClassType*, int> instances_;
  std::vector<c10::ClassTypePtr> outlined_;
  std::vector<std::string> outlined_paths_;
  absl::flat_hash_map<const ir::Node*, size_t> position_;
};

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

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string Basename(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status ErrnoStatus(int err, const std::string& message) {
  std::string text = absl::StrCat(message, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(text);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(text);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(text);
    default:
      return absl::InternalError(text);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<torch::jit::Graph>> BuildTorchScriptGraph(
    const GraphModule& gm, const c10::ClassTypePtr& self_type,
    const LoweringOptions& options) {
  // Outlining changes the module's types: LowerToTorchScript's copy only.
  return Lowerer(gm, self_type, options).Run();
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
  Lowerer lowerer(gm, type, options, &lowered);
  ASSIGN_OR_RETURN(std::shared_ptr<torch::jit::Graph> graph, lowerer.Run());
  const std::vector<c10::ClassTypePtr>& outlined = lowerer.outlined();
  RETURN_IF_ERROR(TorchCall("installing forward", [&] {
    InstallForward(type, graph,
                   ForwardSchema(original ? &*original : nullptr, *graph),
                   /*drop_helpers=*/!outlined.empty());
    RemoveStaleForwards(type, outlined);
  }));
  if (options.prune_unused) {
    RETURN_IF_ERROR(
        PruneUnused(gm, lowered, lowerer.outlined_paths()).status());
  }
  return lowered;
}

absl::Status SaveModuleAtomically(
    const torch::jit::Module& module, const std::string& path,
    const torch::jit::ExtraFilesMap& extra_files) {
  const std::string context = absl::StrCat("cannot save '", path, "'");
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(context, ": not a file path"));
  }
  const std::string dir = Dirname(path);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat(context, ": directory '", dir, "'"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat(context, ": '", dir, "' is not a directory"));
  }
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(context, ": it is a directory"));
  }
  std::string tmp = absl::StrCat(dir, "/.", Basename(path), ".tmp.XXXXXX");
  int fd = mkstemp(tmp.data());
  if (fd < 0) {
    return ErrnoStatus(
        errno, absl::StrCat(context, ": cannot create a file in '", dir, "'"));
  }
  absl::Cleanup remove_tmp = [&tmp] { unlink(tmp.c_str()); };
  // mkstemp makes the file 0600; a saved model is readable like others.
  fchmod(fd, 0644);
  // Serialized in memory, written here: LibTorch's file writer throws from
  // its destructor when a write fails (a full disk), which terminates.
  std::ostringstream bytes;
  absl::Status serialized =
      TorchCall(context, [&] { module.save(bytes, extra_files); });
  if (!serialized.ok()) {
    close(fd);
    return serialized;
  }
  const std::string data = std::move(bytes).str();
  for (size_t done = 0; done < data.size();) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      return ErrnoStatus(err, context);
    }
    done += static_cast<size_t>(n);
  }
  const int synced = fsync(fd);
  const int sync_err = errno;
  if (close(fd) != 0 || synced != 0) {
    return ErrnoStatus(synced != 0 ? sync_err : errno, context);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, context);
  }
  std::move(remove_tmp).Cancel();
  return absl::OkStatus();
}

absl::Status SaveTorchScript(const GraphModule& gm, const std::string& path,
                             const SaveOptions& options) {
  ASSIGN_OR_RETURN(torch::jit::Module lowered,
                   LowerToTorchScript(gm, options.lowering));
  torch::jit::ExtraFilesMap files;
  if (options.include_extra_files) files = gm.extra_files();
  for (const auto& [name, content] : options.extra_files) files[name] = content;
  return SaveModuleAtomically(lowered, path, files);
}

}  // namespace tracecut::runtime
