// The tracer's handlers, one per kind of TorchScript node: each runs the
// node on its shadow values (Note [Shadow execution]) and adds what it
// computes to the IR.

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
#include "tracer/source_info_internal.h"
#include "tracer/tracer_internal.h"
#include "util/status_macros.h"

namespace tracecut::tracer::internal {
namespace {

using ir::Argument;

// A value is constant when it involves no IR node: its argument form is
// fixed whatever the inputs.
bool IsConstant(const Value& v) {
  if (v.node != nullptr || !v.attr_path.empty() || v.module.has_value()) {
    return false;
  }
  if (v.elems) {
    for (const Value& e : *v.elems) {
      if (!IsConstant(e)) return false;
    }
  }
  return true;
}

// FX-like name hint: "aten::linear" -> "linear", "aten::__getitem__" ->
// "getitem".
std::string NameHint(c10::Symbol kind) {
  std::string s = kind.toUnqualString();
  absl::string_view v = s;
  while (!v.empty() && v.front() == '_') v.remove_prefix(1);
  while (!v.empty() && v.back() == '_') v.remove_suffix(1);
  return v.empty() ? std::string("op") : std::string(v);
}

}  // namespace

absl::Status Tracer::RunNode(const jit::Node* n, Env& env) {
  static const c10::Symbol kAppend =
      c10::Symbol::fromQualString("aten::append");
  static const c10::Symbol kLen = c10::Symbol::fromQualString("aten::len");
  static const c10::Symbol kGetItem =
      c10::Symbol::fromQualString("aten::__getitem__");
  static const c10::Symbol kWarn = c10::Symbol::fromQualString("aten::warn");
  static const c10::Symbol kUnwrap =
      c10::Symbol::fromQualString("aten::_unwrap_optional");

  const c10::Symbol kind = n->kind();
  if (kind == c10::prim::Constant) return Constant(n, env);
  if (kind == c10::prim::GetAttr) return GetAttr(n, env);
  if (kind == c10::prim::CallMethod) return CallMethod(n, env);
  if (kind == c10::prim::CallFunction) return CallFunction(n, env);
  if (kind == c10::prim::If) return If(n, env);
  if (kind == c10::prim::Loop) return Loop(n, env);
  if (kind == c10::prim::ListConstruct || kind == c10::prim::TupleConstruct) {
    return Construct(n, env);
  }
  if (kind == c10::prim::ListUnpack || kind == c10::prim::TupleUnpack) {
    return Unpack(n, env);
  }
  if (kind == c10::prim::TupleIndex) return TupleIndex(n, env);
  if (kind == c10::prim::unchecked_cast ||
      kind == c10::prim::unchecked_unwrap_optional || kind == kUnwrap) {
    ASSIGN_OR_RETURN(Value * in, Lookup(env, n->input(0)));
    env[n->output()] = *in;
    return absl::OkStatus();
  }
  if (kind == c10::prim::Uninitialized) {
    env[n->output()] = Value();
    return absl::OkStatus();
  }
  if (kind == c10::prim::Print || kind == kWarn) return absl::OkStatus();
  if (kind == c10::prim::RaiseException) {
    std::string message = "an exception";
    if (n->inputs().size() > 0) {
      if (auto it = env.find(n->input(0));
          it != env.end() && it->second.concrete.isString()) {
        message = it->second.concrete.toStringRef();
      }
    }
    return NodeError(
        n, absl::StrCat("the model raises on the example inputs: ", message));
  }
  if (kind == c10::prim::SetAttr) {
    return NodeError(
        n, absl::StrCat("assigning module attribute '", n->s(c10::attr::name),
                        "' in forward is not supported"));
  }
  if (kind == c10::prim::DictConstruct) {
    return NodeError(n,
                     "dict values are not supported; return tuples "
                     "(torchscript=True / return_dict=False for HF models)");
  }
  if (kind == kAppend && n->inputs().size() == 2) {
    ASSIGN_OR_RETURN(Value * list, Lookup(env, n->input(0)));
    if (list->elems) {
      ASSIGN_OR_RETURN(Value * el, Lookup(env, n->input(1)));
      list->elems->push_back(*el);
      list->data |= el->data;
      list->shape |= el->shape;
      c10::impl::GenericList concrete = list->concrete.toList();
      concrete.push_back(el->concrete);
      env[n->output()] = *list;
      return absl::OkStatus();
    }
  }
  if (kind == kLen && n->inputs().size() == 1) {
    ASSIGN_OR_RETURN(Value * list, Lookup(env, n->input(0)));
    if (list->elems) {
      Value out;
      out.concrete = static_cast<int64_t>(list->elems->size());
      env[n->output()] = std::move(out);
      return absl::OkStatus();
    }
  }
  if (kind == kGetItem && n->inputs().size() == 2) {
    ASSIGN_OR_RETURN(Value * list, Lookup(env, n->input(0)));
    ASSIGN_OR_RETURN(Value * index, Lookup(env, n->input(1)));
    if (list->elems && IsConstant(*index) && index->concrete.isInt()) {
      ASSIGN_OR_RETURN(env[n->output()],
                       Element(*list, index->concrete.toInt(), n));
      return absl::OkStatus();
    }
  }
  return Operator(n, env);
}

// ------------------------------------------------------------- node kinds

absl::Status Tracer::Constant(const jit::Node* n, Env& env) {
  Value v;
  if (n->output()->type()->kind() != c10::TypeKind::FunctionType) {
    auto iv = jit::toIValue(n->output());
    if (!iv.has_value()) {
      return NodeError(n, absl::StrCat("unsupported constant of type ",
                                       n->output()->type()->annotation_str()));
    }
    v.concrete = *iv;
  }
  env[n->output()] = std::move(v);
  return absl::OkStatus();
}

absl::Status Tracer::GetAttr(const jit::Node* n, Env& env) {
  ASSIGN_OR_RETURN(Value * owner, Lookup(env, n->input(0)));
  const std::string& name = n->s(c10::attr::name);
  if (!owner->module.has_value()) {
    return NodeError(
        n,
        absl::StrCat("attribute '", name, "' read from a ",
                     n->input(0)->type()->annotation_str(),
                     ", not a module; only module attributes are supported"));
  }
  const jit::Module& module = *owner->module;
  if (!module.type()->hasAttribute(name)) {
    return NodeError(n, absl::StrCat("module ", TypeNameOf(module),
                                     " has no attribute '", name, "'"));
  }
  std::string path = owner->module_path.empty()
                         ? name
                         : absl::StrCat(owner->module_path, ".", name);
  c10::TypePtr type = module.type()->getAttribute(name);
  c10::IValue value = module._ivalue()->getAttr(name);
  Value v;
  if (type->is_module()) {
    v.module = jit::Module(value.toObject());
    v.module_path = std::move(path);
  } else if (value.isTensor()) {
    v.concrete = value;
    v.attr_path = std::move(path);
    if (meta_) {
      state_storages_.insert(
          MetaTwin(value.toTensor()).storage().unsafeGetStorageImpl());
    }
    v.data = true;
  } else if (value.isObject() || ContainsTensor(value)) {
    return NodeError(
        n,
        absl::StrCat("attribute '", path, "' of type ", type->annotation_str(),
                     " is not supported (only modules, tensors and "
                     "constants)"));
  } else {
    v.concrete = value;  // int/float/bool/str/None/lists of them: constant.
  }
  env[n->output()] = std::move(v);
  return absl::OkStatus();
}

absl::Status Tracer::CallMethod(const jit::Node* n, Env& env) {
  ASSIGN_OR_RETURN(Value * self, Lookup(env, n->input(0)));
  const std::string& method = n->s(c10::attr::name);
  if (!self->module.has_value()) {
    return NodeError(n, absl::StrCat("method '", method, "' called on a ",
                                     n->input(0)->type()->annotation_str(),
                                     "; only module methods are supported"));
  }
  const jit::Module module = *self->module;
  std::string type = TypeNameOf(module);
  std::vector<Value*> args;
  for (size_t i = 1; i < n->inputs().size(); ++i) {
    ASSIGN_OR_RETURN(Value * a, Lookup(env, n->input(i)));
    args.push_back(a);
  }
  if (!self->module_path.empty() && method == "forward" &&
      options_.leaf_policy.IsLeaf(self->module_path, type)) {
    ASSIGN_OR_RETURN(env[n->output()],
                     EmitCallModule(n, *self, type, std::move(args)));
    return absl::OkStatus();
  }
  auto m = module.find_method(method);
  if (!m.has_value()) {
    return NodeError(
        n, absl::StrCat("module ", type, " has no method '", method, "'"));
  }
  std::shared_ptr<jit::Graph> callee =
      jit::toGraphFunction(m->function()).graph();
  ir::Scope scope = scope_;
  if (scope.path() != self->module_path || scope.empty()) {
    scope = scope.Push(ir::ScopeEntry{self->module_path, type});
  }
  std::vector<Value> inputs;
  inputs.push_back(*self);
  for (Value* a : args) inputs.push_back(*a);
  ASSIGN_OR_RETURN(std::vector<Value> outs,
                   InlineGraph(*callee, std::move(inputs), std::move(scope)));
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    env[n->outputs()[i]] = std::move(outs[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Tracer::EmitCallModule(const jit::Node* n,
                                             const Value& self,
                                             const std::string& type,
                                             std::vector<Value*> args) {
  jit::Module module = *self.module;
  jit::Method forward = module.get_method("forward");
  const std::vector<c10::Argument>& schema =
      forward.function().getSchema().arguments();
  std::vector<Argument> ir_args;
  std::vector<c10::IValue> stack;
  bool any_shape = false;
  for (size_t i = 0; i < args.size(); ++i) {
    c10::TypePtr t = i + 1 < schema.size() ? schema[i + 1].real_type()
                                           : n->input(i + 1)->type();
    ASSIGN_OR_RETURN(Argument a, ToArgument(*args[i], t));
    ir_args.push_back(std::move(a));
    stack.push_back(args[i]->concrete);
    any_shape |=
        args[i]->shape || (!ContainsTensor(args[i]->concrete) && args[i]->data);
  }
  c10::IValue result;
  try {
    // Each trace's clone has new method objects: the profiling executor
    // would optimise every leaf's forward anew for one call (a quarter of
    // the trace's time on a 32-layer Llama). Later calls, e.g. the
    // interpreter's, still get the optimised plan.
    jit::GraphOptimizerEnabledGuard no_optimization(false);
    result = meta_ ? RunLeafOnMeta(module, forward, std::move(stack))
                   : forward(std::move(stack));
  } catch (const c10::Error& e) {
    return NodeError(n, absl::StrCat("leaf module '", self.module_path,
                                     "' failed on the example inputs: ",
                                     FirstLine(e.what_without_backtrace())));
  }
  ir::Scope leaf_scope = scope_.Push(ir::ScopeEntry{self.module_path, type});
  ASSIGN_OR_RETURN(ir::Node * node,
                   AddNode(ir::OpKind::kCallModule, self.module_path,
                           std::move(ir_args), self.module_path, n, &result));
  node->set_scope(std::move(leaf_scope));
  Value out;
  out.node = node;
  out.concrete = std::move(result);
  out.data = true;  // Parameters went in.
  out.shape = any_shape;
  return out;
}

absl::Status Tracer::CallFunction(const jit::Node* n, Env& env) {
  auto fn_type = n->input(0)->type()->cast<c10::FunctionType>();
  if (fn_type == nullptr) {
    return NodeError(n, "prim::CallFunction on a value that is not a function");
  }
  jit::Function* fn = fn_type->function();
  if (fn == nullptr || !fn->isGraphFunction()) {
    return NodeError(n, "call of a function without a TorchScript graph");
  }
  std::shared_ptr<jit::Graph> callee = jit::toGraphFunction(*fn).graph();
  std::vector<Value> inputs;
  for (size_t i = 1; i < n->inputs().size(); ++i) {
    ASSIGN_OR_RETURN(Value * a, Lookup(env, n->input(i)));
    inputs.push_back(*a);
  }
  ASSIGN_OR_RETURN(std::vector<Value> outs,
                   InlineGraph(*callee, std::move(inputs), scope_));
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    env[n->outputs()[i]] = std::move(outs[i]);
  }
  return absl::OkStatus();
}

absl::Status Tracer::If(const jit::Node* n, Env& env) {
  ASSIGN_OR_RETURN(Value * cond, Lookup(env, n->input(0)));
  if (cond->data) return DataDependent(n, "condition of `if`", n->input(0));
  if (!cond->concrete.isBool()) {
    return NodeError(n, absl::StrCat("condition is a ",
                                     cond->concrete.tagKind(), ", not a bool"));
  }
  const bool taken = cond->concrete.toBool();
  if (!IsConstant(*cond)) {
    std::string where;
    if (std::optional<SourceInfo> src = SourceOf(n)) {
      where = absl::StrCat(" at ", src->file, ":", src->line);
    }
    Assume(absl::StrCat(ConditionText(n, n->input(0)), where, " in ",
                        scope_.path().empty() ? "<root>" : scope_.path(),
                        " (took ", taken ? "then" : "else", "-branch)"));
  }
  const jit::Block* block = n->blocks()[taken ? 0 : 1];
  RETURN_IF_ERROR(RunBlock(block, env));
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    ASSIGN_OR_RETURN(Value * out, Lookup(env, block->outputs()[i]));
    Value copy = *out;
    env[n->outputs()[i]] = std::move(copy);
  }
  return absl::OkStatus();
}

absl::Status Tracer::Loop(const jit::Node* n, Env& env) {
  ASSIGN_OR_RETURN(Value * trip, Lookup(env, n->input(0)));
  ASSIGN_OR_RETURN(Value * start, Lookup(env, n->input(1)));
  if (trip->data) return DataDependent(n, "trip count of a loop", n->input(0));
  if (start->data) return DataDependent(n, "condition of a loop", n->input(1));
  if (!trip->concrete.isInt() || !start->concrete.isBool()) {
    return NodeError(n, "loop without an int trip count and a bool condition");
  }
  const int64_t max_trip = trip->concrete.toInt();
  bool cond = start->concrete.toBool();
  bool specialised = !IsConstant(*trip) || !IsConstant(*start);
  std::vector<Value> carried;
  for (size_t i = 2; i < n->inputs().size(); ++i) {
    ASSIGN_OR_RETURN(Value * v, Lookup(env, n->input(i)));
    carried.push_back(*v);
  }
  const jit::Block* body = n->blocks()[0];
  int64_t iterations = 0;
  for (; iterations < max_trip && cond; ++iterations) {
    if (iterations >= options_.max_unroll) {
      return NodeError(n,
                       absl::StrCat("loop runs more than ", options_.max_unroll,
                                    " iterations; not unrolled"));
    }
    Value counter;
    counter.concrete = iterations;
    env[body->inputs()[0]] = std::move(counter);
    for (size_t k = 0; k < carried.size(); ++k) {
      env[body->inputs()[k + 1]] = carried[k];
    }
    RETURN_IF_ERROR(RunBlock(body, env));
    ASSIGN_OR_RETURN(Value * next, Lookup(env, body->outputs()[0]));
    if (next->data) {
      return DataDependent(n, "condition of a loop", body->outputs()[0]);
    }
    if (!next->concrete.isBool()) {
      return NodeError(n, "loop condition is not a bool");
    }
    specialised |= !IsConstant(*next);
    cond = next->concrete.toBool();
    std::vector<Value> next_carried;
    for (size_t k = 0; k < carried.size(); ++k) {
      ASSIGN_OR_RETURN(Value * v, Lookup(env, body->outputs()[k + 1]));
      next_carried.push_back(*v);
    }
    carried = std::move(next_carried);
  }
  for (size_t k = 0; k < carried.size(); ++k) {
    env[n->outputs()[k]] = std::move(carried[k]);
  }
  if (specialised) {
    std::string where;
    if (std::optional<SourceInfo> src = SourceOf(n)) {
      where = absl::StrCat(" at ", src->file, ":", src->line);
    }
    Assume(absl::StrCat(
        "loop", where, " in ", scope_.path().empty() ? "<root>" : scope_.path(),
        " ran ", iterations, " iterations (count from input shapes)"));
  }
  return absl::OkStatus();
}

absl::Status Tracer::Construct(const jit::Node* n, Env& env) {
  Value out;
  out.elems = std::make_shared<Seq>();
  out.is_tuple = n->kind() == c10::prim::TupleConstruct;
  std::vector<c10::IValue> concrete;
  for (const jit::Value* in : n->inputs()) {
    ASSIGN_OR_RETURN(Value * v, Lookup(env, in));
    if (v->module.has_value()) {
      return NodeError(n, "modules in lists or tuples are not supported");
    }
    out.elems->push_back(*v);
    out.data |= v->data;
    out.shape |= v->shape;
    concrete.push_back(v->concrete);
  }
  if (out.is_tuple) {
    out.concrete = c10::ivalue::Tuple::create(std::move(concrete));
  } else {
    auto list_type = n->output()->type()->cast<c10::ListType>();
    if (list_type == nullptr) return NodeError(n, "list of unknown type");
    c10::impl::GenericList list(list_type->getElementType());
    for (c10::IValue& c : concrete) list.push_back(std::move(c));
    out.concrete = std::move(list);
  }
  env[n->output()] = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<Value> Tracer::Element(const Value& seq, int64_t index,
                                      const jit::Node* origin) {
  if (seq.elems) {
    const int64_t size = static_cast<int64_t>(seq.elems->size());
    int64_t i = index < 0 ? index + size : index;
    if (i < 0 || i >= size) {
      return NodeError(origin,
                       absl::StrCat("index ", index,
                                    " out of range for a sequence of ", size));
    }
    return (*seq.elems)[static_cast<size_t>(i)];
  }
  c10::IValue element;
  int64_t size = 0;
  if (seq.concrete.isTuple()) {
    const auto& elements = seq.concrete.toTupleRef().elements();
    size = static_cast<int64_t>(elements.size());
    int64_t i = index < 0 ? index + size : index;
    if (i >= 0 && i < size) element = elements[static_cast<size_t>(i)];
    index = i;
  } else if (seq.concrete.isList()) {
    c10::ArrayRef<c10::IValue> elements = seq.concrete.toListRef();
    size = static_cast<int64_t>(elements.size());
    int64_t i = index < 0 ? index + size : index;
    if (i >= 0 && i < size) element = elements[static_cast<size_t>(i)];
    index = i;
  } else {
    return NodeError(origin, absl::StrCat("indexing a ", seq.concrete.tagKind(),
                                          ", not a list or tuple"));
  }
  if (index < 0 || index >= size) {
    return NodeError(
        origin, absl::StrCat("index out of range for a sequence of ", size));
  }
  Value out;
  out.concrete = element;
  out.data = seq.data;
  out.shape = seq.shape;
  if (seq.node != nullptr) {
    ASSIGN_OR_RETURN(out.node,
                     AddNode(ir::OpKind::kCallFunction, "getitem",
                             {Argument::Ref(seq.node), Argument::Int(index)},
                             "getitem", origin, &element));
  } else if (!IsConstant(seq)) {
    return NodeError(origin, "indexing a sequence without an IR value");
  }
  return out;
}

absl::Status Tracer::Unpack(const jit::Node* n, Env& env) {
  ASSIGN_OR_RETURN(Value * seq, Lookup(env, n->input(0)));
  Value copy = *seq;  // env may grow while we add outputs.
  for (size_t i = 0; i < n->outputs().size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Element(copy, static_cast<int64_t>(i), n));
    env[n->outputs()[i]] = std::move(v);
  }
  return absl::OkStatus();
}

absl::Status Tracer::TupleIndex(const jit::Node* n, Env& env) {
  ASSIGN_OR_RETURN(Value * seq, Lookup(env, n->input(0)));
  ASSIGN_OR_RETURN(Value * index, Lookup(env, n->input(1)));
  if (index->data || !index->concrete.isInt()) {
    return NodeError(n, "tuple index is not a constant int");
  }
  Value copy = *seq;
  ASSIGN_OR_RETURN(Value v, Element(copy, index->concrete.toInt(), n));
  env[n->output()] = std::move(v);
  return absl::OkStatus();
}

namespace {

// Where an operator's outputs come from (Note [Shadow execution]): whether
// they depend on tensor data or shapes, and whether they fold to constants.
struct Provenance {
  bool out_tensor = false;
  bool meta_query = false;
  bool all_constant = true;
  bool data = false;
  bool shape = false;
};

Provenance ProvenanceOf(c10::Symbol kind, const c10::FunctionSchema& schema,
                        const std::vector<Value*>& inputs,
                        const jit::Stack& stack, bool on_meta) {
  Provenance p;
  bool tensor_data = false, tensor_shape = false, scalar_data = false;
  for (Value* v : inputs) {
    p.all_constant &= IsConstant(*v);
    if (ContainsTensor(v->concrete)) {
      tensor_data |= v->data;
      tensor_shape |= v->shape;
    } else {
      scalar_data |= v->data;
    }
  }
  for (const c10::IValue& o : stack) p.out_tensor |= ContainsTensor(o);
  p.meta_query = IsMetaQuery(kind);
  if (on_meta && !p.out_tensor && !p.meta_query && !IsShapeQuery(kind)) {
    for (const c10::IValue& o : stack) {
      if (!o.isNone()) {
        throw MetaRefusal(absl::StrCat(OperatorName(schema),
                                       " needs the values of tensor data"));
      }
    }
  }
  if (p.meta_query) {
    p.data = p.shape = false;
  } else if (IsShapeQuery(kind)) {
    p.data = p.shape = tensor_shape || scalar_data;
  } else if (p.out_tensor) {
    p.data = tensor_data || scalar_data;
    // where(cond, x, y) broadcasts; only where(cond) is shaped by data.
    static const c10::Symbol kWhere =
        c10::Symbol::fromQualString("aten::where");
    p.shape = tensor_shape || scalar_data ||
              (HasDataDependentShape(kind) && tensor_data &&
               !(kind == kWhere && inputs.size() > 1));
  } else {
    p.data = p.shape = tensor_data || tensor_shape || scalar_data;
  }
  return p;
}

}  // namespace

absl::Status Tracer::Operator(const jit::Node* n, Env& env) {
  const c10::FunctionSchema* schema = n->maybeSchema();
  if (schema == nullptr) {
    return NodeError(
        n, absl::StrCat("unsupported TorchScript node ",
                        n->kind().toQualString(), " (no operator schema)"));
  }
  const c10::Symbol kind = n->kind();
  std::vector<Value*> inputs;
  for (const jit::Value* in : n->inputs()) {
    ASSIGN_OR_RETURN(Value * v, Lookup(env, in));
    if (v->module.has_value()) {
      return NodeError(n, "a module passed to an operator is not supported");
    }
    inputs.push_back(v);
  }

  // Lists built in the graph are tracked element by element; an operator
  // that writes into one (other than append, handled above) would make
  // that view stale.
  const std::vector<c10::Argument>& formals = schema->arguments();
  for (size_t i = 0; i < inputs.size() && i < formals.size(); ++i) {
    const c10::AliasInfo* alias = formals[i].alias_info();
    if (inputs[i]->elems && !inputs[i]->is_tuple && alias != nullptr &&
        alias->isWrite()) {
      return NodeError(
          n, absl::StrCat("in-place list operation ", OperatorName(*schema),
                          " on a list built in the model is not "
                          "supported"));
    }
  }

  // Shadow execution (Note [Shadow execution]).
  auto op_it = operations_.find(n);
  if (op_it == operations_.end()) {
    op_it = operations_.emplace(n, n->getOperation()).first;
  }
  // In meta mode, on meta tensors when any input is data.
  bool on_meta = false;
  if (meta_) {
    for (Value* v : inputs) on_meta |= v->data;
  }
  jit::Stack stack;
  if (on_meta) {
    stack = RunOnMeta(n, *schema, op_it->second, inputs);
  } else {
    for (Value* v : inputs) stack.push_back(v->concrete);
    if (schema->is_vararg()) {
      stack.emplace_back(static_cast<int64_t>(inputs.size()));
    }
    op_it->second(stack);
  }
  if (stack.size() != n->outputs().size()) {
    return NodeError(
        n, absl::StrCat("operator produced ", stack.size(),
                        " values, its node has ", n->outputs().size()));
  }
  if (on_meta) {
    for (c10::IValue& o : stack) o = FromMeta(std::move(o));
    static const c10::Symbol kIsCpu =
        c10::Symbol::fromQualString("prim::is_cpu");
    static const c10::Symbol kIsMeta =
        c10::Symbol::fromQualString("prim::is_meta");
    if (kind == kIsCpu) stack[0] = true;
    if (kind == kIsMeta) stack[0] = false;
  }

  const Provenance p = ProvenanceOf(kind, *schema, inputs, stack, on_meta);
  const bool out_tensor = p.out_tensor, meta_query = p.meta_query;
  const bool all_constant = p.all_constant, data = p.data, shape = p.shape;

  // Fold: nothing in it changes with the inputs (or only what the trace is
  // specialised to anyway).
  if (!out_tensor && !schema->is_mutable() && (all_constant || meta_query)) {
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      Value v;
      v.concrete = stack[i];
      env[n->outputs()[i]] = std::move(v);
    }
    return absl::OkStatus();
  }

  std::vector<Argument> args;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c10::TypePtr type =
        i < formals.size() ? formals[i].real_type() : n->input(i)->type();
    ASSIGN_OR_RETURN(Argument a, ToArgument(*inputs[i], type));
    args.push_back(std::move(a));
  }
  c10::IValue result;
  if (stack.size() == 1) {
    result = stack[0];
  } else {
    result = c10::ivalue::Tuple::create(std::vector<c10::IValue>(stack));
  }
  ASSIGN_OR_RETURN(ir::Node * node,
                   AddNode(ir::OpKind::kCallFunction, OperatorName(*schema),
                           std::move(args), NameHint(kind), n, &result));
  if (schema->is_mutable()) impure_.insert(node);

  Value out;
  out.node = node;
  out.concrete = result;
  out.data = data;
  out.shape = shape;
  if (n->outputs().size() == 1) {
    env[n->output()] = std::move(out);
  } else {
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Element(out, static_cast<int64_t>(i), n));
      env[n->outputs()[i]] = std::move(v);
    }
  }
  return absl::OkStatus();
}

}  // namespace tracecut::tracer::internal
