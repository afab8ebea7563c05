#include "tracer/tracer.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ir/graph.h"
#include "ir/names.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::tracer {
namespace {

namespace jit = torch::jit;
using ir::Argument;

// Note [Shadow execution]
// While the tracer walks the TorchScript graph it also runs it: every value
// it maps to the IR carries the concrete IValue it has on the example
// inputs (operators run through Node::getOperation, leaf modules through
// their forward). That gives meta.outputs for every node and lets control
// flow be decided. To decide whether a decision is sound for other inputs,
// each value also carries provenance:
//   data  -- depends on the values inside input tensors or parameters;
//   shape -- (tensors) its shape depends on such values (nonzero, or a size
//            computed from .item()).
// Sizes, ranks, dtypes and devices of tensors are not data: x.size(1) is
// shape-only as long as x's shape is. A condition with `data` set cannot be
// decided by tracing and is reported; one without is decided on the example
// inputs, and recorded as an assumption when it was not a plain constant.
//
// Meta mode (TraceOptions::Shadow::kMeta, tried first by default): values
// with `data` set are meta tensors. Tensor inputs become meta tensors of the
// same sizes, strides and dtypes; an operator with any `data` input runs on
// meta twins of all its tensors (a `cpu` device argument becomes `meta`,
// results report `cpu`), which gives the same shapes, dtypes and `shape`
// provenance without the arithmetic or copies of the weights. Values without
// `data` (constants, sizes, aranges and masks built from sizes) still run for
// real: they are cheap and their values may feed shapes and conditions. What
// needs the values of data is refused -- a non-tensor result of a `data`
// input other than shape/meta queries (.item(), int(t), str(t)), operators
// whose output shape depends on data, operators without a meta kernel, and
// non-CPU tensors -- and kAuto traces again in real mode, so graphs, shapes
// and errors are always those of real execution. Leaf modules run with meta
// twins of their tensors swapped into our clone's objects for the call.
// Since nothing real runs on the parameters, the clone shares them with the
// caller's module unless the graph or a leaf module may write to module
// state (then they are copied; see Trace).

struct Value;
using Seq = std::vector<Value>;

struct Value {
  c10::IValue concrete;  // What the value is on the example inputs.
  // The IR node producing it; null for constants, constructed sequences,
  // modules and not yet read tensor attributes.
  ir::Node* node = nullptr;
  // Lists and tuples built in the graph (ListConstruct/TupleConstruct):
  // elements kept individually so unpacking forwards them. Shared so that
  // list.append on one copy is seen by all (lists are references).
  std::shared_ptr<Seq> elems;
  bool is_tuple = false;
  // A parameter/buffer/tensor attribute; its get_attr node is made when the
  // value is first used (then shared per path).
  std::string attr_path;
  // A module object (the receiver of prim::GetAttr / prim::CallMethod).
  std::optional<jit::Module> module;
  std::string module_path;
  bool data = false;
  bool shape = false;
};

// Operators whose (non-tensor) result depends on shapes only.
bool IsShapeQuery(c10::Symbol kind) {
  static const auto* kinds = new absl::flat_hash_set<c10::Symbol>{
      c10::Symbol::fromQualString("aten::size"),
      c10::Symbol::fromQualString("aten::sym_size"),
      c10::Symbol::fromQualString("aten::dim"),
      c10::Symbol::fromQualString("aten::numel"),
      c10::Symbol::fromQualString("aten::sym_numel"),
      c10::Symbol::fromQualString("aten::len"),
      c10::Symbol::fromQualString("aten::stride"),
      c10::Symbol::fromQualString("aten::sym_stride"),
  };
  return kinds->contains(kind);
}

// Operators whose result depends on dtype/device/None-ness only; folded to
// constants (the trace is specialised to them, as torch.jit.trace is).
bool IsMetaQuery(c10::Symbol kind) {
  static const auto* kinds = new absl::flat_hash_set<c10::Symbol>{
      c10::Symbol::fromQualString("prim::dtype"),
      c10::Symbol::fromQualString("prim::device"),
      c10::Symbol::fromQualString("prim::layout"),
      c10::Symbol::fromQualString("prim::is_cuda"),
      c10::Symbol::fromQualString("prim::is_cpu"),
      c10::Symbol::fromQualString("prim::is_xpu"),
      c10::Symbol::fromQualString("prim::is_mps"),
      c10::Symbol::fromQualString("prim::is_meta"),
      c10::Symbol::fromQualString("prim::is_sparse"),
      c10::Symbol::fromQualString("prim::is_sparse_csr"),
      c10::Symbol::fromQualString("prim::is_mkldnn"),
      c10::Symbol::fromQualString("prim::is_quantized"),
      c10::Symbol::fromQualString("prim::is_vulkan"),
      c10::Symbol::fromQualString("prim::is_ipu"),
      c10::Symbol::fromQualString("prim::is_nested"),
      c10::Symbol::fromQualString("prim::requires_grad"),
      c10::Symbol::fromQualString("aten::is_floating_point"),
      c10::Symbol::fromQualString("aten::is_complex"),
      c10::Symbol::fromQualString("aten::element_size"),
      c10::Symbol::fromQualString("aten::__is__"),
      c10::Symbol::fromQualString("aten::__isnot__"),
  };
  return kinds->contains(kind);
}

// Operators whose output shape depends on input values.
bool HasDataDependentShape(c10::Symbol kind) {
  static const auto* kinds = new absl::flat_hash_set<c10::Symbol>{
      c10::Symbol::fromQualString("aten::nonzero"),
      c10::Symbol::fromQualString("aten::nonzero_numpy"),
      c10::Symbol::fromQualString("aten::argwhere"),
      c10::Symbol::fromQualString("aten::masked_select"),
      c10::Symbol::fromQualString("aten::unique"),
      c10::Symbol::fromQualString("aten::_unique"),
      c10::Symbol::fromQualString("aten::_unique2"),
      c10::Symbol::fromQualString("aten::unique_dim"),
      c10::Symbol::fromQualString("aten::unique_consecutive"),
      c10::Symbol::fromQualString("aten::repeat_interleave"),
      c10::Symbol::fromQualString("aten::bincount"),
      c10::Symbol::fromQualString("aten::where"),
  };
  return kinds->contains(kind);
}

const c10::Symbol kWhere = c10::Symbol::fromQualString("aten::where");

// Thrown when meta execution cannot stand in for real execution (Note
// [Shadow execution]); becomes an error status like any operator failure.
class MetaRefusal : public std::runtime_error {
 public:
  explicit MetaRefusal(const std::string& what)
      : std::runtime_error(absl::StrCat("meta execution: ", what)) {}
};

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

void CollectMeta(const c10::IValue& v, std::vector<ir::TensorMeta>& out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    ir::TensorMeta m;
    m.shape = t.sizes().vec();
    m.dtype = DTypeName(t.scalar_type());
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

std::string TypeNameOf(const jit::Module& m) {
  return ir::Scope::DemangleType(m.type()->name()->qualifiedName());
}

// Operators and leaf module types (by name) that failed on meta in an
// earlier trace of this process: they run on zeros at once. Each failure
// costs a c10::Error with a symbolised backtrace (milliseconds), and running
// on zeros is always a valid fallback (see RunOnMeta, RunLeafOnMeta), so
// sharing this across traces only saves time.
class NoMetaKernels {
 public:
  static NoMetaKernels& Get() {
    static auto* known = new NoMetaKernels();
    return *known;
  }
  bool HasOp(const c10::FunctionSchema* schema) {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_.contains(schema);
  }
  void AddOp(const c10::FunctionSchema* schema) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.insert(schema);
  }
  bool HasLeaf(const std::string& type) {
    std::lock_guard<std::mutex> lock(mu_);
    return leaves_.contains(type);
  }
  void AddLeaf(const std::string& type) {
    std::lock_guard<std::mutex> lock(mu_);
    leaves_.insert(type);
  }

 private:
  std::mutex mu_;
  // Schemas live in LibTorch's operator registry for the whole process.
  absl::flat_hash_set<const c10::FunctionSchema*> ops_;
  absl::flat_hash_set<std::string> leaves_;
};

// FX-like name hint: "aten::linear" -> "linear", "aten::__getitem__" ->
// "getitem".
std::string NameHint(c10::Symbol kind) {
  std::string s = kind.toUnqualString();
  absl::string_view v = s;
  while (!v.empty() && v.front() == '_') v.remove_prefix(1);
  while (!v.empty() && v.back() == '_') v.remove_suffix(1);
  return v.empty() ? std::string("op") : std::string(v);
}

std::string OperatorName(const c10::FunctionSchema& schema) {
  const c10::OperatorName& op = schema.operator_name();
  return op.overload_name.empty()
             ? op.name
             : absl::StrCat(op.name, ".", op.overload_name);
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

// Where a TorchScript node came from.
struct SourceInfo {
  std::string file;
  int64_t line = 0;
  std::string line_text;  // The source line, trimmed; "" when unknown.
  std::string expr;       // The node's own source text when on one line.
};

// Traced graphs record the Python stack as their "source": lines like
// "path/to/file.py(42): forward", innermost frame first. They are not code.
bool LooksLikeTraceStack(absl::string_view text, absl::string_view file) {
  return !file.empty() && text.size() > file.size() &&
         absl::StartsWith(text, file) && text[file.size()] == '(';
}

// The frame of a traced stack worth pointing at: the innermost one outside
// torch's own Python package (operator overloads such as Tensor.__rsub__
// live there), else the innermost.
std::optional<std::pair<std::string, int64_t>> ModelFrame(
    absl::string_view stack) {
  std::optional<std::pair<std::string, int64_t>> first;
  for (absl::string_view line : absl::StrSplit(stack, '\n')) {
    size_t close = line.find("): ");
    size_t open = line.rfind('(', close);
    if (close == absl::string_view::npos || open == absl::string_view::npos) {
      continue;
    }
    int64_t lineno;
    if (!absl::SimpleAtoi(line.substr(open + 1, close - open - 1), &lineno)) {
      continue;
    }
    std::pair<std::string, int64_t> frame(std::string(line.substr(0, open)),
                                          lineno);
    if (!first.has_value()) first = frame;
    if (frame.first.find("/torch/") == std::string::npos) return frame;
  }
  return first;
}

// The range a node's source info comes from: the code that generated it
// when the model recorded that (scripted models), else its own.
std::optional<jit::SourceRange> SourceRangeOf(const jit::Node* n) {
  try {
    jit::SourceRange range = n->sourceRange();
    if (!range.source()) return std::nullopt;
    if (auto original = range.findSourceRangeThatGenerated()) {
      range = *original;
    }
    return range;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<SourceInfo> SourceInfoOf(const jit::SourceRange& range) {
  try {
    auto flc = range.file_line_col();
    if (!flc.has_value()) return std::nullopt;
    SourceInfo info;
    info.file = std::get<0>(*flc);
    info.line = static_cast<int64_t>(std::get<1>(*flc));
    if (info.file.empty()) return std::nullopt;
    const std::shared_ptr<jit::Source>& src = range.source();
    if (range.start() < src->size()) {
      size_t lineno = src->lineno_for_offset(range.start());
      std::string line = src->get_line(lineno).str();
      absl::string_view t = absl::StripAsciiWhitespace(line);
      if (!LooksLikeTraceStack(t, info.file)) {
        info.line_text = std::string(t);
      } else if (auto frame = ModelFrame(src->text_str().str())) {
        info.file = frame->first;
        info.line = frame->second;
      }
      // Only a short range can be a one-line expression (traced stacks,
      // which are long, are not copied).
      if (range.end() <= src->size() && range.end() > range.start() &&
          range.end() - range.start() <= 200) {
        std::string expr = range.text().str();
        if (expr.find('\n') == std::string::npos &&
            !LooksLikeTraceStack(expr, info.file)) {
          info.expr = std::string(absl::StripAsciiWhitespace(expr));
        }
      }
    }
    return info;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<SourceInfo> SourceOf(const jit::Node* n) {
  std::optional<jit::SourceRange> range = SourceRangeOf(n);
  if (!range.has_value()) return std::nullopt;
  return SourceInfoOf(*range);
}

// What identifies a range's source info without reading its text: the
// range, the source's file and first line, and the memory of its text.
// Loaded models keep one copy of each distinct source text (TorchScript's
// serializer deduplicates them) that all Source objects with that text view,
// so the nodes of every instance of a module share a key.
std::string SourceKey(const jit::SourceRange& range) {
  jit::Source& src = *range.source();
  const jit::StringCordView& text = src.text_str();
  std::string key =
      absl::StrCat(range.start(), ":", range.end(), ":", src.starting_line_no(),
                   ":", src.filename().value_or(""), ":");
  for (size_t i = 0, covered = 0; covered < text.size(); ++i) {
    c10::string_view piece = text.piece(i);
    absl::StrAppend(&key, reinterpret_cast<uintptr_t>(piece.data()), "+",
                    piece.size(), ";");
    covered += piece.size();
  }
  return key;
}

std::string Repr(const c10::IValue& v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string FirstLine(const std::string& s) {
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    absl::string_view t = absl::StripAsciiWhitespace(line);
    if (!t.empty()) return std::string(t);
  }
  return "unknown error";
}

class Tracer {
 public:
  Tracer(jit::Module root, const TraceOptions& options, ir::Graph& graph,
         bool meta)
      : root_(std::move(root)), options_(options), graph_(graph), meta_(meta) {}

  absl::Status Run(const ExampleInputs& inputs);

  // Meta mode: whether the traced graph or a leaf module it calls may write
  // to module state, so the clone must not share tensors with the caller.
  bool MayWriteModuleState() const { return state_writes_ || leaf_writes_; }

 private:
  using Env = absl::node_hash_map<const jit::Value*, Value>;

  absl::StatusOr<std::vector<Value>> InlineGraph(const jit::Graph& g,
                                                 std::vector<Value> inputs,
                                                 ir::Scope scope);
  absl::Status RunBlock(const jit::Block* block, Env& env);
  absl::Status RunNode(const jit::Node* n, Env& env);

  absl::Status Constant(const jit::Node* n, Env& env);
  absl::Status GetAttr(const jit::Node* n, Env& env);
  absl::Status CallMethod(const jit::Node* n, Env& env);
  absl::Status CallFunction(const jit::Node* n, Env& env);
  absl::Status If(const jit::Node* n, Env& env);
  absl::Status Loop(const jit::Node* n, Env& env);
  absl::Status Construct(const jit::Node* n, Env& env);
  absl::Status Unpack(const jit::Node* n, Env& env);
  absl::Status TupleIndex(const jit::Node* n, Env& env);
  absl::Status Operator(const jit::Node* n, Env& env);
  absl::StatusOr<Value> EmitCallModule(const jit::Node* n, const Value& self,
                                       const std::string& type,
                                       std::vector<Value*> args);

  absl::StatusOr<Value*> Lookup(Env& env, const jit::Value* v);
  absl::StatusOr<Argument> ToArgument(const Value& v, c10::TypePtr type);
  absl::StatusOr<Argument> ConstantArgument(const c10::IValue& v,
                                            c10::TypePtr type);
  absl::StatusOr<ir::Node*> AttrNode(const std::string& path,
                                     const c10::IValue& tensor);
  absl::StatusOr<ir::Node*> LiftConstant(const at::Tensor& t);
  absl::StatusOr<ir::Node*> AddNode(ir::OpKind op, std::string target,
                                    std::vector<Argument> args,
                                    absl::string_view hint,
                                    const jit::Node* origin,
                                    const c10::IValue* result);
  // The element `index` of a sequence value (forwarded when the sequence
  // was built in the graph, a getitem node when an operator produced it).
  absl::StatusOr<Value> Element(const Value& seq, int64_t index,
                                const jit::Node* origin);
  absl::Status EliminateDeadCode();
  // What graph_.UniqueName(hint) gives, without its scan of the suffixes
  // from 1 (quadratic over thousands of "linear_<i>").
  std::string UniqueName(absl::string_view hint);

  // Meta mode (Note [Shadow execution]). The meta twin of a CPU tensor (one
  // per tensor), `v` with every tensor a twin and `cpu` devices `meta`, and
  // an operator's result with meta devices reported as `cpu`.
  at::Tensor MetaTwin(const at::Tensor& t);
  c10::IValue ToMeta(const c10::IValue& v);
  c10::IValue FromMeta(c10::IValue v);
  // A CPU stand-in for a meta tensor: zeros of its shape (one element,
  // expanded); for operators without meta kernels. Other values unchanged.
  c10::IValue ToZeros(const c10::IValue& v);
  // Runs operation `op` of `n` on `inputs` in meta mode; its results.
  jit::Stack RunOnMeta(const jit::Node* n, const c10::FunctionSchema& schema,
                       jit::Operation& op, const std::vector<Value*>& inputs);
  // Leaf module `m`'s forward in meta mode.
  c10::IValue RunLeafOnMeta(const jit::Module& m, jit::Method& forward,
                            std::vector<c10::IValue> args);
  // Whether any method of `m`'s module tree may write to module state.
  bool MayWrite(const jit::Module& m);
  // Whether the code of `m`'s tree may read tensor values (so it cannot run
  // on zeros in place of the real values).
  bool MayReadData(const jit::Module& m);

  // The IR source location of `n` (cached by SourceKey).
  std::optional<ir::SourceLocation> LocationOf(const jit::Node* n);

  // "module 'model.layers.0' (LlamaDecoderLayer), prim::If at file:12"
  std::string Where(const jit::Node* n) const;
  absl::Status NodeError(const jit::Node* n, absl::string_view what) const;
  absl::Status DataDependent(const jit::Node* n, absl::string_view what,
                             const jit::Value* cond) const;
  std::string ConditionText(const jit::Node* n, const jit::Value* cond) const;
  void Assume(std::string assumption);

  jit::Module root_;
  const TraceOptions& options_;
  ir::Graph& graph_;
  ir::Scope scope_;  // Of the module whose code is being walked.
  absl::flat_hash_map<std::string, ir::Node*> attr_nodes_;
  absl::flat_hash_map<const c10::TensorImpl*, ir::Node*> constant_nodes_;
  std::vector<at::Tensor> constants_;  // Keeps lifted constants' keys alive.
  int next_constant_ = 0;
  absl::flat_hash_set<ir::Node*> impure_;
  absl::flat_hash_map<const jit::Node*, jit::Operation> operations_;
  absl::flat_hash_set<std::string> assumed_;
  absl::flat_hash_map<std::string, std::optional<ir::SourceLocation>>
      locations_;
  int depth_ = 0;
  const bool meta_;
  // Real tensor -> its meta twin; the real one is kept so its address stays
  // unique.
  absl::flat_hash_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>>
      twins_;
  absl::flat_hash_map<const c10::ClassType*, bool> type_writes_;
  absl::flat_hash_map<const c10::ClassType*, bool> type_reads_;
  bool leaf_writes_ = false;
  // Stem -> every "<stem>_<i>" with 1 <= i < value is taken.
  absl::flat_hash_map<std::string, int64_t> taken_below_;
  // Storages of module tensors' meta twins: an in-place operator on a
  // tensor with one of them writes module state.
  absl::flat_hash_set<const c10::StorageImpl*> state_storages_;
  bool state_writes_ = false;
};

// Swaps the tensor attributes of a module tree (our clone's objects) for
// stand-ins until destroyed.
class SwappedTensors {
 public:
  SwappedTensors(const jit::Module& m,
                 const std::function<c10::IValue(const c10::IValue&)>& f) {
    for (const jit::Module& sub : m.modules()) {
      c10::intrusive_ptr<c10::ivalue::Object> object = sub._ivalue();
      for (size_t i = 0; i < object->slots().size(); ++i) {
        c10::IValue v = object->getSlot(i);
        if (v.isObject() || !ContainsTensor(v)) continue;
        c10::IValue stand_in = f(v);
        swapped_.emplace_back(object, i, std::move(v));
        object->setSlot(i, std::move(stand_in));
      }
    }
  }
  ~SwappedTensors() {
    for (auto& [object, slot, real] : swapped_) object->setSlot(slot, real);
  }
  SwappedTensors(const SwappedTensors&) = delete;
  SwappedTensors& operator=(const SwappedTensors&) = delete;

 private:
  std::vector<
      std::tuple<c10::intrusive_ptr<c10::ivalue::Object>, size_t, c10::IValue>>
      swapped_;
};

// ------------------------------------------------------------- meta mode

at::Tensor Tracer::MetaTwin(const at::Tensor& t) {
  if (!t.defined() || t.is_meta()) return t;
  auto it = twins_.find(t.unsafeGetTensorImpl());
  if (it != twins_.end()) return it->second.second;
  if (!t.device().is_cpu() || t.layout() != c10::kStrided || t.is_quantized() ||
      t.is_nested()) {
    throw MetaRefusal(absl::StrCat("a ", t.toString(), " tensor on ",
                                   t.device().str(),
                                   " is not a dense CPU one"));
  }
  at::Tensor twin =
      at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  if (t.requires_grad()) twin.requires_grad_(true);
  twins_.emplace(t.unsafeGetTensorImpl(), std::make_pair(t, twin));
  return twin;
}

// Whether ToMeta would change `v`.
bool NeedsMeta(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() && !v.toTensor().is_meta();
  if (v.isDevice()) return true;
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (NeedsMeta(e)) return true;
    }
    return false;
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (NeedsMeta(e)) return true;
    }
    return false;
  }
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      if (NeedsMeta(e.key()) || NeedsMeta(e.value())) return true;
    }
  }
  return false;
}

c10::IValue Tracer::ToMeta(const c10::IValue& v) {
  // Unchanged values are passed as they are: an operator may append to a
  // list it is given.
  if (!NeedsMeta(v)) return v;
  if (v.isTensor()) return MetaTwin(v.toTensor());
  if (v.isDevice()) {
    if (!v.toDevice().is_cpu()) {
      throw MetaRefusal(absl::StrCat("device ", v.toDevice().str()));
    }
    return c10::Device(c10::kMeta);
  }
  if (v.isList()) {
    c10::impl::GenericList list(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) list.push_back(ToMeta(e));
    return list;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      elements.push_back(ToMeta(e));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  throw MetaRefusal(absl::StrCat("a ", v.tagKind(), " holding tensors"));
}

// Whether FromMeta would change `v`.
bool NeedsFromMeta(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().defined() && !v.toTensor().is_meta();
  if (v.isDevice()) return v.toDevice().is_meta();
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (NeedsFromMeta(e)) return true;
    }
    return false;
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (NeedsFromMeta(e)) return true;
    }
    return false;
  }
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      if (NeedsFromMeta(e.key()) || NeedsFromMeta(e.value())) return true;
    }
  }
  return false;
}

