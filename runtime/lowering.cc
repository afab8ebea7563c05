#include "runtime/lowering.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/schema_matching.h>
#include <torch/csrc/jit/ir/named_value.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "ir/status_macros.h"
#include "runtime/op_schema.h"
#include "runtime/prune_unused.h"
#include "runtime/torch_status.h"

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

class Lowerer {
 public:
  Lowerer(const GraphModule& gm, c10::ClassTypePtr self_type,
          const LoweringOptions& options)
      : gm_(gm),
        self_type_(std::move(self_type)),
        options_(options),
        graph_(std::make_shared<Graph>()) {}

  absl::StatusOr<std::shared_ptr<Graph>> Run() {
    self_ = graph_->addInput("self")->setType(self_type_);
    RETURN_IF_ERROR(AddInputs());
    for (const ir::Node* node : gm_.graph().nodes()) {
      if (node->op() == ir::OpKind::kPlaceholder) continue;
      RETURN_IF_ERROR(
          TorchCall(node->Describe(), [&] { return Lower(*node); }));
    }
    if (graph_->outputs().empty()) {
      return absl::InvalidArgumentError("graph has no output node");
    }
    RETURN_IF_ERROR(TorchCall("checking the lowered graph", [&] {
      torch::jit::EliminateDeadCode(graph_);
      graph_->lint();
    }));
    return graph_;
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
      Value* v = graph_->addInput()->setType(type);
      SetName(v, p.target());
      values_[&p].value = v;
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
        values_[&node].value = v;
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
        graph_->registerOutput(v);
        return absl::OkStatus();
      }
    }
    return absl::InternalError("unknown op kind");
  }

  // The value at a dotted path from self; GetAttr nodes are shared per
  // prefix.
  absl::StatusOr<Value*> Attr(const ir::Node& node, const std::string& path,
                              bool want_module) {
    Value* current = self_;
    std::string prefix;
    for (absl::string_view part : absl::StrSplit(path, '.')) {
      const std::string name(part);
      const std::string where = prefix.empty() ? "<root>" : prefix;
      prefix = prefix.empty() ? name : absl::StrCat(prefix, ".", name);
      auto it = attrs_.find(prefix);
      if (it != attrs_.end()) {
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
      current = graph_->insertGetAttr(current, name);
      attrs_[prefix] = current;
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
      l.value = graph_->insertNode(graph_->createTuple(l.outputs))->output();
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
      return graph_->insertConstant(v);
    }
    switch (arg.kind()) {
      case ir::Argument::Kind::kNode: {
        auto it = values_.find(arg.node());
        if (it == values_.end()) {
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
        return graph_->insertNode(graph_->createList(elem, elements))->output();
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
        return graph_->insertNode(graph_->createTuple(elements))->output();
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
        schema, torch::jit::SourceRange(), *graph_, args, kwargs);
    torch::jit::Node* n =
        graph_->create(c10::Symbol::fromQualString(schema.name()),
                       matched.inputs, matched.return_types.size());
    for (size_t i = 0; i < matched.return_types.size(); ++i) {
      n->output(i)->setType(matched.return_types[i]);
    }
    graph_->insertNode(n);
    Lowered& l = values_[&node];
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
    auto it = values_.find(node.args()[0].node());
    if (it == values_.end()) {
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
        result =
            graph_
                ->insertNode(graph_->createTupleIndex(
                    c, graph_->insertConstant(i), tuple_type->elements()[i]))
                ->output();
      } else {
        ASSIGN_OR_RETURN(Value * idx, ValueFor(node, index, nullptr));
        result = graph_->insert(
            c10::Symbol::fromQualString("aten::__getitem__"), {c, idx});
      }
    }
    values_[&node].value = result;
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
        schema, torch::jit::SourceRange(), *graph_, args, kwargs);
    Value* out = graph_->insertMethodCall(name, matched);
    SetName(out, node.name());
    values_[&node].value = out;
    return absl::OkStatus();
  }

  const GraphModule& gm_;
  c10::ClassTypePtr self_type_;
  const LoweringOptions& options_;
  std::shared_ptr<Graph> graph_;
  Value* self_ = nullptr;
  absl::flat_hash_map<const ir::Node*, Lowered> values_;
  absl::flat_hash_map<std::string, Value*> attrs_;
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
  return Lowerer(gm, self_type, options).Run();
}

absl::StatusOr<torch::jit::Module> LowerToTorchScript(
    const GraphModule& gm, const LoweringOptions& options) {
  // Fresh objects and types, same tensors: replacing forward on the copy's
  // type cannot affect gm.module().
  ASSIGN_OR_RETURN(torch::jit::Module lowered,
                   TorchCall("copying the module", [&] {
                     return gm.module().clone(/*inplace=*/true);
                   }));
  const c10::ClassTypePtr& type = lowered.type();
  ASSIGN_OR_RETURN(std::shared_ptr<torch::jit::Graph> graph,
                   BuildTorchScriptGraph(gm, type, options));
  RETURN_IF_ERROR(TorchCall("installing forward", [&] {
    std::shared_ptr<torch::jit::CompilationUnit> cu = type->compilation_unit();
    const c10::QualifiedName name(*type->name(), "forward");
    std::optional<c10::FunctionSchema> original;
    if (torch::jit::Function* old = type->findMethod("forward")) {
      original = old->getSchema();
      type->unsafeRemoveMethod("forward");
      cu->unsafeRemoveMethod(name);
    }
    torch::jit::Function* fn = cu->create_function(name, graph);
    fn->setSchema(ForwardSchema(original ? &*original : nullptr, *graph));
    type->addMethod(fn);
  }));
  if (options.prune_unused) {
    RETURN_IF_ERROR(PruneUnused(gm, lowered).status());
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
