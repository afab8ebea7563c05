#ifndef TRACECUT_PARTITION_CHECK_H_
#define TRACECUT_PARTITION_CHECK_H_

// Numeric check of a partition: run the whole graph, then the subgraphs in
// order through an intermediates map (freed by last_use, as a sequential
// pipeline would), and compare. The LibTorch-dependent part of partition/;
// the partitioner itself stays IR-only.
//
//   ASSIGN_OR_RETURN(Partition p, PartitionGraph(gm.graph(), options));
//   ASSIGN_OR_RETURN(CheckResult r, CheckPartition(gm, p, {x}));
//   if (r.max_abs_error > 1e-5) ... r.first_divergent names the subgraph.

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "partition/subgraph.h"
#include "runtime/graph_module.h"

namespace tracecut::partition {

struct CheckResult {
  // Largest |whole - partitioned| over every tensor element (and scalar) of
  // the model's output. 0 when identical; infinity where exactly one side
  // is NaN.
  double max_abs_error = 0.0;
  // Per subgraph: largest error of its outputs against the same values in
  // the whole-graph run. Shows which subgraph diverged first.
  std::vector<double> subgraph_errors;
  // First subgraph whose error is above 0, or -1.
  int first_divergent = -1;
  // Most values held in the intermediates map at once (after a subgraph's
  // outputs arrive, before its last_use is freed).
  int64_t peak_cached_values = 0;
};

// What RunPartition did.
struct PartitionRunStats {
  int64_t peak_cached_values = 0;
};

// Runs the subgraphs of `partition` in order, then its output graph, with
// `inputs` one per model input (Partition::model_inputs order); get_attr
// and call_module targets are paths in `root`. Returns the model's output.
// Errors name the subgraph and the node that failed.
absl::StatusOr<c10::IValue> RunPartition(const Partition& partition,
                                         const torch::jit::Module& root,
                                         const std::vector<c10::IValue>& inputs,
                                         PartitionRunStats* stats = nullptr);

// Runs `graph` whole and `partition` (made from it) on the same inputs and
// compares them.
absl::StatusOr<CheckResult> CheckPartition(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Partition& partition, const std::vector<c10::IValue>& inputs);
absl::StatusOr<CheckResult> CheckPartition(
    const runtime::GraphModule& gm, const Partition& partition,
    const std::vector<c10::IValue>& inputs);

// Largest absolute difference between two values of the same structure:
// tensors (same shape, compared in float64), tuples and lists elementwise,
// ints, doubles and bools numerically; None, strings and devices must be
// equal. Errors say where the structures differ ("[1]: shape [2, 3] vs
// [2, 4]").
absl::StatusOr<double> MaxAbsError(const c10::IValue& a, const c10::IValue& b);

}  // namespace tracecut::partition

#endif  // TRACECUT_PARTITION_CHECK_H_
