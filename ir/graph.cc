#include "ir/graph.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ir/names.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace tracecut::ir {
namespace {

// Gap between consecutive order keys, so inserts rarely renumber.
constexpr int64_t kOrderGap = int64_t{1} << 20;

constexpr struct {
  OpKind op;
  absl::string_view name;
} kOpNames[] = {
    {OpKind::kPlaceholder, "placeholder"},
    {OpKind::kGetAttr, "get_attr"},
    {OpKind::kCallFunction, "call_function"},
    {OpKind::kCallMethod, "call_method"},
    {OpKind::kCallModule, "call_module"},
    {OpKind::kOutput, "output"},
};

// Distinct-node collector: nodes read a handful of operands, so a linear
// scan beats a hash set until the list gets long (a graph's output node, a
// cat of many tensors); only then does it switch to one. `Vec` is a
// std::vector or an absl::InlinedVector of Node*.
template <typename Vec>
class NodeCollector {
 public:
  explicit NodeCollector(Vec& out) : out_(out) {
    if (out_.size() >= kLinearLimit) seen_.insert(out_.begin(), out_.end());
  }

  void Add(Node* n) {
    if (!seen_.empty()) {
      if (seen_.insert(n).second) out_.push_back(n);
      return;
    }
    for (Node* m : out_) {
      if (m == n) return;
    }
    out_.push_back(n);
    if (out_.size() == kLinearLimit) seen_.insert(out_.begin(), out_.end());
  }

  // Depth first, left to right (Argument::ForEachNode's order), without a
  // std::function per node.
  void Visit(const Argument& a) {
    if (a.is_node()) {
      Add(a.node());
    } else if (a.is_sequence()) {
      for (const Argument& e : a.elements()) Visit(e);
    }
  }

 private:
  static constexpr size_t kLinearLimit = 16;
  Vec& out_;
  absl::flat_hash_set<Node*> seen_;
};

template <typename Vec>
void CollectNodes(const std::vector<Argument>& args, const Kwargs& kwargs,
                  Vec& out) {
  NodeCollector<Vec> c(out);
  for (const Argument& a : args) c.Visit(a);
  for (const auto& [key, a] : kwargs) c.Visit(a);
}

// A target or module path as Describe() shows it: as is, unless a space,
// quote, backslash or control character would make the one-line message
// ambiguous (module names may hold any of them); then quoted and escaped,
// UTF-8 kept.
std::string ForMessage(absl::string_view s) {
  const bool plain = std::none_of(s.begin(), s.end(), [](char ch) {
    const unsigned char c = static_cast<unsigned char>(ch);
    return c <= 0x20 || c == 0x7f || c == '"' || c == '\\';
  });
  return plain ? std::string(s)
               : absl::StrCat("\"", absl::Utf8SafeCEscape(s), "\"");
}

}  // namespace

absl::string_view OpKindName(OpKind op) {
  for (const auto& e : kOpNames) {
    if (e.op == op) return e.name;
  }
  return "unknown";
}

std::optional<OpKind> ParseOpKind(absl::string_view name) {
  for (const auto& e : kOpNames) {
    if (e.name == name) return e.op;
  }
  return std::nullopt;
}

// -------------------------------------------------------------------- Node

Node::Node(Graph* graph, OpKind op, std::string name, std::string target)
    : graph_(graph),
      op_(op),
      name_(std::move(name)),
      target_(std::move(target)) {}