c10::IValue Tracer::FromMeta(c10::IValue v) {
  if (!NeedsFromMeta(v)) return v;
  if (v.isTensor()) {
    // A new CPU tensor (a factory without a device); its values are not
    // needed (its inputs were data).
    const at::Tensor& t = v.toTensor();
    if (!t.device().is_cpu() || t.layout() != c10::kStrided) {
      throw MetaRefusal(absl::StrCat("result on ", t.device().str()));
    }
    return at::empty_strided(t.sizes(), t.strides(),
                             t.options().device(c10::kMeta));
  }
  if (v.isDevice()) return c10::Device(c10::kCPU);
  if (v.isList()) {
    c10::impl::GenericList list(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) list.push_back(FromMeta(e));
    return list;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      elements.push_back(FromMeta(e));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  throw MetaRefusal(absl::StrCat("a ", v.tagKind(), " result"));
}

c10::IValue Tracer::ToZeros(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.is_meta()) return v;
    return at::zeros({}, t.options().device(c10::kCPU)).expand(t.sizes());
  }
  if (v.isList() && ContainsTensor(v)) {
    c10::impl::GenericList list(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) list.push_back(ToZeros(e));
    return list;
  }
  if (v.isTuple() && ContainsTensor(v)) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      elements.push_back(ToZeros(e));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return v;
}

