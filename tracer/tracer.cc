#include "tracer/tracer.h"

#include <ATen/MemoryOverlap.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ir/graph.h"
#include "ir/names.h"
#include "runtime/dtype.h"
#include "runtime/torch_status.h"
#include "tracer/source_info_internal.h"
#include "tracer/tracer_internal.h"
#include "util/status_macros.h"

namespace tracecut::tracer {
namespace internal {
namespace {

using ir::Argument;

void CollectMeta(const c10::IValue& v, std::vector<ir::TensorMeta>& out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    ir::TensorMeta m;
    m.shape = t.sizes().vec();
    m.dtype = runtime::DTypeName(t.scalar_type());
    // Meta tensors only exist as stand-ins for CPU tensors (Note [Shadow
    // execution]).
    m.device = t.is_meta() ? std::string("cpu") : t.device().str();
    out.push_back(std::move(m));
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) CollectMeta(e, out);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) CollectMeta(e, out);
  }
}

bool IsScalarTypeType(c10::TypePtr type) {
  if (type == nullptr) return false;
  if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
  return type->kind() == c10::TypeKind::ScalarTypeType;
}

c10::TypePtr Unoptional(c10::TypePtr type) {
  if (type == nullptr) return type;
  if (auto opt = type->cast<c10::OptionalType>()) return opt->getElementType();
  return type;
}

std::string Repr(const c10::IValue& v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Gives every tensor attribute in `m`'s tree a copy of its own (tied
// tensors stay tied). `m`'s module objects must be ours.
void CopyTensors(const jit::Module& m) {
  runtime::TensorCopier copier(m);
  c10::IValue::HashIdentityIValueMap memo;
  for (const jit::Module& sub : m.modules()) {
    const c10::intrusive_ptr<c10::ivalue::Object>& object = sub._ivalue();
    for (size_t i = 0; i < object->slots().size(); ++i) {
      c10::IValue v = object->getSlot(i);
      if (v.isTensor()) {
        if (v.toTensor().defined()) {
          object->setSlot(i, copier.Copy(v.toTensor()));
        }
      } else if (!v.isObject() && ContainsTensor(v)) {
        object->setSlot(i, v.deepcopy(memo));
      }
    }
  }
}

}  // namespace

bool ContainsTensor(const c10::IValue& v) {
  if (v.isTensor()) return true;
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (ContainsTensor(e)) return true;
    }
    return false;
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (ContainsTensor(e)) return true;
    }
    return false;
  }
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      if (ContainsTensor(e.key()) || ContainsTensor(e.value())) return true;
    }
  }
  return false;
}

std::string TypeNameOf(const jit::Module& m) {
  return ir::Scope::DemangleType(m.type()->name()->qualifiedName());
}

std::string OperatorName(const c10::FunctionSchema& schema) {
  const c10::OperatorName& op = schema.operator_name();
  return op.overload_name.empty()
             ? op.name
             : absl::StrCat(op.name, ".", op.overload_name);
}

std::string FirstLine(const std::string& s) {
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    absl::string_view t = absl::StripAsciiWhitespace(line);
    if (!t.empty()) return std::string(t);
  }
  return "unknown error";
}

// ------------------------------------------------------------------ errors

std::string Tracer::Where(const jit::Node* n) const {
  std::string module =
      scope_.path().empty()
          ? absl::StrCat("the root module (", scope_.short_type(), ")")
          : absl::StrCat("module '", scope_.path(), "' (", scope_.short_type(),
                         ")");
  std::string where = absl::StrCat(module, ", ", n->kind().toQualString());
  if (std::optional<SourceInfo> src = SourceOf(n)) {
    absl::StrAppend(&where, " at ", src->file, ":", src->line);
    if (!src->line_text.empty()) {
      absl::StrAppend(&where, " `", src->line_text, "`");
    }
  }
  return where;
}