const Argument* Node::kwarg(absl::string_view key) const {
  for (const auto& [k, v] : kwargs_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const NodeMeta& Node::EmptyMeta() {
  static const NodeMeta* const kEmpty = new NodeMeta();
  return *kEmpty;
}

NodeMeta& Node::meta() {
  if (meta_ == nullptr) {
    meta_ = std::make_shared<NodeMeta>();
  } else if (meta_.use_count() > 1) {
    meta_ = std::make_shared<NodeMeta>(*meta_);
  } else {
    // Sole owner now: whatever the last other owner (maybe on another
    // thread) did with it happened before its reference was dropped.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  return *meta_;
}

std::vector<Node*> Node::inputs() const {
  std::vector<Node*> out;
  CollectNodes(args_, kwargs_, out);
  return out;
}

Node* Node::prev() const { return prev_; }

Node* Node::next() const { return next_; }

std::string Node::Describe() const {
  std::string s = absl::StrCat("%", name_, " (", OpKindName(op_));
  if (!target_.empty()) absl::StrAppend(&s, " ", ForMessage(target_));
  if (!scope_.empty()) {
    absl::StrAppend(
        &s, " in ",
        scope_.path().empty() ? "<root>" : ForMessage(scope_.path()));
  }
  if (const NodeMeta& meta = this->meta(); meta.source.has_value()) {
    absl::StrAppend(&s, " at ", meta.source->file, ":", meta.source->line);
  }
  absl::StrAppend(&s, ")");
  return s;
}

absl::Status Node::CheckOperands(const std::vector<Argument>& args,
                                 const Kwargs& kwargs) const {
  std::vector<Node*> refs;
  CollectNodes(args, kwargs, refs);
  return CheckRefs(refs);
}

absl::Status Node::CheckRefs(absl::Span<Node* const> refs) const {
  for (Node* n : refs) {
    if (n == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(Describe(), ": operand is a null node reference"));
    }
    if (n->graph_ != graph_) {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(), ": operand %", n->name_, " belongs to another graph"));
    }
    if (n == this || !n->IsBefore(this)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Describe(), ": operand %", n->name_,
          " does not come before it (topological order would break)"));
    }
  }
  return absl::OkStatus();
}

void Node::UpdateUses(const std::vector<Node*>& old_inputs) {
  std::vector<Node*> now = inputs();
  if (old_inputs.empty()) {
    for (Node* n : now) n->users_.push_back(this);
    return;
  }
  absl::flat_hash_set<Node*> now_set(now.begin(), now.end());
  absl::flat_hash_set<Node*> old_set(old_inputs.begin(), old_inputs.end());
  for (Node* n : old_inputs) {
    if (!now_set.contains(n)) {
      auto& u = n->users_;
      u.erase(std::remove(u.begin(), u.end(), this), u.end());
    }
  }
  for (Node* n : now) {
    if (!old_set.contains(n)) n->users_.push_back(this);
  }
}

absl::Status Node::SetArgs(std::vector<Argument> args) {
  if (absl::Status s = CheckOperands(args, {}); !s.ok()) return s;
  std::vector<Node*> old = inputs();
  args_ = std::move(args);
  UpdateUses(old);
  return absl::OkStatus();
}

absl::Status Node::SetKwargs(Kwargs kwargs) {
  if (absl::Status s = CheckOperands({}, kwargs); !s.ok()) return s;
  std::vector<Node*> old = inputs();
  kwargs_ = std::move(kwargs);
  UpdateUses(old);
  return absl::OkStatus();
}

absl::Status Node::SetArg(size_t index, Argument arg) {
  if (index >= args_.size()) {
    return absl::OutOfRangeError(absl::StrCat(
        Describe(), ": no argument ", index, " (has ", args_.size(), ")"));
  }
  std::vector<Argument> args = args_;
  args[index] = std::move(arg);
  return SetArgs(std::move(args));
}

absl::Status Node::SetKwarg(absl::string_view key, Argument arg) {
  Kwargs kwargs = kwargs_;
  bool found = false;
  for (auto& [k, v] : kwargs) {
    if (k == key) {
      v = arg;
      found = true;
    }
  }
  if (!found) kwargs.emplace_back(std::string(key), std::move(arg));
  return SetKwargs(std::move(kwargs));
}

absl::Status Node::ReplaceInput(Node* from, Node* to) {
  auto swap = [&](Node* n) { return n == from ? to : n; };
  std::vector<Argument> args;
  for (const Argument& a : args_) args.push_back(a.MapNodes(swap));
  Kwargs kwargs;
  for (const auto& [k, v] : kwargs_) kwargs.emplace_back(k, v.MapNodes(swap));
  if (absl::Status s = CheckOperands(args, kwargs); !s.ok()) return s;
  std::vector<Node*> old = inputs();
  args_ = std::move(args);
  kwargs_ = std::move(kwargs);
  UpdateUses(old);
  return absl::OkStatus();
}

// ------------------------------------------------------------------- Graph