bool IsBoolOrByte(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() &&
           (t.scalar_type() == at::kBool || t.scalar_type() == at::kByte);
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (IsBoolOrByte(e)) return true;
    }
  }
  return false;
}

jit::Stack Tracer::RunOnMeta(const jit::Node* n,
                             const c10::FunctionSchema& schema,
                             jit::Operation& op,
                             const std::vector<Value*>& inputs) {
  static const c10::Symbol kIndex = c10::Symbol::fromQualString("aten::index");
  const c10::Symbol kind = n->kind();
  if (HasDataDependentShape(kind) && !(kind == kWhere && inputs.size() > 1)) {
    throw MetaRefusal(
        absl::StrCat(OperatorName(schema), "'s output shape depends on data"));
  }
  jit::Stack stack;
  if (!NoMetaKernels::Get().HasOp(&schema)) {
    for (Value* v : inputs) stack.push_back(ToMeta(v->concrete));
    if (schema.is_vararg()) {
      stack.emplace_back(static_cast<int64_t>(inputs.size()));
    }
    if (schema.is_mutable()) {
      const std::vector<c10::Argument>& formals = schema.arguments();
      for (size_t i = 0; i < formals.size() && i < stack.size(); ++i) {
        const c10::AliasInfo* alias = formals[i].alias_info();
        if (alias != nullptr && alias->isWrite() && stack[i].isTensor() &&
            stack[i].toTensor().defined() &&
            state_storages_.contains(
                stack[i].toTensor().storage().unsafeGetStorageImpl())) {
          state_writes_ = true;
        }
      }
    }
    try {
      op(stack);
      return stack;
    } catch (const c10::NotImplementedError&) {
      // No meta kernel (LibTorch has only the C++ ones).
      NoMetaKernels::Get().AddOp(&schema);
    }
  }
  // Boolean masks as indices select a data-dependent number of elements.
  if (kind == kIndex) {
    for (Value* v : inputs) {
      if (IsBoolOrByte(v->concrete)) {
        throw MetaRefusal("indexing with a mask depends on data");
      }
    }
  }
  stack.clear();
  for (Value* v : inputs) stack.push_back(ToZeros(v->concrete));
  if (schema.is_vararg()) {
    stack.emplace_back(static_cast<int64_t>(inputs.size()));
  }
  op(stack);
  return stack;
}