absl::Status Tracer::NodeError(const jit::Node* n,
                               absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat(Where(n), ": ", what));
}

std::string Tracer::ConditionText(const jit::Node* n,
                                  const jit::Value* cond) const {
  const jit::Node* producer = cond->node();
  if (producer != nullptr && producer->kind() != c10::prim::Param) {
    if (std::optional<SourceInfo> src = SourceOf(producer)) {
      if (!src->expr.empty()) return src->expr;
    }
    return absl::StrCat("%", cond->debugName(), " = ",
                        producer->kind().toQualString(), "(...)");
  }
  return absl::StrCat("%", cond->debugName());
}

absl::Status Tracer::DataDependent(const jit::Node* n, absl::string_view what,
                                   const jit::Value* cond) const {
  std::string msg =
      absl::StrCat("data-dependent control flow in ", Where(n), ": the ", what,
                   " (", ConditionText(n, cond),
                   ") depends on tensor values, which tracing cannot decide");
  if (!scope_.path().empty()) {
    absl::StrAppend(&msg, "; make the module a leaf: --leaf=", scope_.path(),
                    " (or --leaf=", scope_.short_type(),
                    " for every module of that type)");
  } else {
    absl::StrAppend(&msg,
                    "; it is in the root module, which cannot be a leaf: "
                    "move the branch into a submodule and make that a leaf");
  }
  return absl::InvalidArgumentError(msg);
}

void Tracer::Assume(std::string assumption) {
  if (assumed_.insert(assumption).second) {
    graph_.meta().assumptions.push_back(std::move(assumption));
  }
}

// ------------------------------------------------------------------ driver

absl::Status Tracer::Run(const ExampleInputs& inputs) {
  auto forward = root_.find_method("forward");
  if (!forward.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("module ", TypeNameOf(root_), " has no forward method"));
  }
  std::shared_ptr<jit::Graph> g =
      jit::toGraphFunction(forward->function()).graph();
  ir::Scope root_scope({ir::ScopeEntry{"", TypeNameOf(root_)}});
  scope_ = root_scope;

  std::vector<Value> args;
  Value self;
  self.module = root_;
  args.push_back(std::move(self));
  for (size_t i = 0; i < inputs.names.size(); ++i) {
    ASSIGN_OR_RETURN(ir::Node * ph, graph_.Placeholder(inputs.names[i]));
    ph->set_scope(root_scope);
    // The shadow run must not write into the caller's tensors.
    c10::IValue value = inputs.values[i].deepcopy();
    if (meta_ && ContainsTensor(value)) {
      value = value.isTensor() ? c10::IValue(MetaTwin(value.toTensor()))
                               : ToMeta(value);
    }
    CollectMeta(value, ph->meta().outputs);
    Value v;
    v.concrete = value;
    if (ContainsTensor(value)) {
      v.node = ph;
      v.data = true;
    }
    args.push_back(std::move(v));
  }
  if (g->inputs().size() != args.size()) {
    return absl::InternalError(
        absl::StrCat("forward graph takes ", g->inputs().size(),
                     " inputs, its schema ", args.size()));
  }
  for (const std::string& a : inputs.assumptions) Assume(a);

  ASSIGN_OR_RETURN(std::vector<Value> outs,
                   InlineGraph(*g, std::move(args), root_scope));
  if (outs.size() != 1) {
    return absl::UnimplementedError(
        absl::StrCat("forward returns ", outs.size(), " values; expected one"));
  }
  scope_ = root_scope;
  ASSIGN_OR_RETURN(Argument result,
                   ToArgument(outs[0], g->outputs()[0]->type()));
  ASSIGN_OR_RETURN(ir::Node * output, graph_.Output(std::move(result)));
  output->set_scope(root_scope);
  RETURN_IF_ERROR(EliminateDeadCode());

  if (options_.config.has_value()) {
    hf::HfDefaults d = hf::DefaultsFor(*options_.config);
    auto strings = [](const std::vector<std::string>& v) {
      std::vector<Argument> out;
      for (const std::string& s : v) out.push_back(Argument::String(s));
      return Argument::List(std::move(out));
    };
    graph_.meta().extra["hf.model_type"] = Argument::String(
        d.model_type.empty() ? options_.config->model_type() : d.model_type);
    graph_.meta().extra["hf.sequential_targets"] =
        strings(d.sequential_targets);
    graph_.meta().extra["hf.ignore"] = strings(d.ignore);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Value>> Tracer::InlineGraph(
    const jit::Graph& g, std::vector<Value> inputs, ir::Scope scope) {
  // TorchScript has no recursion; this only guards against cycles we do not
  // expect.
  if (depth_ >= 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("calls nest deeper than 256 in ",
                     scope.path().empty() ? "<root>" : scope.path()));
  }
  ++depth_;
  ir::Scope saved = std::move(scope_);
  scope_ = std::move(scope);
  absl::Cleanup restore = [&] {
    scope_ = std::move(saved);
    --depth_;
  };
  Env env;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    env[g.inputs()[i]] = std::move(inputs[i]);
  }
  RETURN_IF_ERROR(RunBlock(g.block(), env));
  std::vector<Value> outs;
  for (const jit::Value* o : g.outputs()) {
    ASSIGN_OR_RETURN(Value * v, Lookup(env, o));
    outs.push_back(*v);
  }
  return outs;
}

