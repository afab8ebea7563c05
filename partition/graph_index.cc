// Numbering a graph's nodes and building their adjacency lists, the first
// step of PartitionGraph (see partitioner_internal.h).

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
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

// Appends the positions of the nodes `a` references (operands of node
// `user`, which they must precede).
absl::Status CollectRefs(const ir::Argument& a,
                         const std::vector<const ir::Node*>& nodes, int user,
                         std::vector<int>& out) {
  if (a.is_node()) {
    int j = IndexOf(nodes, a.node(), user);
    if (j == user) {
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: operand %", a.node()->name(), " of ",
          nodes[user]->Describe(), " is not an earlier node of the graph"));
    }
    out.push_back(j);
  } else if (a.is_sequence()) {
    for (const ir::Argument& e : a.elements()) {
      RETURN_IF_ERROR(CollectRefs(e, nodes, user, out));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Adjacency> BuildAdjacency(
    const std::vector<const ir::Node*>& nodes) {
  const int n = static_cast<int>(nodes.size());
  Adjacency a;
  a.in_begin.reserve(n + 1);
  a.ref_begin.reserve(n + 1);
  a.ref.reserve(2 * n);
  a.in.reserve(2 * n);
  std::vector<int> mark(n, -1);
  std::vector<int> use_count(n, 0);
  for (int i = 0; i < n; ++i) {
    a.ref_begin.push_back(static_cast<int>(a.ref.size()));
    a.in_begin.push_back(static_cast<int>(a.in.size()));
    for (const ir::Argument& arg : nodes[i]->args()) {
      RETURN_IF_ERROR(CollectRefs(arg, nodes, i, a.ref));
    }
    for (const auto& [key, arg] : nodes[i]->kwargs()) {
      RETURN_IF_ERROR(CollectRefs(arg, nodes, i, a.ref));
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
  for (int j = 0; j < n; ++j)
    a.use_begin[j + 1] = a.use_begin[j] + use_count[j];
  a.use.resize(a.use_begin[n]);
  std::vector<int> fill(a.use_begin.begin(), a.use_begin.end() - 1);
  for (int i = 0; i < n; ++i) {
    for (int j : a.Inputs(i)) a.use[fill[j]++] = i;
  }
  return a;
}

}  // namespace

absl::StatusOr<IndexedGraph> IndexGraph(const ir::Graph& graph) {
  IndexedGraph g;
  g.output = graph.output_node();
  g.nodes.reserve(graph.size());
  for (const ir::Node* n : graph.nodes()) g.nodes.push_back(n);
  ASSIGN_OR_RETURN(g.adj, BuildAdjacency(g.nodes));
  g.out = IndexOf(g.nodes, g.output, g.size());
  return g;
}

}  // namespace tracecut::partition::partitioner_internal
