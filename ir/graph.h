#ifndef TRACECUT_IR_GRAPH_H_
#define TRACECUT_IR_GRAPH_H_

// The tracecut graph IR: torch.fx semantics in C++ shape (see
// docs/ir_conventions.md, docs/ir_text_format.md and DESIGN.md).
//
// A Graph owns its Nodes and keeps them in topological order at all times.
// Everything else holds raw pointers. Mutation goes through Graph and Node
// methods that keep use lists and order right and return an error instead of
// breaking an invariant.
//
//   Graph g;
//   ASSIGN_OR_RETURN(Node* x, g.Placeholder("x"));
//   ASSIGN_OR_RETURN(Node* w, g.GetAttr("fc.weight"));
//   ASSIGN_OR_RETURN(Node* y, g.CallFunction("aten::linear",
//                                            {Argument::Ref(x),
//                                             Argument::Ref(w)}));
//   ASSIGN_OR_RETURN(Node* out, g.Output(Argument::Ref(y)));
//
// No LibTorch here: tensors only appear as references to module attributes
// (get_attr) and as shape/dtype metadata.

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tracecut::ir {

class Graph;
class Node;

namespace internal {
// Tests corrupt invariants through this peer (ir/internal/graph_test_peer.h)
// to show that the verifier catches each one.
class GraphTestPeer;
// The verifier reads the name index and order keys (ir/verifier.cc).
class VerifierAccess;
}  // namespace internal

// The six torch.fx op kinds.
enum class OpKind {
  kPlaceholder,
  kGetAttr,
  kCallFunction,
  kCallMethod,
  kCallModule,
  kOutput,
};

// "placeholder", "get_attr", "call_function", ... (torch.fx spelling).
absl::string_view OpKindName(OpKind op);
std::optional<OpKind> ParseOpKind(absl::string_view name);

// An operand: a reference to a Node, a constant, or a list/tuple of
// Arguments. Values are immutable once built.
class Argument {
 public:
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kDouble,
    kString,
    kDType,   // a scalar type by name: "float32", "bfloat16", "int64", ...
    kDevice,  // "cpu", "cuda:0", ...
    kNode,
    kList,
    kTuple,
  };

  Argument() = default;  // None.
  static Argument None() { return Argument(); }
  static Argument Bool(bool v);
  static Argument Int(int64_t v);
  static Argument Double(double v);
  static Argument String(std::string v);
  static Argument DType(std::string name);
  static Argument Device(std::string name);
  static Argument Ref(Node* node);
  static Argument List(std::vector<Argument> elements);
  static Argument Tuple(std::vector<Argument> elements);

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_node() const { return kind_ == Kind::kNode; }
  bool is_sequence() const {
    return kind_ == Kind::kList || kind_ == Kind::kTuple;
  }

  // Accessors; each requires the matching kind.
  bool as_bool() const { return std::get<bool>(value_); }
  int64_t as_int() const { return std::get<int64_t>(value_); }
  double as_double() const { return std::get<double>(value_); }
  // String, DType and Device payloads.
  const std::string& as_string() const { return std::get<std::string>(value_); }
  Node* node() const { return std::get<Node*>(value_); }
  const std::vector<Argument>& elements() const {
    return std::get<std::vector<Argument>>(value_);
  }

  // Calls `fn` on every node referenced, depth first, left to right.
  void ForEachNode(const std::function<void(Node*)>& fn) const;
  // A copy with every node reference replaced by `fn(node)`.
  Argument MapNodes(const std::function<Node*(Node*)>& fn) const;
  // True when no node is referenced anywhere inside.
  bool IsConstant() const;

  // Structural equality; node references compare by pointer. Doubles compare
  // bitwise, so NaN == NaN and 0.0 != -0.0 (what round trips need).
  friend bool operator==(const Argument& a, const Argument& b);
  friend bool operator!=(const Argument& a, const Argument& b) {
    return !(a == b);
  }

 private:
  Kind kind_ = Kind::kNone;
  std::variant<std::monostate, bool, int64_t, double, std::string, Node*,
               std::vector<Argument>>
      value_;
};

using Kwargs = std::vector<std::pair<std::string, Argument>>;

// One entry of a module stack: the module's qualified path in the root
// module ("model.layers.3.self_attn", "" for the root) and its demangled
// qualified type ("transformers.models.llama.modeling_llama.LlamaAttention").
struct ScopeEntry {
  std::string path;
  std::string type;