c10::IValue Tracer::RunLeafOnMeta(const jit::Module& m, jit::Method& forward,
                                  std::vector<c10::IValue> args) {
  leaf_writes_ |= MayWrite(m);
  const std::string type = TypeNameOf(m);
  if (!NoMetaKernels::Get().HasLeaf(type)) {
    try {
      std::vector<c10::IValue> stack;
      for (const c10::IValue& a : args) stack.push_back(ToMeta(a));
      SwappedTensors swap(m,
                          [this](const c10::IValue& v) { return ToMeta(v); });
      return FromMeta(forward(std::move(stack)));
    } catch (const c10::NotImplementedError&) {
      NoMetaKernels::Get().AddLeaf(type);
    }
  }
  // Zeros stand in for the values only where nothing reads them.
  if (MayReadData(m)) {
    throw MetaRefusal(absl::StrCat(
        "leaf ", TypeNameOf(m),
        " needs an operator without a meta kernel and may read tensor data"));
  }
  std::vector<c10::IValue> stack;
  for (const c10::IValue& a : args) stack.push_back(ToZeros(ToMeta(a)));
  SwappedTensors swap(
      m, [this](const c10::IValue& v) { return ToZeros(ToMeta(v)); });
  return FromMeta(forward(std::move(stack)));
}

