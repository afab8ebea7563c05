#include "runtime/graph_module.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

using torch::jit::Module;

std::string TypeName(const Module& m) {
  return ir::Scope::ShortType(
      ir::Scope::DemangleType(m.type()->name()->qualifiedName()));
}

// "a.b.c" -> {"a", "b", "c"}; "" -> {}. Empty components are errors.
absl::StatusOr<std::vector<std::string>> SplitPath(absl::string_view path) {
  if (path.empty()) return std::vector<std::string>();
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (const std::string& p : parts) {
    if (p.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed attribute path '", path, "'"));
    }
  }
  return parts;
}

std::string JoinPrefix(const std::vector<std::string>& parts, size_t n) {
  return absl::StrJoin(parts.begin(), parts.begin() + n, ".");
}

std::string DescribeModule(const std::vector<std::string>& parts, size_t n,
                           const Module& m) {
  std::string where = n == 0 ? "<root>" : JoinPrefix(parts, n);
  return absl::StrCat("module '", where, "' (", TypeName(m), ")");
}

// The module at parts[0..n). Does not throw.
absl::StatusOr<Module> WalkModules(const Module& root,
                                   const std::vector<std::string>& parts,
                                   size_t n, absl::string_view full_path) {
  Module m = root;
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = parts[i];
    if (!m.type()->hasAttribute(name)) {
      return absl::NotFoundError(absl::StrCat(
          "attribute path '", full_path, "': ", DescribeModule(parts, i, m),
          " has no attribute '", name, "'"));
    }
    c10::IValue v = m._ivalue()->getAttr(name);
    if (!v.isObject() || !v.toObjectRef().type()->is_module()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attribute path '", full_path, "': '", JoinPrefix(parts, i + 1),
          "' is a ", v.type()->repr_str(), ", not a module"));
    }
    m = Module(v.toObject());
  }
  return m;
}

// Replaces every non-module attribute of every module in `m`'s tree with a
// deep copy. `m` must not share module objects with anything we must keep.
void DeepCopyData(const Module& m) {
  TensorCopier tensors(m);
  c10::IValue::HashIdentityIValueMap others;
  for (const Module& sub : m.modules()) {
    const c10::ClassTypePtr& type = sub.type();
    const auto& obj = sub._ivalue();
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      c10::IValue v = obj->getSlot(i);
      if (v.isTensor()) {
        obj->setSlot(i, tensors.Copy(v.toTensor()));
      } else if (v.isObject() && v.toObjectRef().type()->is_module()) {
        continue;  // Visited by modules().
      } else if (v.isTensorList() || v.isList() || v.isTuple() ||
                 v.isGenericDict() || v.isObject()) {
        obj->setSlot(i, v.deepcopy(others));
      }
    }
  }
}

int CountInstancesOfType(const Module& root, const c10::ClassTypePtr& type) {
  int n = 0;
  for (const Module& sub : root.modules()) {
    if (sub.type() == type) ++n;
  }
  return n;
}

// Gives the module at parts[0..n) a ClassType that no other module in the
// tree uses (see GraphModule::SetTensor). Throws on LibTorch errors.
absl::Status EnsurePrivateType(Module& root,
                               const std::vector<std::string>& parts, size_t n,
                               absl::string_view full_path) {
  if (n == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Module m, WalkModules(root, parts, n, full_path));
  if (CountInstancesOfType(root, m.type()) <= 1) return absl::OkStatus();
  // The parent's attribute type changes below: the parent needs its own
  // type first.
  RETURN_IF_ERROR(EnsurePrivateType(root, parts, n - 1, full_path));
  ASSIGN_OR_RETURN(Module parent, WalkModules(root, parts, n - 1, full_path));
  // A new object of a new type holding the same tensors.
  Module fresh = m.clone(/*inplace=*/true);
  const std::string& name = parts[n - 1];
  parent.type()->unsafeChangeAttributeType(name, fresh.type());
  parent._ivalue()->setAttr(name, fresh._ivalue());
  return absl::OkStatus();
}

}  // namespace

TensorCopier::TensorCopier(const Module& m) {
  for (const Module& sub : m.modules()) {
    for (const c10::IValue& v : sub._ivalue()->slots()) {
      if (v.isTensor() && v.toTensor().defined()) {
        ++users_[v.toTensor().storage().unsafeGetStorageImpl()];
      }
    }
  }
}