Node* Graph::FindNode(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Node* Graph::output_node() const {
  for (Node* n = last_; n != nullptr; n = n->prev_) {
    if (n->op() == OpKind::kOutput) return n;
  }
  return nullptr;
}

std::vector<Node*> Graph::placeholders() const {
  std::vector<Node*> out;
  for (Node* n : nodes()) {
    if (n->op() == OpKind::kPlaceholder) out.push_back(n);
  }
  return out;
}

std::string Graph::UniqueName(absl::string_view hint) const {
  std::string base = SanitizeName(hint);
  if (!by_name_.contains(base)) return base;
  // Strip an existing numeric suffix so "x_1" clashing gives "x_2".
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
  for (int64_t i = start;; ++i) {
    std::string candidate = absl::StrCat(stem, "_", i);
    if (!by_name_.contains(candidate)) return candidate;
  }
}

// Under AddressSanitizer an erased node's slot is poisoned past the free
// list's link until reused, so a use after Erase is still reported.
#if defined(__SANITIZE_ADDRESS__)
#define TRACECUT_POISON_SLOT(p)                                         \
  ASAN_POISON_MEMORY_REGION(reinterpret_cast<char*>(p) + sizeof(void*), \
                            sizeof(Node) - sizeof(void*))
#define TRACECUT_UNPOISON_SLOT(p) ASAN_UNPOISON_MEMORY_REGION(p, sizeof(Node))
#else
#define TRACECUT_POISON_SLOT(p)
#define TRACECUT_UNPOISON_SLOT(p)
#endif

Graph::~Graph() {
  // Slots erased nodes left: the slabs are freed whole.
  for (NodeSlot* slot = free_slots_; slot != nullptr;) {
    NodeSlot* next;
    std::memcpy(&next, slot, sizeof(NodeSlot*));
    TRACECUT_UNPOISON_SLOT(slot);
    slot = next;
  }
  for (Node* n = first_; n != nullptr;) {
    Node* next = n->next_;
    n->~Node();
    n = next;
  }
}

// Note [Node slabs]
// ~~~~~~~~~~~~~~~~~
// A graph allocates its nodes from slabs rather than one by one with new.
// Nodes added in order then lie in memory in order, so a walk over a graph
// far larger than the caches (the partitioner reads every node of a
// million-node graph twice) streams through memory instead of taking a
// cache miss per `next_`; and freeing a graph frees a few slabs, not one
// chunk per node. Slabs start small (most graphs in transforms and tests
// have a handful of nodes) and double up to kMaxSlabNodes. A node never
// moves: Node* stays valid until it is erased. An erased node's slot is
// reused by the next node added.
namespace {
constexpr size_t kFirstSlabNodes = 8;
constexpr size_t kMaxSlabNodes = 4096;
}  // namespace

template <typename... Args>
Node* Graph::NewNode(Args&&... args) {
  void* slot;
  if (free_slots_ != nullptr) {
    slot = free_slots_;
    std::memcpy(&free_slots_, slot, sizeof(NodeSlot*));
    TRACECUT_UNPOISON_SLOT(slot);
  } else {
    if (slab_used_ == slab_size_) {
      slab_size_ = slabs_.empty() ? kFirstSlabNodes
                                  : std::min(2 * slab_size_, kMaxSlabNodes);
      // Uninitialised storage: a node is constructed in each slot as needed.
      slabs_.emplace_back(new NodeSlot[slab_size_]);
      slab_used_ = 0;
    }
    slot = &slabs_.back()[slab_used_++];
  }
  return new (slot) Node(std::forward<Args>(args)...);
}

void Graph::DestroyNode(Node* node) {
  node->~Node();
  std::memcpy(static_cast<void*>(node), &free_slots_, sizeof(NodeSlot*));
  free_slots_ = reinterpret_cast<NodeSlot*>(node);
  TRACECUT_POISON_SLOT(node);
}

void Graph::Link(Node* node, Node* before) {
  Node* after = before == nullptr ? last_ : before->prev_;
  node->prev_ = after;
  node->next_ = before;
  (after == nullptr ? first_ : after->next_) = node;
  (before == nullptr ? last_ : before->prev_) = node;
  ++size_;
}

void Graph::Unlink(Node* node) {
  (node->prev_ == nullptr ? first_ : node->prev_->next_) = node->next_;
  (node->next_ == nullptr ? last_ : node->next_->prev_) = node->prev_;
  node->prev_ = node->next_ = nullptr;
  --size_;
}

void Graph::Renumber() {
  int64_t k = 0;
  for (Node* n = first_; n != nullptr; n = n->next_) {
    n->order_ = (k += kOrderGap);
  }
}

void Graph::AssignOrder(Node* node) {
  Node* p = node->prev();
  Node* n = node->next();
  int64_t lo = p ? p->order_ : 0;
  if (n == nullptr) {
    node->order_ = lo + kOrderGap;
    return;
  }
  if (n->order_ - lo < 2) {
    Renumber();
    return;
  }
  node->order_ = lo + (n->order_ - lo) / 2;
}

absl::StatusOr<Node*> Graph::AddNode(OpKind op, std::string target,
                                     std::vector<Argument> args, Kwargs kwargs,
                                     absl::string_view name) {
  if (insert_before_ != nullptr && insert_before_->graph_ != this) {
    return absl::FailedPreconditionError(
        "insertion point belongs to another graph");
  }
  absl::string_view hint = name;
  if (hint.empty()) {
    hint = target;
    if (op == OpKind::kCallFunction) {
      // "aten::add.Tensor" -> "add".
      size_t colons = hint.rfind("::");
      if (colons != absl::string_view::npos) hint = hint.substr(colons + 2);
      hint = hint.substr(0, hint.find('.'));
    }
  }
  // The name's index entry is claimed here (one lookup; UniqueName only
  // runs on a clash) and filled in once the node is valid.
  std::string unique = SanitizeName(hint);
  auto [entry, fresh] = by_name_.try_emplace(unique, nullptr);
  if (!fresh) {
    unique = UniqueName(hint);
    entry = by_name_.try_emplace(unique, nullptr).first;
  }
  Node* raw = NewNode(this, op, std::move(unique), std::move(target));
  Link(raw, insert_before_);
  AssignOrder(raw);
  // Nodes read a few others: no allocation for the list.
  absl::InlinedVector<Node*, 8> refs;
  CollectNodes(args, kwargs, refs);
  if (absl::Status s = raw->CheckRefs(refs); !s.ok()) {
    by_name_.erase(entry);
    Unlink(raw);
    DestroyNode(raw);
    return s;
  }
  entry->second = raw;
  raw->args_ = std::move(args);
  raw->kwargs_ = std::move(kwargs);
  // A new node: each distinct input gains it as a user once. The first
  // user list gets room for three: malloc's smallest chunk holds that much
  // anyway, and it saves regrowing for the common two or three users.
  for (Node* n : refs) {
    if (n->users_.capacity() == 0) n->users_.reserve(3);
    n->users_.push_back(raw);
  }
  return raw;
}

absl::StatusOr<Node*> Graph::Placeholder(absl::string_view name) {
  return AddNode(OpKind::kPlaceholder, std::string(name), {}, {}, name);
}

absl::StatusOr<Node*> Graph::GetAttr(std::string target,
                                     absl::string_view name) {
  return AddNode(OpKind::kGetAttr, std::move(target), {}, {}, name);
}

absl::StatusOr<Node*> Graph::CallFunction(std::string target,
                                          std::vector<Argument> args,
                                          Kwargs kwargs,
                                          absl::string_view name) {
  return AddNode(OpKind::kCallFunction, std::move(target), std::move(args),
                 std::move(kwargs), name);
}

absl::StatusOr<Node*> Graph::CallMethod(std::string method,
                                        std::vector<Argument> args,
                                        Kwargs kwargs, absl::string_view name) {
  return AddNode(OpKind::kCallMethod, std::move(method), std::move(args),
                 std::move(kwargs), name);
}

absl::StatusOr<Node*> Graph::CallModule(std::string path,
                                        std::vector<Argument> args,
                                        Kwargs kwargs, absl::string_view name) {
  return AddNode(OpKind::kCallModule, std::move(path), std::move(args),
                 std::move(kwargs), name);
}

absl::StatusOr<Node*> Graph::Output(Argument value) {
  if (output_node() != nullptr) {
    return absl::FailedPreconditionError("graph already has an output node");
  }
  return AddNode(OpKind::kOutput, "output", {std::move(value)}, {}, "output");
}

absl::Status Graph::ReplaceAllUsesWith(Node* from, Node* to) {
  if (from->graph_ != this || to->graph_ != this) {
    return absl::InvalidArgumentError(
        "ReplaceAllUsesWith: nodes belong to another graph");
  }
  if (from == to) return absl::OkStatus();
  std::vector<Node*> users;
  for (Node* user : from->users_) {
    if (user == to) continue;  // The replacement may itself read `from`.
    users.push_back(user);
    if (!to->IsBefore(user)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot replace uses of ", from->Describe(), " with ", to->Describe(),
          ": user ", user->Describe(), " comes before the replacement"));
    }
  }
  for (Node* user : users) {
    if (absl::Status s = user->ReplaceInput(from, to); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Graph::Erase(Node* node) {
  if (node->graph_ != this) {
    return absl::InvalidArgumentError(
        absl::StrCat("Erase: ", node->Describe(), " is not in this graph"));
  }
  if (!node->users_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot erase ", node->Describe(), ": it still has ",
                     node->users_.size(), " user(s), the first ",
                     node->users_.front()->Describe()));
  }
  if (insert_before_ == node) insert_before_ = node->next();
  std::vector<Node*> old = node->inputs();
  node->args_.clear();
  node->kwargs_.clear();
  node->UpdateUses(old);
  by_name_.erase(node->name_);
  Unlink(node);
  DestroyNode(node);
  return absl::OkStatus();
}

