#ifndef TRACECUT_PARTITION_PLAN_H_
#define TRACECUT_PARTITION_PLAN_H_

// Partition plans: the partitioner's decisions as a PartitionPlan proto
// (partition/plan.proto), printed as an aligned text table, deterministic
// JSON, or a Graphviz drawing of the graph with one coloured cluster per
// subgraph.
//
//   ASSIGN_OR_RETURN(Partition p, PartitionGraph(graph, options));
//   PartitionPlan plan = BuildPlan(p, options);
//   std::cout << PlanToText(plan);     // tracecut partition
//   std::cout << PlanToJson(plan);     // tracecut partition --json
//   std::cout << PartitionToDot(graph, p);  // --format=dot

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "partition/plan.pb.h"
#include "partition/subgraph.h"

namespace tracecut::partition {

// The plan of `partition`, which PartitionGraph made with `options`.
PartitionPlan BuildPlan(const Partition& partition,
                        const PartitionOptions& options);

// A summary line, one table row per subgraph (index, nodes, parameter
// bytes, modules, inputs, outputs; long lists elided), then the warnings:
//
//   partition: 3 subgraphs, 61 nodes, targets: LlamaDecoderLayer
//   #  nodes  params    modules         inputs                  outputs
//   0     12  128 B     (head)          input_ids, ...          embed, ...
//   1     24  64.0 KiB  model.layers.0  embed, causal_mask, ... l0_out
std::string PlanToText(const PartitionPlan& plan);

// JSON from protobuf's JSON printer with every field present (empty lists
// and zeros included), fields in proto order under their proto names, 64-bit
// integers as numbers (not proto3 JSON's strings), two spaces of indentation
// and a final newline. The same plan always gives the same bytes.
std::string PlanToJson(const PartitionPlan& plan);

// Reads PlanToJson's output (or any proto3 JSON form of a PartitionPlan).
absl::StatusOr<PartitionPlan> PlanFromJson(absl::string_view json);

// Graphviz DOT of the partitioned graph: one cluster per subgraph, labelled
// "#i head" or "#i <first module path>", coloured by index; each node drawn
// in its home subgraph (ir/dot.h).
std::string PartitionToDot(const ir::Graph& graph, const Partition& partition);

}  // namespace tracecut::partition

#endif  // TRACECUT_PARTITION_PLAN_H_