absl::Status Tracer::RunBlock(const jit::Block* block, Env& env) {
  for (const jit::Node* n : block->nodes()) {
    absl::Status s;
    try {
      s = RunNode(n, env);
    } catch (const std::exception& e) {
      // The line that says what failed, also inside TorchScript call stacks.
      s = NodeError(n, runtime::TorchErrorSummary(e));
    }
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

absl::StatusOr<Value*> Tracer::Lookup(Env& env, const jit::Value* v) {
  auto it = env.find(v);
  if (it == env.end()) {
    return absl::InternalError(
        absl::StrCat("TorchScript value %", v->debugName(),
                     " used before it was defined (in ", scope_.path(), ")"));
  }
  return &it->second;
}

// ------------------------------------------------------------- IR helpers

std::optional<ir::SourceLocation> Tracer::LocationOf(const jit::Node* n) {
  std::optional<jit::SourceRange> range = SourceRangeOf(n);
  if (!range.has_value()) return std::nullopt;
  auto [it, inserted] = locations_.try_emplace(SourceKey(*range));
  if (inserted) {
    if (std::optional<SourceInfo> info = SourceInfoOf(*range)) {
      it->second = ir::SourceLocation{info->file, info->line, info->line_text};
    }
  }
  return it->second;
}

absl::StatusOr<ir::Node*> Tracer::AddNode(ir::OpKind op, std::string target,
                                          std::vector<Argument> args,
                                          absl::string_view hint,
                                          const jit::Node* origin,
                                          const c10::IValue* result) {
  ASSIGN_OR_RETURN(ir::Node * node,
                   graph_.AddNode(op, std::move(target), std::move(args), {},
                                  UniqueName(hint)));
  node->set_scope(scope_);
  if (origin != nullptr) node->meta().source = LocationOf(origin);
  if (result != nullptr) CollectMeta(*result, node->meta().outputs);
  return node;
}

std::string Tracer::UniqueName(absl::string_view hint) {
  // Graph::UniqueName's rules.
  std::string base = ir::SanitizeName(hint);
  if (graph_.FindNode(base) == nullptr) return base;
  std::string stem = base;
  size_t us = stem.rfind('_');
  int64_t start = 1;
  if (us != std::string::npos && us + 1 < stem.size()) {
    int64_t n;
    if (absl::SimpleAtoi(absl::string_view(stem).substr(us + 1), &n) &&
        n >= 0) {
      stem.resize(us);
      start = n + 1;
    }
  }
  // Names are only added while tracing, so what was taken stays taken.
  int64_t& below = taken_below_[stem];
  int64_t i = start == 1 ? std::max<int64_t>(below, 1) : start;
  std::string candidate;
  for (;; ++i) {
    candidate = absl::StrCat(stem, "_", i);
    if (graph_.FindNode(candidate) == nullptr) break;
  }
  if (start == 1) below = i + 1;
  return candidate;
}

absl::StatusOr<ir::Node*> Tracer::AttrNode(const std::string& path,
                                           const c10::IValue& tensor) {
  auto it = attr_nodes_.find(path);
  if (it != attr_nodes_.end()) return it->second;
  ASSIGN_OR_RETURN(ir::Node * node, AddNode(ir::OpKind::kGetAttr, path, {},
                                            path, nullptr, &tensor));
  attr_nodes_[path] = node;
  return node;
}

absl::StatusOr<ir::Node*> Tracer::LiftConstant(const at::Tensor& t) {
  auto it = constant_nodes_.find(t.unsafeGetTensorImpl());
  if (it != constant_nodes_.end()) return it->second;
  std::string name;
  do {
    name = absl::StrCat("_tensor_constant", next_constant_++);
  } while (root_.hasattr(name));
  at::Tensor copy = t.detach().clone();
  root_.register_buffer(name, copy);
  ASSIGN_OR_RETURN(ir::Node * node, AttrNode(name, c10::IValue(copy)));
  constant_nodes_[t.unsafeGetTensorImpl()] = node;
  constants_.push_back(t);
  return node;
}

absl::StatusOr<Argument> Tracer::ToArgument(const Value& v, c10::TypePtr type) {
  if (v.module.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("module '", v.module_path,
                     "' used as a value (only calls and attribute reads of "
                     "modules are supported)"));
  }
  if (v.node != nullptr) return Argument::Ref(v.node);
  if (!v.attr_path.empty()) {
    ASSIGN_OR_RETURN(ir::Node * node, AttrNode(v.attr_path, v.concrete));
    return Argument::Ref(node);
  }
  if (v.elems) {
    c10::TypePtr t = Unoptional(type);
    std::vector<Argument> elements;
    for (size_t i = 0; i < v.elems->size(); ++i) {
      c10::TypePtr et;
      if (t != nullptr) {
        if (auto lt = t->cast<c10::ListType>()) {
          et = lt->getElementType();
        } else if (auto tt = t->cast<c10::TupleType>()) {
          if (i < tt->elements().size()) et = tt->elements()[i];
        }
      }
      ASSIGN_OR_RETURN(Argument a, ToArgument((*v.elems)[i], et));
      elements.push_back(std::move(a));
    }
    return v.is_tuple ? Argument::Tuple(std::move(elements))
                      : Argument::List(std::move(elements));
  }
  return ConstantArgument(v.concrete, type);
}

absl::StatusOr<Argument> Tracer::ConstantArgument(const c10::IValue& v,
                                                  c10::TypePtr type) {
  if (v.isNone()) return Argument::None();
  if (v.isBool()) return Argument::Bool(v.toBool());
  if (v.isInt()) {
    if (IsScalarTypeType(type)) {
      return Argument::DType(
          runtime::DTypeName(static_cast<c10::ScalarType>(v.toInt())));
    }
    return Argument::Int(v.toInt());
  }
  if (v.isDouble()) return Argument::Double(v.toDouble());
  if (v.isString()) return Argument::String(v.toStringRef());
  if (v.isDevice()) return Argument::Device(v.toDevice().str());
  if (v.isTensor()) {
    ASSIGN_OR_RETURN(ir::Node * node, LiftConstant(v.toTensor()));
    return Argument::Ref(node);
  }
  c10::TypePtr t = Unoptional(type);
  if (v.isList()) {
    c10::TypePtr et;
    if (t != nullptr) {
      if (auto lt = t->cast<c10::ListType>()) et = lt->getElementType();
    }
    std::vector<Argument> elements;
    for (const c10::IValue& e : v.toListRef()) {
      ASSIGN_OR_RETURN(Argument a, ConstantArgument(e, et));
      elements.push_back(std::move(a));
    }
    return Argument::List(std::move(elements));
  }
  if (v.isTuple()) {
    auto tt = t == nullptr ? nullptr : t->cast<c10::TupleType>();
    std::vector<Argument> elements;
    const auto& items = v.toTupleRef().elements();
    for (size_t i = 0; i < items.size(); ++i) {
      c10::TypePtr et;
      if (tt != nullptr && i < tt->elements().size()) et = tt->elements()[i];
      ASSIGN_OR_RETURN(Argument a, ConstantArgument(items[i], et));
      elements.push_back(std::move(a));
    }
    return Argument::Tuple(std::move(elements));
  }
  return absl::UnimplementedError(absl::StrCat(
      "constant of kind ", v.tagKind(), " (", Repr(v), ") has no IR form"));
}

absl::Status Tracer::EliminateDeadCode() {
  std::vector<ir::Node*> nodes;
  for (ir::Node* n : graph_.nodes()) nodes.push_back(n);
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    ir::Node* n = *it;
    if (!n->users().empty()) continue;
    const bool pure =
        n->op() == ir::OpKind::kGetAttr ||
        (n->op() == ir::OpKind::kCallFunction && !impure_.contains(n));
    if (pure) RETURN_IF_ERROR(graph_.Erase(n));
  }
  return absl::OkStatus();
}