at::Tensor TensorCopier::Copy(const at::Tensor& t) {
  if (!t.defined()) return t;
  auto it = copies_.find(t.unsafeGetTensorImpl());
  if (it != copies_.end()) return it->second;
  at::Tensor copy;
  {
    at::NoGradGuard no_grad;
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (users_[s] > 1 || at::has_internal_overlap(t) == at::MemOverlap::Yes) {
      auto [st, first] = storages_.try_emplace(s);
      if (first) {
        const int64_t elements =
            static_cast<int64_t>(t.storage().nbytes()) / t.element_size();
        st->second = at::empty({0}, t.options())
                         .set_(t.storage(), 0, {elements}, {1})
                         .clone();
      }
      copy = st->second.as_strided(t.sizes(), t.strides(), t.storage_offset());
    } else {
      copy = t.clone(at::MemoryFormat::Preserve);
    }
  }
  if (t.requires_grad()) copy.requires_grad_(true);
  copies_.emplace(t.unsafeGetTensorImpl(), copy);
  return copy;
}

absl::StatusOr<GraphModule> GraphModule::Clone() const {
  ASSIGN_OR_RETURN(Module copy, TorchCall("cloning module", [&] {
                     // Fresh module objects and types sharing our tensors,
                     // then every tensor copied once (so ties survive,
                     // which Module::clone(false) does not guarantee).
                     Module m = module_.clone(/*inplace=*/true);
                     DeepCopyData(m);
                     return m;
                   }));
  GraphModule result(std::move(copy), graph_->Clone());
  result.extra_files_ = extra_files_;
  return result;
}

absl::StatusOr<torch::Tensor> GraphModule::GetTensor(
    absl::string_view path) const {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(path));
  if (parts.empty()) {
    return absl::InvalidArgumentError("empty attribute path");
  }
  return TorchCall(
      absl::StrCat("reading '", path, "'"),
      [&]() -> absl::StatusOr<torch::Tensor> {
        ASSIGN_OR_RETURN(Module parent,
                         WalkModules(module_, parts, parts.size() - 1, path));
        const std::string& name = parts.back();
        if (!parent.type()->hasAttribute(name)) {
          return absl::NotFoundError(absl::StrCat(
              "attribute path '", path,
              "': ", DescribeModule(parts, parts.size() - 1, parent),
              " has no attribute '", name, "'"));
        }
        c10::IValue v = parent._ivalue()->getAttr(name);
        if (!v.isTensor()) {
          return absl::InvalidArgumentError(
              absl::StrCat("attribute path '", path, "' holds a ",
                           v.type()->repr_str(), ", not a tensor"));
        }
        return v.toTensor();
      });
}

absl::Status GraphModule::SetTensor(absl::string_view path,
                                    const torch::Tensor& value) {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(path));
  if (parts.empty()) {
    return absl::InvalidArgumentError("empty attribute path");
  }
  return TorchCall(absl::StrCat("setting '", path, "'"), [&]() -> absl::Status {
    const size_t n = parts.size() - 1;
    const std::string& name = parts.back();
    ASSIGN_OR_RETURN(Module parent, WalkModules(module_, parts, n, path));
    if (parent.type()->hasAttribute(name)) {
      const c10::TypePtr& declared = parent.type()->getAttribute(name);
      if (!c10::TensorType::get()->isSubtypeOf(*declared)) {
        return absl::InvalidArgumentError(
            absl::StrCat("attribute path '", path, "' holds a ",
                         declared->repr_str(), ", not a tensor"));
      }
      parent._ivalue()->setAttr(name, value);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(EnsurePrivateType(module_, parts, n, path));
    ASSIGN_OR_RETURN(parent, WalkModules(module_, parts, n, path));
    parent.register_buffer(name, value);
    return absl::OkStatus();
  });
}

absl::StatusOr<torch::jit::Module> GraphModule::GetSubmodule(
    absl::string_view path) const {
  ASSIGN_OR_RETURN(std::vector<std::string> parts, SplitPath(path));
  return TorchCall(absl::StrCat("reading submodule '", path, "'"), [&] {
    return WalkModules(module_, parts, parts.size(), path);
  });
}

}  // namespace tracecut::runtime
