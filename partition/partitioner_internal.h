#ifndef TRACECUT_PARTITION_PARTITIONER_INTERNAL_H_
#define TRACECUT_PARTITION_PARTITIONER_INTERNAL_H_

// What PartitionGraph's phases share: the graph as they see it (nodes by
// index, adjacency lists), the modules of a node, target instances, and the
// phases that live in their own files (finding target instances, building
// the subgraphs). Not API; partition/partitioner.h is.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "ir/module_pattern.h"
#include "partition/partitioner.h"
#include "partition/subgraph.h"

namespace tracecut::partition::partitioner_internal {

// Inputs, users and operand references of every node as indices in graph
// order, computed once: after this, nothing looks a node up by pointer.
struct Adjacency {
  std::vector<int> in_begin, in;
  std::vector<int> use_begin, use;
  // Every node reference in the operands, with repeats, in
  // Argument::ForEachNode order (args, then kwargs): CopyArgument consumes
  // them in the same order.
  std::vector<int> ref_begin, ref;

  absl::Span<const int> Inputs(int i) const {
    return absl::MakeConstSpan(in).subspan(in_begin[i],
                                           in_begin[i + 1] - in_begin[i]);
  }
  // Sorted by index. Callers only take minima, maxima and sets over users,
  // so the IR's use-list order does not matter.
  absl::Span<const int> Users(int i) const {
    return absl::MakeConstSpan(use).subspan(use_begin[i],
                                            use_begin[i + 1] - use_begin[i]);
  }
  const int* Refs(int i) const { return ref.data() + ref_begin[i]; }
};

// Parameter and leaf-module reads: each distinct get_attr / call_module
// target is one parameter id. IndexGraph numbers them and sizes them;
// CollectParamReads lists each slot's.
struct ParamReads {
  std::vector<std::optional<int64_t>> size;  // By id; nullopt if unknown.
  std::vector<int> node_param;               // Id read by node i, or -1.
  std::vector<std::vector<int>> by_slot;     // Ids each slot reads.
  int unknown_sizes = 0;

  int64_t KnownBytes(int id) const { return size[id].value_or(0); }
};

// A graph's nodes numbered in order, with their adjacency, op kinds and
// scope stacks. The phases read these arrays instead of the nodes: on a
// graph far larger than the caches every pass over the nodes themselves
// costs a few cache misses per node, so only IndexGraph and the copying
// into subgraphs touch them.
struct IndexedGraph {
  std::vector<const ir::Node*> nodes;
  std::vector<ir::OpKind> ops;
  // &nodes[i]->scope().stack(): equal pointers mean equal stacks (the
  // tracer and the parsers share a stack between the nodes of a module).
  std::vector<const std::vector<ir::ScopeEntry>*> stacks;
  // call_module node i's stack ends with the module it calls (as traced
  // graphs scope their leaves), so matching its stack covers the leaf.
  std::vector<char> leaf_in_stack;
  // For a compute node: how many leading entries its stack shares with the
  // stack of the compute node before it (CommonPrefix; the full depth for
  // the same stack). Target matching and the self-check both walk the
  // compute nodes' stacks this way; comparing the entries once saves the
  // second pass reading them (on a large graph, a cache miss per string).
  std::vector<int> shared_depth;
  Adjacency adj;
  ParamReads params;
  const ir::Node* output = nullptr;
  int out = 0;  // The output node's index.