// Whether a node's result may carry values of tensor data (see MayReadData).
bool ReadsData(const jit::Node* n) {
  static const c10::Symbol kIndex = c10::Symbol::fromQualString("aten::index");
  const c10::Symbol kind = n->kind();
  if (HasDataDependentShape(kind) || kind == kIndex) return true;
  if (IsShapeQuery(kind) || IsMetaQuery(kind)) return false;
  bool tensor_in = false;
  for (const jit::Value* in : n->inputs()) {
    tensor_in |= in->type()->kind() == c10::TypeKind::TensorType;
  }
  if (!tensor_in) return false;
  for (const jit::Value* out : n->outputs()) {
    switch (out->type()->kind()) {
      case c10::TypeKind::IntType:
      case c10::TypeKind::FloatType:
      case c10::TypeKind::BoolType:
      case c10::TypeKind::NumberType:
      case c10::TypeKind::ComplexType:
      case c10::TypeKind::StringType:
        return true;
      default:
        break;
    }
  }
  return false;
}

bool BlockReads(const jit::Block* block,
                absl::flat_hash_set<const jit::Function*>& seen) {
  for (const jit::Node* n : block->nodes()) {
    if (n->kind() == c10::prim::CallFunction) {
      auto fn_type = n->input(0)->type()->cast<c10::FunctionType>();
      jit::Function* fn = fn_type == nullptr ? nullptr : fn_type->function();
      if (fn == nullptr || !fn->isGraphFunction()) return true;
      if (seen.insert(fn).second &&
          BlockReads(jit::toGraphFunction(*fn).graph()->block(), seen)) {
        return true;
      }
    } else if (n->kind() != c10::prim::CallMethod && ReadsData(n)) {
      return true;
    }
    for (const jit::Block* b : n->blocks()) {
      if (BlockReads(b, seen)) return true;
    }
  }
  return false;
}

