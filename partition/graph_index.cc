// Numbering a graph's nodes and building their adjacency lists, the first
// step of PartitionGraph (see partitioner_internal.h).

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "partition/partitioner_internal.h"
#include "util/status_macros.h"

namespace tracecut::partition::partitioner_internal {
namespace {

// The position of `node` in `nodes` (a graph's nodes in order), searching
// [0, before) by the graph's order: operands are mostly recent nodes, so it
// gallops back from `before` and then bisects, cheaper than hashing every
// reference. Returns `before` when the node is not there.
int IndexOf(const std::vector<const ir::Node*>& nodes, const ir::Node* node,
            int before) {
  int hi = before;
  int lo = before - 1;
  int step = 1;
  while (lo > 0 && node->IsBefore(nodes[lo])) {
    hi = lo;
    step *= 2;
    lo = std::max(0, hi - step);
  }
  lo = std::max(lo, 0);
  // The first position in [lo, hi) not before `node`.
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (nodes[mid]->IsBefore(node)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < before && nodes[lo] == node ? lo : before;
}

// IndexOf behind a small direct-mapped cache of recent answers. The far
// operands (a layer's normalised input read by each of its experts, the
// mask and rotary tables read by every layer) are few and read again and
// again; a hit costs no access to any node, where galloping back to them
// reads a dozen nodes long out of cache.
class NodeIndexer {
 public:
  explicit NodeIndexer(const std::vector<const ir::Node*>& nodes)
      : nodes_(nodes), cache_(kSize, -1) {}

  int Find(const ir::Node* node, int before) {
    int& slot = cache_[(reinterpret_cast<uintptr_t>(node) >> 4) & (kSize - 1)];
    if (slot >= 0 && slot < before && nodes_[slot] == node) return slot;
    int j = IndexOf(nodes_, node, before);
    if (j < before && before - j > kNear) slot = j;
    return j;
  }

 private:
  static constexpr int kSize = 1024;
  // Nearer operands are found by a step or two of galloping anyway.
  static constexpr int kNear = 8;
  const std::vector<const ir::Node*>& nodes_;
  std::vector<int> cache_;
};

// Appends the positions of the nodes `a` references (operands of node
// `user`, which they must precede).
absl::Status CollectRefs(const ir::Argument& a,
                         const std::vector<const ir::Node*>& nodes,
                         NodeIndexer& indexer, int user,
                         std::vector<int>& out) {
  if (a.is_node()) {
    int j = indexer.Find(a.node(), user);
    if (j == user) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: operand %", a.node()->name(), " of ",
          nodes[user]->Describe(), " is not an earlier node of the graph"));
    }
    out.push_back(j);
  } else if (a.is_sequence()) {
    for (const ir::Argument& e : a.elements()) {
      RETURN_IF_ERROR(CollectRefs(e, nodes, indexer, user, out));
    }
  }
  return absl::OkStatus();
}

// The nodes of a graph far larger than the caches are a few misses each:
// fetches node i + kAhead, and what node i + kAhead / 2 points to.
void Prefetch(const std::vector<const ir::Node*>& nodes, int i) {
  constexpr int kAhead = 8;
  const int n = static_cast<int>(nodes.size());
  if (i + kAhead < n) {
    const char* p = reinterpret_cast<const char*>(nodes[i + kAhead]);
    for (size_t off = 0; off < sizeof(ir::Node); off += 64) {
      __builtin_prefetch(p + off);
    }
  }
  if (i + kAhead / 2 < n) {
    const ir::Node* node = nodes[i + kAhead / 2];
    // An operand list spans a line or a few (48-byte Arguments).
    const char* args = reinterpret_cast<const char*>(node->args().data());
    const size_t args_bytes = node->args().size() * sizeof(ir::Argument);
    for (size_t off = 0; off < args_bytes; off += 64) {
      __builtin_prefetch(args + off);
    }
    __builtin_prefetch(&node->scope().stack());
    __builtin_prefetch(node->target().data());
  }
}

}  // namespace

