#ifndef TRACECUT_TRACER_TRACER_INTERNAL_H_
#define TRACECUT_TRACER_TRACER_INTERNAL_H_

// The TorchScript tracer's internals, shared by its source files:
// tracer.cc (driver, errors, IR helpers), node_handlers.cc (one handler per
// TorchScript node kind), shadow_execution.cc (meta mode) and
// source_info.cc. Not part of the API.

#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "tracer/tracer.h"

namespace tracecut::tracer::internal {

namespace jit = torch::jit;

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

// Operator classes (shadow_execution.cc).
// Operators whose (non-tensor) result depends on shapes only.
bool IsShapeQuery(c10::Symbol kind);
// Operators whose result depends on dtype/device/None-ness only; folded to
// constants (the trace is specialised to them, as torch.jit.trace is).
bool IsMetaQuery(c10::Symbol kind);
// Operators whose output shape depends on input values.
bool HasDataDependentShape(c10::Symbol kind);

// Thrown when meta execution cannot stand in for real execution (Note
// [Shadow execution]); becomes an error status like any operator failure.
class MetaRefusal : public std::runtime_error {
 public:
  explicit MetaRefusal(const std::string& what)
      : std::runtime_error(absl::StrCat("meta execution: ", what)) {}
};

bool ContainsTensor(const c10::IValue& v);
// The demangled type name of `m`.
std::string TypeNameOf(const jit::Module& m);
// "aten::add.Tensor"; the bare name without an overload.
std::string OperatorName(const c10::FunctionSchema& schema);
// The first non-blank line of an error message, trimmed.
std::string FirstLine(const std::string& s);

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
  absl::StatusOr<ir::Argument> ToArgument(const Value& v, c10::TypePtr type);
  absl::StatusOr<ir::Argument> ConstantArgument(const c10::IValue& v,
                                                c10::TypePtr type);
  absl::StatusOr<ir::Node*> AttrNode(const std::string& path,
                                     const c10::IValue& tensor);
  absl::StatusOr<ir::Node*> LiftConstant(const at::Tensor& t);
  absl::StatusOr<ir::Node*> AddNode(ir::OpKind op, std::string target,
                                    std::vector<ir::Argument> args,
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

}  // namespace tracecut::tracer::internal

#endif  // TRACECUT_TRACER_TRACER_INTERNAL_H_
