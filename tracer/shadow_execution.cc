// Meta mode of the tracer's shadow execution (Note [Shadow execution]):
// meta twins, operators and leaf modules run on them, and the analyses that
// decide whether a leaf may read data or write module state.

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "tracer/tracer_internal.h"

namespace tracecut::tracer::internal {
namespace {

const c10::Symbol kWhere = c10::Symbol::fromQualString("aten::where");

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

}  // namespace

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

}  // namespace tracecut::tracer::internal