bool Tracer::MayReadData(const jit::Module& m) {
  for (const jit::Module& sub : m.modules()) {
    auto [it, inserted] = type_reads_.try_emplace(sub.type().get(), false);
    if (inserted) {
      absl::flat_hash_set<const jit::Function*> seen;
      for (const jit::Method& method : sub.get_methods()) {
        if (BlockReads(jit::toGraphFunction(method.function()).graph()->block(),
                       seen)) {
          it->second = true;
          break;
        }
      }
    }
    if (it->second) return true;
  }
  return false;
}

bool BlockWrites(const jit::Block* block,
                 absl::flat_hash_set<const jit::Function*>& seen) {
  for (const jit::Node* n : block->nodes()) {
    if (n->kind() == c10::prim::SetAttr) return true;
    if (n->kind() == c10::prim::CallFunction) {
      auto fn_type = n->input(0)->type()->cast<c10::FunctionType>();
      jit::Function* fn = fn_type == nullptr ? nullptr : fn_type->function();
      if (fn == nullptr || !fn->isGraphFunction()) return true;
      if (seen.insert(fn).second &&
          BlockWrites(jit::toGraphFunction(*fn).graph()->block(), seen)) {
        return true;
      }
    } else if (n->kind() != c10::prim::CallMethod) {
      const c10::FunctionSchema* schema = n->maybeSchema();
      if (schema != nullptr && schema->is_mutable()) return true;
    }
    for (const jit::Block* b : n->blocks()) {
      if (BlockWrites(b, seen)) return true;
    }
  }
  return false;
}

