#include "runtime/prune_unused.h"

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

using ObjectPtr = c10::intrusive_ptr<c10::ivalue::Object>;

bool IsTensorType(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  const auto* opt = type->castRaw<c10::OptionalType>();
  return opt != nullptr &&
         opt->getElementType()->kind() == c10::TypeKind::TensorType;
}

// The methods of `type` that `starts` call on self, directly or through
// each other; calls of forward are not followed.
absl::flat_hash_set<std::string> Callees(const c10::ClassType& type,
                                         std::vector<std::string> starts) {
  absl::flat_hash_set<std::string> callees;
  while (!starts.empty()) {
    torch::jit::Function* fn = type.findMethod(starts.back());
    if (fn == nullptr) fn = type.findHook(starts.back());
    starts.pop_back();
    if (fn == nullptr || !fn->isGraphFunction()) continue;
    const std::shared_ptr<torch::jit::Graph> g =
        torch::jit::toGraphFunction(*fn).graph();
    if (g->inputs().empty()) continue;
    for (const torch::jit::Use& use : g->inputs()[0]->uses()) {
      if (use.user->kind() != c10::prim::CallMethod || use.offset != 0) {
        continue;
      }
      const std::string callee = use.user->s(c10::attr::name);
      if (callee != "forward" && callees.insert(callee).second) {
        starts.push_back(callee);
      }
    }
  }
  return callees;
}

class Pruner {
 public:
  explicit Pruner(torch::jit::Module& root) : root_(root) {}

  absl::StatusOr<std::vector<std::string>> Run(
      const GraphModule& gm, const std::vector<std::string>& outlined) {
    Collect(root_._ivalue(), "");
    for (const std::string& path : outlined) {
      ASSIGN_OR_RETURN(Target t, MarkPath(path));
      if (t.module >= 0) outlined_.insert(infos_[t.module].type.get());
    }
    for (const ir::Node* node : gm.graph().nodes()) {
      if (node->op() != ir::OpKind::kCallModule &&
          node->op() != ir::OpKind::kGetAttr) {
        continue;
      }
      ASSIGN_OR_RETURN(Target t, MarkPath(node->target()));
      if (t.module >= 0) infos_[t.module].whole = true;
    }
    const c10::ClassTypePtr& root_type = root_.type();
    dead_methods_ = OldForwardMethods(*gm.module().type());
    std::vector<torch::jit::Function*> root_methods;
    for (torch::jit::Function* fn : root_type->methods()) {
      if (fn->name() != "forward" && !dead_methods_.contains(fn->name())) {
        root_methods.push_back(fn);
      }
    }
    for (torch::jit::Function* fn : root_type->getForwardHooks()) {
      root_methods.push_back(fn);
    }
    for (torch::jit::Function* fn : root_type->getForwardPreHooks()) {
      root_methods.push_back(fn);
    }
    for (torch::jit::Function* fn : root_methods) {
      // Self used in a way we do not follow: keep everything.
      if (!fn->isGraphFunction()) return std::vector<std::string>();
      const std::shared_ptr<torch::jit::Graph> g =
          torch::jit::toGraphFunction(*fn).graph();
      if (g->inputs().empty() || !MarkUses(g->inputs()[0], 0)) {
        return std::vector<std::string>();
      }
    }
    for (size_t i = 1; i < infos_.size(); ++i) {
      if (HasHooksOrState(*infos_[i].type)) infos_[i].whole = true;
    }
    CloseWhole();
    if (infos_[0].whole) return std::vector<std::string>();
    MarkKept(0);
    return Remove();
  }

 private:
  struct Child {
    std::string name;
    int index;
  };
  struct Info {
    ObjectPtr object;
    c10::ClassTypePtr type;
    std::string path;  // The first path it was found at.
    std::vector<Child> children;
    absl::flat_hash_set<std::string> needed;  // Attributes to keep.
    bool whole = false;                       // Everything kept, methods too.
    bool kept = false;
  };
  struct Target {
    int module = -1;  // The target's own Info when it is a module.
  };

  static std::string Join(const std::string& path, const std::string& name) {
    return path.empty() ? name : absl::StrCat(path, ".", name);
  }