  int size() const { return static_cast<int>(nodes.size()); }
  ir::OpKind op(int i) const { return ops[i]; }
};

// Numbers the nodes of `graph` (which has an output node), builds their
// adjacency and numbers and sizes the parameters (get_attr, call_module
// targets) they read: param_bytes(target) when set, else a get_attr's
// TensorBytes. Fails when an operand is not an earlier node of the graph.
absl::StatusOr<IndexedGraph> IndexGraph(const ir::Graph& graph,
                                        const ParamBytesFn& param_bytes);

// A module the scope stack of some node mentions.
struct ModuleRef {
  absl::string_view path;
  absl::string_view type;
};

// Calls fn(ModuleRef) for every module of `node`'s stack, outermost first,
// plus the called leaf of a call_module node when its scope does not end
// with it already.
template <typename Fn>
void ForEachModule(const ir::Node* node, Fn&& fn) {
  const auto& stack = node->scope().stack();
  for (const ir::ScopeEntry& e : stack) {
    if (!fn(ModuleRef{e.path, e.type})) return;
  }
  if (node->op() == ir::OpKind::kCallModule &&
      (stack.empty() || stack.back().path != node->target())) {
    fn(ModuleRef{node->target(), ""});
  }
}

// How many leading entries two scope stacks share.
inline int CommonPrefix(const std::vector<ir::ScopeEntry>& a,
                        const std::vector<ir::ScopeEntry>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t k = 0;
  while (k < n && a[k] == b[k]) ++k;
  return static_cast<int>(k);
}

// A target instance: a module that matched a target pattern.
struct Instance {
  std::string path;
  std::string type;
  int pattern = -1;  // Index of the first target pattern it matched.
};

// call_function, call_method or call_module.
inline bool IsCompute(ir::OpKind op) {
  return op == ir::OpKind::kCallFunction || op == ir::OpKind::kCallMethod ||
         op == ir::OpKind::kCallModule;
}
inline bool IsCompute(const ir::Node* n) { return IsCompute(n->op()); }

// Which target instance each compute node belongs to: the outermost (with
// Nesting::kInnermost the innermost) module of its stack that matches a
// target pattern and is not inside an ignored module.
struct TargetInstances {
  std::vector<int> inst;            // Instance of node i, or -1.
  std::vector<Instance> instances;  // In graph order of their first node.
};

// The target and ignore patterns of PartitionOptions, compiled.
struct ModulePatterns {
  std::vector<ir::ModulePattern> targets;
  std::vector<ir::ModulePattern> ignore;
};

// Fails on an empty pattern or an invalid regex, naming it.
absl::StatusOr<ModulePatterns> CompileModulePatterns(
    const PartitionOptions& options);

// Phase 1: matches each distinct module path once.
TargetInstances FindTargetInstances(const IndexedGraph& g,
                                    const ModulePatterns& patterns,
                                    Nesting nesting);

// NotFoundError for targets that match no module, listing the module types
// with several instances (the likely layers).
absl::Status NoTargetError(const ir::Graph& graph,
                           const PartitionOptions& options);

// Where each node runs and who reads it.
struct Homes {
  std::vector<int> home;         // Subgraph of node i.
  std::vector<int> last_reader;  // Last subgraph reading node i, or -1.
  std::vector<char> read_by_output;
  // Nodes each subgraph computes or reads (get_attr copies), in order;
  // placeholders and the output are nobody's members.
  std::vector<std::vector<int>> members;
};

// Builds partition->subgraphs (graphs, inputs, outputs, last uses,
// parameter reads and sizes) from the placement.
// partition->subgraphs must already have one entry per subgraph; fills
// everything but their module_paths and partition->home.
absl::Status BuildSubgraphs(const IndexedGraph& g, const ParamReads& params,
                            const Homes& homes, Partition* partition);

// Fills partition->home from the placement (node i runs in home[i]).
void FillHomeMap(const IndexedGraph& g, const std::vector<int>& home,
                 Partition* partition);

// Sets partition->model_inputs, model_outputs and output_graph: the graph
// that reads the model's outputs from the subgraphs' results.
absl::Status BuildOutputGraph(const IndexedGraph& g, const ir::Graph& graph,
                              Partition* partition);

// partition::CheckTargetPlacement with each node's home from `home` (node i
// runs in subgraph home[i]) instead of looking up partition->home by name.
// Reads only the subgraphs' index and module_paths, so it can run while
// BuildSubgraphs fills in the rest.
absl::Status CheckTargetPlacement(const IndexedGraph& g,
                                  const std::vector<int>& home,
                                  const std::vector<Subgraph>& subgraphs);

}  // namespace tracecut::partition::partitioner_internal

#endif  // TRACECUT_PARTITION_PARTITIONER_INTERNAL_H_