  friend bool operator==(const ScopeEntry& a, const ScopeEntry& b) {
    return a.path == b.path && a.type == b.type;
  }
};

// The module stack from the root to the module a node belongs to, outermost
// first (torch.fx's nn_module_stack). path()/type() give the innermost entry.
//
// Scopes are immutable and shared: copying one (every node of a layer has
// the same stack, and partitioning copies every node) costs a reference
// count, not 2 * depth string copies.
class Scope {
 public:
  Scope() = default;
  explicit Scope(std::vector<ScopeEntry> stack)
      : stack_(stack.empty() ? nullptr
                             : std::make_shared<const std::vector<ScopeEntry>>(
                                   std::move(stack))) {}

  const std::vector<ScopeEntry>& stack() const {
    return stack_ != nullptr ? *stack_ : EmptyStack();
  }
  bool empty() const { return stack_ == nullptr; }
  size_t depth() const { return stack_ != nullptr ? stack_->size() : 0; }

  // Innermost module path and qualified type; "" when the stack is empty.
  const std::string& path() const;
  const std::string& type() const;
  // Innermost type without its namespace: "LlamaAttention".
  std::string short_type() const;

  // A copy with `entry` pushed innermost.
  Scope Push(ScopeEntry entry) const;
  // True if `path` is this scope's module or one of its ancestors.
  bool Contains(absl::string_view path) const;

  // Removes TorchScript's "__torch__." prefix and "___torch_mangle_N."
  // segments: "__torch__.a.___torch_mangle_3.Foo" -> "a.Foo".
  static std::string DemangleType(absl::string_view qualified);
  // The last dotted segment of a (demangled) type.
  static std::string ShortType(absl::string_view qualified);

  friend bool operator==(const Scope& a, const Scope& b) {
    return a.stack_ == b.stack_ || a.stack() == b.stack();
  }
  friend bool operator!=(const Scope& a, const Scope& b) { return !(a == b); }

 private:
  static const std::vector<ScopeEntry>& EmptyStack();

  // Null when empty; never mutated once built.
  std::shared_ptr<const std::vector<ScopeEntry>> stack_;
};

// Shape/dtype/device of one tensor value. A dimension of -1 is unknown.
struct TensorMeta {
  std::vector<int64_t> shape;
  std::string dtype;   // "float32", ...; "" when unknown.
  std::string device;  // "cpu", ...; "" when unknown.

  friend bool operator==(const TensorMeta& a, const TensorMeta& b) {
    return a.shape == b.shape && a.dtype == b.dtype && a.device == b.device;
  }
};

// Where a node came from in the TorchScript source.
struct SourceLocation {
  std::string file;
  int64_t line = 0;
  std::string text;  // The source line, trimmed; may be empty.

  friend bool operator==(const SourceLocation& a, const SourceLocation& b) {
    return a.file == b.file && a.line == b.line && a.text == b.text;
  }
};

// A transformation that created or rewrote a node, with the data it needs to
// undo the change (e.g. names of saved original parameters).
struct TransformMark {
  std::string pass;
  std::map<std::string, std::string> data;

  friend bool operator==(const TransformMark& a, const TransformMark& b) {
    return a.pass == b.pass && a.data == b.data;
  }
};

// Typed, serializable per-node metadata. Shared copy-on-write between a
// node and its copies (see Node::meta()).
struct NodeMeta {
  // One entry per tensor the node produces (several for tuple outputs);
  // empty when unknown or not a tensor.
  std::vector<TensorMeta> outputs;
  std::optional<SourceLocation> source;
  std::vector<TransformMark> transforms;
  // Anything else; values must be constants (no node references).
  std::map<std::string, Argument> extra;

  friend bool operator==(const NodeMeta& a, const NodeMeta& b) {
    return a.outputs == b.outputs && a.source == b.source &&
           a.transforms == b.transforms && a.extra == b.extra;
  }
};

// Graph-level metadata.
struct GraphMeta {
  // Assumptions made while tracing (e.g. a branch specialised on a shape),
  // human-readable, in the order they were made.
  std::vector<std::string> assumptions;
  std::map<std::string, Argument> extra;  // Constants only.

  friend bool operator==(const GraphMeta& a, const GraphMeta& b) {
    return a.assumptions == b.assumptions && a.extra == b.extra;
  }
};

