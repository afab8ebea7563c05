#ifndef TRACECUT_PARTITION_SUBGRAPH_H_
#define TRACECUT_PARTITION_SUBGRAPH_H_

// The result of partitioning a graph: an ordered list of Subgraphs, each an
// executable ir::Graph, plus what a runner needs to feed them from an
// intermediates cache and to rebuild the model's output.
//
//   ASSIGN_OR_RETURN(Partition p, PartitionGraph(graph, options));
//   // values: model inputs by placeholder name.
//   for (const Subgraph& s : p.subgraphs) {
//     args = values[s.input_names...];          // s.graph's placeholders
//     outs = Run(*s.graph, args);               // Tuple, one per output_names
//     values[s.output_names[i]] = outs[i];
//     for (name : s.last_use) values.erase(name);
//   }
//   result = Run(*p.output_graph, values[...]);  // the model's output
//
// See Note [Subgraph values] in subgraph.cc for what crosses subgraph
// boundaries and what does not (parameters never do).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::partition {

// One piece of a partitioned graph.
struct Subgraph {
  // Position in execution order, 0-based.
  int index = 0;

  // Executable graph: one placeholder per entry of `input_names` (in that
  // order, each named after the node that produces the value or after the
  // model input), the nodes cloned from the original graph (same names,
  // targets, scopes and meta, in the original order), get_attr reads of the
  // parameters it uses, and an output node returning
  // Tuple(output_names...).
  std::unique_ptr<ir::Graph> graph;

  // Paths of the sequential-target module instances this subgraph runs, in
  // graph order ("model.layers.3"). Empty for the head subgraph.
  std::vector<std::string> module_paths;

  // Values read from earlier subgraphs or from the model's inputs, ordered
  // as in the original graph (model inputs first).
  std::vector<std::string> input_names;
  // Values this subgraph produces that a later subgraph or the model's
  // output reads, in graph order. Nothing else is returned.
  std::vector<std::string> output_names;
  // Inputs no later subgraph and not the model output read: a cache may
  // free them once this subgraph has run.
  std::vector<std::string> last_use;

  // get_attr targets read here (distinct, graph order).
  std::vector<std::string> param_targets;
  // call_module targets called here (distinct, graph order): their
  // parameters live inside the leaf modules.
  std::vector<std::string> leaf_modules;
  // Bytes of `param_targets` and `leaf_modules`, as far as they are known
  // (see PartitionOptions::param_bytes).
  int64_t param_bytes = 0;

  // Nodes of the original graph assigned to this subgraph (each node has
  // exactly one; the counts add up to the original graph's size).
  int64_t node_count = 0;

  // Human-readable notes (e.g. over the parameter budget).
  std::vector<std::string> warnings;
};

// An ordered partition of a graph.
struct Partition {
  std::vector<Subgraph> subgraphs;

  // The target patterns that selected at least one module instance.
  std::vector<std::string> targets_used;
  // The model's placeholder names, in order.
  std::vector<std::string> model_inputs;
  // Values the model's output reads (distinct, in order of reference);
  // none of them is ever in a `last_use`.
  std::vector<std::string> model_outputs;
  // Rebuilds the model's output once every subgraph has run: one
  // placeholder per entry of `model_outputs` (in that order; model inputs
  // keep their original target, scope and meta), get_attr reads if the
  // output returns parameters, and the original output node.
  std::unique_ptr<ir::Graph> output_graph;

  // Original node name -> index of the subgraph it is assigned to (its
  // home). Model inputs live in subgraph 0; the output node in the last.
  absl::flat_hash_map<std::string, int> home;

  std::vector<std::string> warnings;

  // The home subgraph of a node of the original graph, or -1.
  int SubgraphOf(absl::string_view node_name) const;
};

// Checks that the subgraphs can run in order by simulating an
// intermediates cache over names only: every input is a model input or an
// output of an earlier subgraph that no `last_use` freed yet, each graph's
// placeholders and output tuple match its names, every `last_use` entry is
// an input, no value is produced twice, the model outputs are available at
// the end and nothing else is left over (no leaks). The error names the
// subgraph and the value.
absl::Status VerifySchedule(const Partition& partition);

// VerifySchedule plus coverage against the graph that was partitioned:
// every original node except placeholders and the output is computed by
// exactly one subgraph (get_attr reads may repeat: they are parameter
// references, not values), with the same op and target, and no subgraph
// holds a node the original lacks.
absl::Status VerifyPartition(const ir::Graph& original,
                             const Partition& partition);

// Stitches the subgraphs back into one graph: placeholders of the model
// inputs, the subgraphs' nodes in execution order (each subgraph's
// placeholders replaced by the values they stand for, repeated get_attr
// reads merged), and the model's output node. Works on subgraphs changed
// after partitioning (e.g. by per-subgraph transforms) as long as their
// placeholders and output tuples still match their names.
absl::StatusOr<std::unique_ptr<ir::Graph>> Reassemble(
    const Partition& partition);

}  // namespace tracecut::partition

#endif  // TRACECUT_PARTITION_SUBGRAPH_H_