bool Tracer::MayWrite(const jit::Module& m) {
  for (const jit::Module& sub : m.modules()) {
    if (sub.is_training()) return true;  // e.g. BatchNorm's running stats.
    auto [it, inserted] = type_writes_.try_emplace(sub.type().get(), false);
    if (inserted) {
      absl::flat_hash_set<const jit::Function*> seen;
      for (const jit::Method& method : sub.get_methods()) {
        if (BlockWrites(
                jit::toGraphFunction(method.function()).graph()->block(),
                seen)) {
          it->second = true;
          break;
        }
      }
    }
    if (it->second) return true;
  }
  return false;
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

  // Provenance.
  bool tensor_data = false, tensor_shape = false, scalar_data = false;
  bool all_constant = true;
  for (Value* v : inputs) {
    all_constant &= IsConstant(*v);
    if (ContainsTensor(v->concrete)) {
      tensor_data |= v->data;
      tensor_shape |= v->shape;
    } else {
      scalar_data |= v->data;
    }
  }
  bool out_tensor = false;
  for (const c10::IValue& o : stack) out_tensor |= ContainsTensor(o);
  const bool meta_query = IsMetaQuery(kind);
  if (on_meta && !out_tensor && !meta_query && !IsShapeQuery(kind)) {
    for (const c10::IValue& o : stack) {
      if (!o.isNone()) {
        throw MetaRefusal(absl::StrCat(OperatorName(*schema),
                                       " needs the values of tensor data"));
      }
    }
  }
  bool data, shape;
  if (meta_query) {
    data = shape = false;
  } else if (IsShapeQuery(kind)) {
    data = shape = tensor_shape || scalar_data;
  } else if (out_tensor) {
    data = tensor_data || scalar_data;
    shape = tensor_shape || scalar_data ||
            (HasDataDependentShape(kind) && tensor_data);
  } else {
    data = shape = tensor_data || tensor_shape || scalar_data;
  }

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
          DTypeName(static_cast<c10::ScalarType>(v.toInt())));
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

