#include "ir/verifier.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ir/names.h"

namespace tracecut::ir {
namespace internal {

// Reads what the public API hides: the name index and order keys (declared
// a friend in graph.h).
class VerifierAccess {
 public:
  static int64_t order_key(const Node* node) { return node->order_; }
  // The list links around `node` lead back to it.
  static bool SelfIteratorIsConsistent(const Node* node) {
    const Graph& g = *node->graph_;
    return (node->prev_ == nullptr ? g.first_ : node->prev_->next_) == node &&
           (node->next_ == nullptr ? g.last_ : node->next_->prev_) == node;
  }
  // Index entries sorted by name, so error reports are deterministic.
  static std::vector<std::pair<std::string, const Node*>> NameIndex(
      const Graph& graph) {
    std::vector<std::pair<std::string, const Node*>> out(graph.by_name_.begin(),
                                                         graph.by_name_.end());
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace internal

namespace {

using internal::VerifierAccess;

bool IsValidOpKind(OpKind op) {
  switch (op) {
    case OpKind::kPlaceholder:
    case OpKind::kGetAttr:
    case OpKind::kCallFunction:
    case OpKind::kCallMethod:
    case OpKind::kCallModule:
    case OpKind::kOutput:
      return true;
  }
  return false;
}

bool IsOperatorName(absl::string_view s) {
  if (s == "getitem") return true;
  size_t colons = s.find("::");
  if (colons == absl::string_view::npos) return false;
  absl::string_view ns = s.substr(0, colons);
  absl::string_view rest = s.substr(colons + 2);
  size_t dot = rest.find('.');
  absl::string_view name = rest.substr(0, dot);
  if (!IsIdentifier(ns) || !IsIdentifier(name)) return false;
  return dot == absl::string_view::npos || IsIdentifier(rest.substr(dot + 1));
}

// Collects a verification failure: the message and the node to blame.
class Checker {
 public:
  explicit Checker(const Graph& graph) : graph_(graph) {}

  absl::Status Run(const Node** culprit) {
    absl::Status status = RunChecks();
    if (culprit != nullptr) *culprit = status.ok() ? nullptr : culprit_;
    return status;
  }

 private:
  absl::Status Fail(const Node* node, absl::string_view what) {
    culprit_ = node;
    return absl::FailedPreconditionError(
        node == nullptr ? absl::StrCat("graph: ", what)
                        : absl::StrCat(node->Describe(), ": ", what));
  }

  absl::Status RunChecks() {
    if (absl::Status s = CheckMembership(); !s.ok()) return s;
    if (absl::Status s = CheckNames(); !s.ok()) return s;
    if (absl::Status s = CheckOrderKeys(); !s.ok()) return s;
    if (absl::Status s = CheckOperands(); !s.ok()) return s;
    if (absl::Status s = CheckUsers(); !s.ok()) return s;
    if (absl::Status s = CheckOps(); !s.ok()) return s;
    if (absl::Status s = CheckOutput(); !s.ok()) return s;
    return CheckMeta();
  }

  absl::Status CheckMembership() {
    for (const Node* n : graph_.nodes()) {
      if (n->graph() != &graph_) {
        return Fail(n, "node's graph pointer is not the graph that owns it");
      }
      if (!VerifierAccess::SelfIteratorIsConsistent(n)) {
        return Fail(n, "node's list position does not point at itself");
      }
      position_[n] = nodes_.size();
      nodes_.push_back(n);
    }
    return absl::OkStatus();
  }

  absl::Status CheckNames() {
    absl::flat_hash_map<absl::string_view, const Node*> seen;
    for (const Node* n : nodes_) {
      if (!IsIdentifier(n->name())) {
        return Fail(n, absl::StrCat("name \"", absl::CEscape(n->name()),
                                    "\" is not an identifier"));
      }
      auto [it, inserted] = seen.emplace(n->name(), n);
      if (!inserted) {
        return Fail(
            n, absl::StrCat("name is also used by ", it->second->Describe()));
      }
    }
    for (const Node* n : nodes_) {
      if (graph_.FindNode(n->name()) != n) {
        return Fail(n, "the graph's name index does not map its name to it");
      }
    }
    for (const auto& [name, node] : VerifierAccess::NameIndex(graph_)) {
      if (!position_.contains(node)) {
        return Fail(nullptr,
                    absl::StrCat("name index entry \"", absl::CEscape(name),
                                 "\" points at a node not in the graph"));
      }
      if (node->name() != name) {
        return Fail(node, absl::StrCat("stale name index entry \"",
                                       absl::CEscape(name), "\" points at it"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckOrderKeys() {
    for (size_t i = 1; i < nodes_.size(); ++i) {
      if (VerifierAccess::order_key(nodes_[i - 1]) >=
          VerifierAccess::order_key(nodes_[i])) {
        return Fail(
            nodes_[i],
            absl::StrCat("order key ", VerifierAccess::order_key(nodes_[i]),
                         " does not exceed the previous node's (",
                         VerifierAccess::order_key(nodes_[i - 1]),
                         "), so IsBefore() would be wrong"));
      }
    }
    return absl::OkStatus();
  }

  // Each referenced node must be in this graph (checked before it is
  // dereferenced: a pointer from elsewhere may dangle) and before the user.
  absl::Status CheckReference(const Node* user, const Node* ref,
                              absl::string_view where) {
    if (ref == nullptr) {
      return Fail(user, absl::StrCat(where, " is a null node reference"));
    }
    auto it = position_.find(ref);
    if (it == position_.end()) {
      return Fail(user, absl::StrCat(where,
                                     " references a node that is not in "
                                     "this graph"));
    }
    if (it->second >= position_.at(user)) {
      return Fail(user, absl::StrCat(where, " references ", ref->Describe(),
                                     ", which does not come before it"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckArgument(const Node* user, const Argument& arg,
                             absl::string_view where) {
    absl::Status status;
    arg.ForEachNode([&](Node* ref) {
      if (status.ok()) status = CheckReference(user, ref, where);
    });
    return status;
  }

  absl::Status CheckOperands() {
    for (const Node* n : nodes_) {
      for (size_t i = 0; i < n->args().size(); ++i) {
        if (absl::Status s =
                CheckArgument(n, n->args()[i], absl::StrCat("argument ", i));
            !s.ok()) {
          return s;
        }
      }
      absl::flat_hash_set<absl::string_view> keys;
      for (const auto& [key, value] : n->kwargs()) {
        if (!IsIdentifier(key)) {
          return Fail(n, absl::StrCat("kwarg name \"", absl::CEscape(key),
                                      "\" is not an identifier"));
        }
        if (!keys.insert(key).second) {
          return Fail(n, absl::StrCat("kwarg ", key, " is given twice"));
        }
        if (absl::Status s =
                CheckArgument(n, value, absl::StrCat("kwarg ", key));
            !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckUsers() {
    // Operands are known good now, so inputs() only yields graph members.
    absl::flat_hash_map<const Node*, absl::flat_hash_set<const Node*>> readers;
    for (const Node* n : nodes_) {
      for (const Node* in : n->inputs()) readers[in].insert(n);
    }
    for (const Node* n : nodes_) {
      const absl::flat_hash_set<const Node*>& expected = readers[n];
      absl::flat_hash_set<const Node*> listed;
      for (const Node* u : n->users()) {
        if (u == nullptr || !position_.contains(u)) {
          return Fail(n, "users list holds a node that is not in this graph");
        }
        if (!listed.insert(u).second) {
          return Fail(
              n, absl::StrCat("users list holds ", u->Describe(), " twice"));
        }
        if (!expected.contains(u)) {
          return Fail(n, absl::StrCat("users list holds ", u->Describe(),
                                      ", which does not read it"));
        }
      }
      // Report a missing user in graph order, for a deterministic message.
      if (listed.size() != expected.size()) {
        for (const Node* m : nodes_) {
          if (expected.contains(m) && !listed.contains(m)) {
            return Fail(n, absl::StrCat(m->Describe(),
                                        " reads it but is missing from its "
                                        "users list"));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckOps() {
    const Node* first_non_placeholder = nullptr;
    for (const Node* n : nodes_) {
      if (!IsValidOpKind(n->op())) {
        return Fail(
            n, absl::StrCat("invalid op kind ", static_cast<int>(n->op())));
      }
      if (n->op() == OpKind::kPlaceholder) {
        if (first_non_placeholder != nullptr) {
          return Fail(n, absl::StrCat("placeholder comes after ",
                                      first_non_placeholder->Describe(),
                                      "; placeholders must come first"));
        }
      } else if (first_non_placeholder == nullptr) {
        first_non_placeholder = n;
      }
      if ((n->op() == OpKind::kPlaceholder || n->op() == OpKind::kGetAttr) &&
          !n->inputs().empty()) {
        return Fail(n, absl::StrCat(OpKindName(n->op()),
                                    " must not read other nodes, but reads %",
                                    n->inputs().front()->name()));
      }
      if (absl::Status s = CheckTarget(n->op(), n->target()); !s.ok()) {
        return Fail(n, s.message());
      }
      const std::vector<ScopeEntry>& stack = n->scope().stack();
      for (size_t i = 0; i < stack.size(); ++i) {
        if (!IsScopePath(stack[i].path)) {
          return Fail(n, absl::StrCat("scope entry ", i,
                                      " has a malformed module path \"",
                                      absl::Utf8SafeCEscape(stack[i].path),
                                      "\": expected \"\" (the root) or ",
                                      kModulePathRule));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckOutput() {
    const Node* output = nullptr;
    for (const Node* n : nodes_) {
      if (n->op() != OpKind::kOutput) continue;
      if (output != nullptr) {
        return Fail(n, absl::StrCat("second output node; the first is ",
                                    output->Describe()));
      }
      output = n;
    }
    if (output == nullptr) return Fail(nullptr, "graph has no output node");
    if (output != nodes_.back()) {
      return Fail(output,
                  absl::StrCat("output node is not last; ",
                               nodes_.back()->Describe(), " comes after it"));
    }
    if (output->args().size() != 1 || !output->kwargs().empty()) {
      return Fail(output,
                  absl::StrCat("output takes exactly one positional argument "
                               "and no kwargs, but has ",
                               output->args().size(), " argument(s) and ",
                               output->kwargs().size(), " kwarg(s)"));
    }
    if (!output->users().empty()) {
      return Fail(output, absl::StrCat("output node is read by ",
                                       output->users().front()->Describe()));
    }
    return absl::OkStatus();
  }

  absl::Status CheckMeta() {
    for (const Node* n : nodes_) {
      for (const auto& [key, value] : n->meta().extra) {
        if (!value.IsConstant()) {
          return Fail(n, absl::StrCat("meta extra \"", absl::CEscape(key),
                                      "\" references a node; meta values "
                                      "must be constants"));
        }
      }
    }
    for (const auto& [key, value] : graph_.meta().extra) {
      if (!value.IsConstant()) {
        return Fail(nullptr,
                    absl::StrCat("graph meta extra \"", absl::CEscape(key),
                                 "\" references a node; meta values "
                                 "must be constants"));
      }
    }
    return absl::OkStatus();
  }

  const Graph& graph_;
  std::vector<const Node*> nodes_;
  absl::flat_hash_map<const Node*, size_t> position_;
  const Node* culprit_ = nullptr;
};

}  // namespace

absl::Status CheckTarget(OpKind op, absl::string_view target) {
  auto bad = [&](absl::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", OpKindName(op), " target \"",
                     absl::Utf8SafeCEscape(target), "\": expected ", expected));
  };
  switch (op) {
    case OpKind::kGetAttr:
    case OpKind::kCallModule:
      if (!IsModulePath(target)) return bad(kModulePathRule);
      break;
    case OpKind::kCallFunction:
      if (!IsOperatorName(target)) {
        return bad(
            "\"ns::name\" or \"ns::name.overload\" (e.g. "
            "\"aten::add.Tensor\") or \"getitem\"");
      }
      break;
    case OpKind::kCallMethod:
      if (!IsIdentifier(target)) return bad("a method name (an identifier)");
      break;
    case OpKind::kPlaceholder:
    case OpKind::kOutput:
      if (target.empty()) return bad("a non-empty string");
      break;
  }
  return absl::OkStatus();
}

absl::Status Verify(const Graph& graph) { return Verify(graph, nullptr); }

absl::Status Verify(const Graph& graph, const Node** culprit) {
  return Checker(graph).Run(culprit);
}

}  // namespace tracecut::ir