  int Collect(const ObjectPtr& object, const std::string& path) {
    auto [it, inserted] = index_.try_emplace(object.get(), infos_.size());
    if (!inserted) return it->second;
    const int index = it->second;
    infos_.push_back({object, object->type(), path, {}, {}, false, false});
    const c10::ClassTypePtr type = object->type();
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      const c10::TypePtr& attr = type->getAttribute(i);
      const c10::IValue& slot = object->getSlot(i);
      if (!attr->is_module() || !slot.isObject()) continue;
      const std::string name = type->getAttributeName(i);
      const int child = Collect(slot.toObject(), Join(path, name));
      infos_[index].children.push_back({name, child});
      // An interface-typed attribute needs the methods the interface names.
      if (attr->castRaw<c10::ClassType>() == nullptr) {
        infos_[child].whole = true;
      }
    }
    return index;
  }

  int ChildIndex(int parent, const std::string& name) const {
    for (const Child& c : infos_[parent].children) {
      if (c.name == name) return c.index;
    }
    return -1;
  }

  // Marks every attribute on the way to `path` as needed.
  absl::StatusOr<Target> MarkPath(const std::string& path) {
    int current = 0;
    std::vector<std::string> parts = absl::StrSplit(path, '.');
    for (size_t i = 0; i < parts.size(); ++i) {
      Info& info = infos_[current];
      if (!info.type->hasAttribute(parts[i])) {
        return absl::InternalError(absl::StrCat("pruning the lowered module: '",
                                                path, "' does not resolve"));
      }
      info.needed.insert(parts[i]);
      const int child = ChildIndex(current, parts[i]);
      if (child < 0) {
        if (i + 1 != parts.size()) {
          return absl::InternalError(
              absl::StrCat("pruning the lowered module: '", path,
                           "' goes through a non-module"));
        }
        return Target{};
      }
      current = child;
    }
    return Target{current};
  }

  // Marks what the uses of `value` (which holds module `index`) reach.
  // False when the root itself escapes (passed on, stored, compared).
  bool MarkUses(const torch::jit::Value* value, int index) {
    for (const torch::jit::Use& use : value->uses()) {
      const torch::jit::Node* n = use.user;
      const bool on_object = use.offset == 0;
      if (on_object && (n->kind() == c10::prim::GetAttr ||
                        n->kind() == c10::prim::SetAttr)) {
        const std::string name = n->s(c10::attr::name);
        infos_[index].needed.insert(name);
        const int child = ChildIndex(index, name);
        if (child < 0) continue;
        if (n->kind() == c10::prim::SetAttr || !MarkUses(n->output(), child)) {
          infos_[child].whole = true;
        }
      } else if (index == 0 && on_object &&
                 n->kind() == c10::prim::CallMethod) {
        // Another root method: each is followed on its own.
        continue;
      } else if (index == 0) {
        return false;
      } else {
        infos_[index].whole = true;
      }
    }
    return true;
  }

  // Whole modules' subtrees are whole, and so are all instances of a type
  // that some whole module has (they share its methods).
  void CloseWhole() {
    for (bool changed = true; changed;) {
      changed = false;
      absl::flat_hash_set<const c10::ClassType*> whole_types;
      for (const Info& info : infos_) {
        if (info.whole) whole_types.insert(info.type.get());
      }
      for (Info& info : infos_) {
        if (!info.whole && whole_types.contains(info.type.get())) {
          info.whole = true;
          changed = true;
        }
        if (!info.whole) continue;
        for (const Child& c : info.children) {
          if (!infos_[c.index].whole) {
            infos_[c.index].whole = true;
            changed = true;
          }
        }
      }
    }
  }

  void MarkKept(int index) {
    Info& info = infos_[index];
    if (info.kept) return;
    info.kept = true;
    for (const Child& c : info.children) {
      if (info.whole || info.needed.contains(c.name)) MarkKept(c.index);
    }
  }

  absl::StatusOr<std::vector<std::string>> Remove() {
    // The pruned types, in first-seen order, with all their instances.
    std::vector<c10::ClassType*> types;
    absl::flat_hash_map<c10::ClassType*, std::vector<int>> instances;
    for (size_t i = 0; i < infos_.size(); ++i) {
      c10::ClassType* type = infos_[i].type.get();
      auto [it, inserted] = instances.try_emplace(type);
      if (inserted) types.push_back(type);
      it->second.push_back(static_cast<int>(i));
    }
    std::vector<std::string> removed;
    for (c10::ClassType* type : types) {
      const std::vector<int>& objects = instances[type];
      bool any_kept = false;
      absl::flat_hash_set<std::string> needed;
      for (int i : objects) {
        if (infos_[i].whole) break;  // Then all of them are (CloseWhole).
        any_kept |= infos_[i].kept;
        needed.insert(infos_[i].needed.begin(), infos_[i].needed.end());
      }
      if (!any_kept || infos_[objects[0]].whole) continue;
      std::vector<std::string> names;
      for (size_t s = 0; s < type->numAttributes(); ++s) {
        const c10::TypePtr& attr = type->getAttribute(s);
        const std::string name = type->getAttributeName(s);
        if ((attr->is_module() || IsTensorType(attr)) &&
            !needed.contains(name)) {
          names.push_back(name);
        }
      }
      RETURN_IF_ERROR(TorchCall("pruning the lowered module", [&] {
        for (const std::string& name : names) {
          const size_t slot = type->getAttributeSlot(name);
          for (int i : objects) infos_[i].object->unsafeRemoveSlot(slot);
          type->unsafeRemoveAttribute(name);
        }
        // The root keeps its methods, except those of its old forward;
        // outlined modules keep their new forward.
        std::vector<std::string> methods;
        for (torch::jit::Function* fn : type->methods()) {
          if (outlined_.contains(type) && fn->name() == "forward") continue;
          if (objects[0] != 0 || dead_methods_.contains(fn->name())) {
            methods.push_back(fn->name());
          }
        }
        std::shared_ptr<torch::jit::CompilationUnit> cu =
            type->compilation_unit();
        for (const std::string& method : methods) {
          type->unsafeRemoveMethod(method);
          const c10::QualifiedName qualified(*type->name(), method);
          if (cu->find_function(qualified) != nullptr) {
            cu->unsafeRemoveMethod(qualified);
          }
        }
      }));
      for (int i : objects) {
        if (!infos_[i].kept) continue;
        for (const std::string& name : names) {
          removed.push_back(Join(infos_[i].path, name));
        }
      }
    }
    std::sort(removed.begin(), removed.end());
    return removed;
  }

  torch::jit::Module& root_;
  absl::flat_hash_set<std::string> dead_methods_;        // Of the root.
  absl::flat_hash_set<const c10::ClassType*> outlined_;  // Keep forward.
  std::vector<Info> infos_;
  absl::flat_hash_map<const c10::ivalue::Object*, int> index_;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> PruneUnused(
    const GraphModule& gm, torch::jit::Module& lowered,
    const std::vector<std::string>& outlined) {
  return Pruner(lowered).Run(gm, outlined);
}

bool HasHooksOrState(const c10::ClassType& type) {
  return !type.getForwardHooks().empty() ||
         !type.getForwardPreHooks().empty() ||
         type.findMethod("__getstate__") != nullptr ||
         type.findMethod("__setstate__") != nullptr;
}

absl::flat_hash_set<std::string> OldForwardMethods(const c10::ClassType& type) {
  absl::flat_hash_set<std::string> dead = Callees(type, {"forward"});
  std::vector<std::string> entries;
  for (const torch::jit::Function* fn : type.methods()) {
    if (fn->name() != "forward" && !dead.contains(fn->name())) {
      entries.push_back(fn->name());
    }
  }
  for (const auto* hooks :
       {&type.getForwardHooks(), &type.getForwardPreHooks()}) {
    for (const torch::jit::Function* fn : *hooks) {
      entries.push_back(fn->name());
    }
  }
  for (const std::string& live : Callees(type, entries)) dead.erase(live);
  return dead;
}

}  // namespace tracecut::runtime