absl::Status Graph::MoveBefore(Node* node, Node* before) {
  if (node == before) return absl::OkStatus();
  for (Node* in : node->inputs()) {
    // Every input must stay before the new position.
    if (before != nullptr && !in->IsBefore(before)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot move ", node->Describe(), ": its input %",
                       in->name_, " would come after it"));
    }
  }
  for (Node* user : node->users_) {
    if (before != nullptr && (before == user || before->IsBefore(user))) {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot move ", node->Describe(), ": its user %",
                     user->name_, " would come before it"));
  }
  Unlink(node);
  Link(node, before);
  AssignOrder(node);
  return absl::OkStatus();
}

std::string Graph::Rename(Node* node, absl::string_view name) {
  if (node->name_ == name) return node->name_;
  by_name_.erase(node->name_);
  node->name_ = UniqueName(name);
  by_name_[node->name_] = node;
  return node->name_;
}

std::unique_ptr<Graph> Graph::Clone(
    absl::flat_hash_map<const Node*, Node*>* mapping) const {
  auto copy = std::make_unique<Graph>();
  absl::flat_hash_map<const Node*, Node*> local;
  absl::flat_hash_map<const Node*, Node*>& map = mapping ? *mapping : local;
  auto remap = [&](Node* n) { return map.at(n); };
  for (Node* n : nodes()) {
    Node* raw = copy->NewNode(copy.get(), n->op_, n->name_, n->target_);
    copy->Link(raw, nullptr);
    raw->order_ = n->order_;
    for (const Argument& a : n->args_) raw->args_.push_back(a.MapNodes(remap));
    for (const auto& [k, v] : n->kwargs_) {
      raw->kwargs_.emplace_back(k, v.MapNodes(remap));
    }
    raw->scope_ = n->scope_;
    raw->meta_ = n->meta_;
    raw->UpdateUses({});
    copy->by_name_[raw->name_] = raw;
    map[n] = raw;
  }
  copy->meta_ = meta_;
  return copy;
}