// One walk over the graph: every node is read once here (op, scope stack,
// operands) and not again until it is copied into its subgraph.
absl::StatusOr<IndexedGraph> IndexGraph(const ir::Graph& graph,
                                        const ParamBytesFn& param_bytes) {
  IndexedGraph g;
  g.output = graph.output_node();
  const int n = static_cast<int>(graph.size());
  std::vector<const ir::Node*>& nodes = g.nodes;
  nodes.reserve(n);
  g.ops.reserve(n);
  g.stacks.reserve(n);
  Adjacency& a = g.adj;
  a.in_begin.reserve(n + 1);
  a.ref_begin.reserve(n + 1);
  a.ref.reserve(2 * n);
  a.in.reserve(2 * n);
  g.leaf_in_stack.assign(n, 0);
  g.shared_depth.assign(n, 0);
  static const auto* const kNoStack = new std::vector<ir::ScopeEntry>();
  const std::vector<ir::ScopeEntry>* prev_stack = kNoStack;
  ParamReads& params = g.params;
  params.node_param.assign(n, -1);
  absl::flat_hash_map<absl::string_view, int> param_id;
  std::vector<int> mark(n, -1);
  std::vector<int> use_count(n, 0);
  for (const ir::Node* node : graph.nodes()) nodes.push_back(node);
  NodeIndexer indexer(nodes);
  for (int i = 0; i < n; ++i) {
    Prefetch(nodes, i);
    const ir::Node* node = nodes[i];
    const ir::OpKind op = node->op();
    const std::vector<ir::ScopeEntry>& stack = node->scope().stack();
    g.ops.push_back(op);
    g.stacks.push_back(&stack);
    if (node == g.output) g.out = i;
    if (IsCompute(op)) {
      g.shared_depth[i] = &stack == prev_stack
                              ? static_cast<int>(stack.size())
                              : CommonPrefix(*prev_stack, stack);
      prev_stack = &stack;
    }
    if (op == ir::OpKind::kGetAttr || op == ir::OpKind::kCallModule) {
      auto [it, inserted] = param_id.try_emplace(
          node->target(), static_cast<int>(params.size.size()));
      if (inserted) {
        std::optional<int64_t> bytes;
        if (param_bytes) {
          bytes = param_bytes(node->target());
        } else if (op == ir::OpKind::kGetAttr &&
                   node->meta().outputs.size() == 1) {
          bytes = TensorBytes(node->meta().outputs[0]);
        }
        params.size.push_back(bytes);
        params.unknown_sizes += !bytes.has_value();
      }
      params.node_param[i] = it->second;
      g.leaf_in_stack[i] = op == ir::OpKind::kCallModule && !stack.empty() &&
                           stack.back().path == node->target();
    }
    a.ref_begin.push_back(static_cast<int>(a.ref.size()));
    a.in_begin.push_back(static_cast<int>(a.in.size()));
    for (const ir::Argument& arg : node->args()) {
      RETURN_IF_ERROR(CollectRefs(arg, nodes, indexer, i, a.ref));
    }
    for (const auto& [key, arg] : node->kwargs()) {
      RETURN_IF_ERROR(CollectRefs(arg, nodes, indexer, i, a.ref));
    }
    for (size_t k = a.ref_begin[i]; k < a.ref.size(); ++k) {
      int j = a.ref[k];
      if (mark[j] != i) {
        mark[j] = i;
        a.in.push_back(j);
        ++use_count[j];
      }
    }
  }
  a.ref_begin.push_back(static_cast<int>(a.ref.size()));
  a.in_begin.push_back(static_cast<int>(a.in.size()));
  // Users by counting sort over the inputs.
  a.use_begin.assign(n + 1, 0);
  for (int j = 0; j < n; ++j) {
    a.use_begin[j + 1] = a.use_begin[j] + use_count[j];
  }
  a.use.resize(a.use_begin[n]);
  std::vector<int> fill(a.use_begin.begin(), a.use_begin.end() - 1);
  for (int k = 0; k < n; ++k) {
    for (int j : a.Inputs(k)) a.use[fill[j]++] = k;
  }
  return g;
}

}  // namespace tracecut::partition::partitioner_internal