class Node {
 public:
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }
  OpKind op() const { return op_; }
  // call_function: the operator with overload ("aten::add.Tensor");
  // call_module / get_attr: the dotted path; call_method: the method name;
  // placeholder: the input name; output: "output".
  const std::string& target() const { return target_; }
  const std::vector<Argument>& args() const { return args_; }
  const Kwargs& kwargs() const { return kwargs_; }
  // The kwarg named `key`, or nullptr.
  const Argument* kwarg(absl::string_view key) const;

  const Scope& scope() const { return scope_; }
  void set_scope(Scope scope) { scope_ = std::move(scope); }
  // A node's meta is shared copy-on-write with the nodes it was copied to
  // by ShareMetaOf or Graph::Clone (partitioning copies every node of a
  // graph; its meta is most of a node). The mutable accessor first makes
  // this node's meta its own, so writes never reach another node; a
  // reference it returned is only good until the meta is shared again.
  NodeMeta& meta();
  const NodeMeta& meta() const {
    return meta_ != nullptr ? *meta_ : EmptyMeta();
  }
  // Gives this node the same meta as `other` without copying it.
  void ShareMetaOf(const Node& other) { meta_ = other.meta_; }

  Graph* graph() const { return graph_; }
  // Distinct nodes this node reads, in order of first reference.
  std::vector<Node*> inputs() const;
  // Distinct nodes that read this node, in the order they started to.
  const std::vector<Node*>& users() const { return users_; }

  // Neighbours in the graph's order; nullptr at the ends.
  Node* prev() const;
  Node* next() const;
  // True if this node comes before `other` in the same graph.
  bool IsBefore(const Node* other) const { return order_ < other->order_; }

  // Replace operands. Every referenced node must belong to the same graph
  // and come before this node; otherwise nothing changes and an error is
  // returned.
  absl::Status SetArgs(std::vector<Argument> args);
  absl::Status SetKwargs(Kwargs kwargs);
  absl::Status SetArg(size_t index, Argument arg);
  absl::Status SetKwarg(absl::string_view key, Argument arg);
  // Replaces every reference to `from` in this node's operands with `to`.
  absl::Status ReplaceInput(Node* from, Node* to);
  void set_target(std::string target) { target_ = std::move(target); }

  // "%name (call_function aten::linear in model.layers.0.mlp)": how errors
  // name a node. A target or module path holding a space, quote, backslash
  // or control character is shown quoted and escaped: "in \"a b.c\"".
  std::string Describe() const;

 private:
  friend class Graph;
  friend class internal::GraphTestPeer;
  friend class internal::VerifierAccess;
  Node(Graph* graph, OpKind op, std::string name, std::string target);

  absl::Status CheckOperands(const std::vector<Argument>& args,
                             const Kwargs& kwargs) const;
  // CheckOperands on the distinct nodes already collected from them.
  absl::Status CheckRefs(absl::Span<Node* const> refs) const;
  void UpdateUses(const std::vector<Node*>& old_inputs);

  Graph* graph_;
  OpKind op_;
  std::string name_;
  std::string target_;
  std::vector<Argument> args_;
  Kwargs kwargs_;
  Scope scope_;
  static const NodeMeta& EmptyMeta();

  // Null while empty; see meta().
  std::shared_ptr<NodeMeta> meta_;
  std::vector<Node*> users_;
  // Neighbours in the graph's intrusive list (no list node of its own to
  // allocate per node).
  Node* prev_ = nullptr;
  Node* next_ = nullptr;
  int64_t order_ = 0;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  // Iteration in topological order.
  class NodeIterator {
   public:
    explicit NodeIterator(Node* node) : node_(node) {}
    Node* operator*() const { return node_; }
    NodeIterator& operator++() {
      node_ = node_->next_;
      return *this;
    }
    bool operator!=(const NodeIterator& o) const { return node_ != o.node_; }
    bool operator==(const NodeIterator& o) const { return node_ == o.node_; }

   private:
    Node* node_;  // nullptr: the end.
  };
  struct NodeRange {
    NodeIterator b, e;
    NodeIterator begin() const { return b; }
    NodeIterator end() const { return e; }
  };
  NodeRange nodes() const {
    return {NodeIterator(first_), NodeIterator(nullptr)};
  }
  size_t size() const { return size_; }
  Node* first() const { return first_; }
  Node* last() const { return last_; }

  // The node called `name`, or nullptr.
  Node* FindNode(absl::string_view name) const;
  // The output node, or nullptr if the graph has none yet.
  Node* output_node() const;
  std::vector<Node*> placeholders() const;

  // Creates a node at the insertion point (default: the end of the graph).
  // `name` is a hint: it is sanitised to an identifier and made unique.
  absl::StatusOr<Node*> AddNode(OpKind op, std::string target,
                                std::vector<Argument> args = {},
                                Kwargs kwargs = {},
                                absl::string_view name = "");
  absl::StatusOr<Node*> Placeholder(absl::string_view name);
  absl::StatusOr<Node*> GetAttr(std::string target,
                                absl::string_view name = "");
  absl::StatusOr<Node*> CallFunction(std::string target,
                                     std::vector<Argument> args,
                                     Kwargs kwargs = {},
                                     absl::string_view name = "");
  absl::StatusOr<Node*> CallMethod(std::string method,
                                   std::vector<Argument> args,
                                   Kwargs kwargs = {},
                                   absl::string_view name = "");
  absl::StatusOr<Node*> CallModule(std::string path, std::vector<Argument> args,
                                   Kwargs kwargs = {},
                                   absl::string_view name = "");
  absl::StatusOr<Node*> Output(Argument value);

  // New nodes go right before `node`; nullptr means the end of the graph.
  void SetInsertBefore(Node* node) { insert_before_ = node; }
  Node* insert_before() const { return insert_before_; }
  // RAII: sets the insertion point and restores the previous one.
  class InsertPointGuard {
   public:
    InsertPointGuard(Graph& g, Node* before)
        : graph_(g), saved_(g.insert_before_) {
      g.insert_before_ = before;
    }
    ~InsertPointGuard() { graph_.insert_before_ = saved_; }

   private:
    Graph& graph_;
    Node* saved_;
  };

  // Makes every user of `from` except `to` itself read `to` instead (so a
  // new node computed from `from` can take its place). Fails, changing
  // nothing, when `to` does not come before all of those users.
  absl::Status ReplaceAllUsesWith(Node* from, Node* to);
  // Removes a node that nobody reads.
  absl::Status Erase(Node* node);
  // Moves `node` right before `before` (nullptr: the end). Fails when the
  // move would put it before one of its inputs or after one of its users.
  absl::Status MoveBefore(Node* node, Node* before);
  // Renames a node (the new name is made unique); returns the final name.
  std::string Rename(Node* node, absl::string_view name);

  // A unique identifier-safe name derived from `hint` (FX style:
  // SanitizeName in ir/names.h, then clashes get a "_N" suffix).
  std::string UniqueName(absl::string_view hint) const;

  GraphMeta& meta() { return meta_; }
  const GraphMeta& meta() const { return meta_; }

  // Deep copy (names, order, scopes and meta included). When `mapping` is
  // given it receives original node -> copy.
  std::unique_ptr<Graph> Clone(
      absl::flat_hash_map<const Node*, Node*>* mapping = nullptr) const;

 private:
  friend class Node;
  friend class internal::GraphTestPeer;
  friend class internal::VerifierAccess;
  void Renumber();
  void AssignOrder(Node* node);
  // Puts `node` (in no list) right before `before` (nullptr: the end);
  // takes it out of the list, keeping it.
  void Link(Node* node, Node* before);
  void Unlink(Node* node);

  // Storage for nodes (Note [Node slabs] in graph.cc): constructs a node in
  // a slot of the newest slab, or in one a destroyed node left free.
  template <typename... Args>
  Node* NewNode(Args&&... args);
  void DestroyNode(Node* node);

  // Slabs of node-sized slots, each twice the size of the one before up to
  // kMaxSlabNodes; `slab_used_` slots of the last are taken. Freed slots are
  // chained through their first bytes.
  struct alignas(Node) NodeSlot {
    unsigned char bytes[sizeof(Node)];
  };
  std::vector<std::unique_ptr<NodeSlot[]>> slabs_;
  size_t slab_size_ = 0;
  size_t slab_used_ = 0;
  NodeSlot* free_slots_ = nullptr;

  // The nodes, owned, in an intrusive doubly linked list.
  Node* first_ = nullptr;
  Node* last_ = nullptr;
  size_t size_ = 0;
  absl::flat_hash_map<std::string, Node*> by_name_;
  Node* insert_before_ = nullptr;
  GraphMeta meta_;
};

// Structural equality of two graphs: same nodes in the same order with the
// same names, ops, targets, operands (references compared by name), scopes
// and meta, and the same graph meta.
bool StructurallyEqual(const Graph& a, const Graph& b);

}  // namespace tracecut::ir

#endif  // TRACECUT_IR_GRAPH_H_
