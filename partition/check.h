#ifndef TRACECUT_PARTITION_CHECK_H_
#define TRACECUT_PARTITION_CHECK_H_

// Numeric check of a partition: run the whole graph, then the subgraphs in
// order through an intermediates map (freed by last_use, as a sequential
// pipeline would), and compare. The LibTorch-dependent part of partition/;
// the partitioner itself stays IR-only.
//
//   ASSIGN_OR_RETURN(Partition p, PartitionGraph(gm.graph(), options));
//   ASSIGN_OR_RETURN(CheckResult r, CheckPartition(gm, p, {x}));
//   if (!r.passed) ... r.output.FailureSummary("output"), and
//   r.first_divergent / r.first_failing name the subgraph.
//
// Values are compared with runtime/compare.h (allclose-style, default
// rtol 1e-4, atol 1e-5): the partitioned run is the actual value, the
// whole-graph run the reference.

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/graph.h"
#include "partition/subgraph.h"
#include "runtime/compare.h"
#include "runtime/graph_module.h"

namespace tracecut::partition {

struct CheckResult {
  // The model's output: partitioned against whole.
  runtime::CompareResult output;
  // Per subgraph, in order: its outputs (paths "%name", the values' names)
  // against the same values in the whole-graph run.
  std::vector<runtime::CompareResult> subgraphs;
  // First subgraph whose outputs differ at all (max_abs_error > 0), or -1.
  // Shows where a divergence starts even while it is within tolerance.
  int first_divergent = -1;
  // First subgraph whose outputs fail the tolerances, or -1.
  int first_failing = -1;
  // The model's output and every subgraph's outputs within tolerance: a
  // subgraph that does not reproduce its values fails the check even where
  // the model's output happens to hide it.
  bool passed = true;
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
// compares them with `options`. Values whose structures differ are errors
// naming the subgraph and output ("subgraph 2 output %h: [0]: shape ...").
absl::StatusOr<CheckResult> CheckPartition(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Partition& partition, const std::vector<c10::IValue>& inputs,
    const runtime::CompareOptions& options = {});
absl::StatusOr<CheckResult> CheckPartition(
    const runtime::GraphModule& gm, const Partition& partition,
    const std::vector<c10::IValue>& inputs,
    const runtime::CompareOptions& options = {});

}  // namespace tracecut::partition

#endif  // TRACECUT_PARTITION_CHECK_H_