namespace {

// One trace of `module` (Note [Shadow execution]).
absl::StatusOr<runtime::GraphModule> TraceOnce(const jit::Module& module,
                                               const TraceOptions& options,
                                               bool meta) {
  jit::Module clone;
  try {
    // Meta mode runs nothing real on the module's tensors: new module
    // objects and types sharing them. Real mode copies them, with
    // runtime::TensorCopier:
    // jit::Module::clone would materialise every deferred checkpoint
    // tensor's one-element stand-in at full size.
    clone = module.clone(/*inplace=*/true);
    if (!meta) CopyTensors(clone);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot clone the module: ", FirstLine(e.what_without_backtrace())));
  }
  ASSIGN_OR_RETURN(ExampleInputs inputs, ResolveExampleInputs(clone, options));
  auto graph = std::make_unique<ir::Graph>();
  {
    torch::NoGradGuard no_grad;
    Tracer tracer(clone, options, *graph, meta);
    absl::Status s;
    try {
      s = tracer.Run(inputs);
      // The graph (run by the interpreter) or a leaf may write to module
      // state; that must not reach the caller's module.
      if (s.ok() && meta && tracer.MayWriteModuleState()) CopyTensors(clone);
    } catch (const c10::Error& e) {
      s = absl::InternalError(absl::StrCat(
          "tracing failed: ", FirstLine(e.what_without_backtrace())));
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("tracing failed: ", e.what()));
    }
    RETURN_IF_ERROR(s);
  }
  return runtime::GraphModule(std::move(clone), std::move(graph));
}

}  // namespace
}  // namespace internal

absl::StatusOr<runtime::GraphModule> Trace(const torch::jit::Module& module,
                                           const TraceOptions& options) {
  using internal::TraceOnce;
  if (options.shadow == TraceOptions::Shadow::kReal) {
    return TraceOnce(module, options, /*meta=*/false);
  }
  absl::StatusOr<runtime::GraphModule> gm =
      TraceOnce(module, options, /*meta=*/true);
  if (gm.ok() || options.shadow == TraceOptions::Shadow::kMeta) return gm;
  // Whatever the meta run could not do, or an error real execution reports
  // in its own words.
  return TraceOnce(module, options, /*meta=*/false);
}

}  // namespace tracecut::tracer