// Gives every tensor attribute in `m`'s tree a copy of its own (tied
// tensors stay tied). `m`'s module objects must be ours.
void CopyTensors(const jit::Module& m) {
  absl::flat_hash_map<const c10::TensorImpl*, at::Tensor> copies;
  c10::IValue::HashIdentityIValueMap memo;
  for (const jit::Module& sub : m.modules()) {
    const c10::intrusive_ptr<c10::ivalue::Object>& object = sub._ivalue();
    for (size_t i = 0; i < object->slots().size(); ++i) {
      c10::IValue v = object->getSlot(i);
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        if (!t.defined()) continue;
        auto [it, inserted] = copies.try_emplace(t.unsafeGetTensorImpl());
        if (inserted) {
          it->second = t.detach().clone(at::MemoryFormat::Preserve);
          if (t.requires_grad()) it->second.requires_grad_(true);
        }
        object->setSlot(i, it->second);
      } else if (!v.isObject() && ContainsTensor(v)) {
        object->setSlot(i, v.deepcopy(memo));
      }
    }
  }
}

// One trace of `module` (Note [Shadow execution]).
absl::StatusOr<runtime::GraphModule> TraceOnce(const jit::Module& module,
                                               const TraceOptions& options,
                                               bool meta) {
  jit::Module clone;
  try {
    // Meta mode runs nothing real on the module's tensors: new module
    // objects and types sharing them.
    clone = module.clone(/*inplace=*/meta);
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

absl::StatusOr<runtime::GraphModule> Trace(const torch::jit::Module& module,
                                           const TraceOptions& options) {
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