namespace {

// Argument equality across graphs: references compare by node name.
bool SameArgument(const Argument& a, const Argument& b) {
  if (a.kind() != b.kind()) return false;
  if (a.is_node()) return a.node()->name() == b.node()->name();
  if (!a.is_sequence()) return a == b;
  const auto& x = a.elements();
  const auto& y = b.elements();
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!SameArgument(x[i], y[i])) return false;
  }
  return true;
}

}  // namespace

bool StructurallyEqual(const Graph& a, const Graph& b) {
  if (a.size() != b.size() || !(a.meta() == b.meta())) return false;
  auto ia = a.nodes().begin();
  auto ib = b.nodes().begin();
  for (; ia != a.nodes().end(); ++ia, ++ib) {
    const Node* x = *ia;
    const Node* y = *ib;
    if (x->name() != y->name() || x->op() != y->op() ||
        x->target() != y->target() || x->scope() != y->scope() ||
        !(x->meta() == y->meta()) || x->args().size() != y->args().size() ||
        x->kwargs().size() != y->kwargs().size()) {
      return false;
    }
    for (size_t i = 0; i < x->args().size(); ++i) {
      if (!SameArgument(x->args()[i], y->args()[i])) return false;
    }
    for (size_t i = 0; i < x->kwargs().size(); ++i) {
      if (x->kwargs()[i].first != y->kwargs()[i].first ||
          !SameArgument(x->kwargs()[i].second, y->kwargs()[i].second)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace tracecut::ir
