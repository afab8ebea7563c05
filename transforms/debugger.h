#ifndef TRACECUT_TRANSFORMS_DEBUGGER_H_
#define TRACECUT_TRANSFORMS_DEBUGGER_H_

// Layer-by-layer transform debugger: which pass broke which layer?
//
// The model is partitioned (partition/partitioner.h) and run once,
// untransformed, on the given inputs to cache every subgraph's inputs. Then,
// subgraph by subgraph, the pipeline runs on the subgraph alone; before the
// first pass and after every pass the subgraph is run on its cached inputs
// (the original model's values, so errors never accumulate across layers)
// and its outputs are compared:
//   * step error: against the outputs just before this pass (what this pass
//     did);
//   * cumulative error: against the untransformed subgraph's outputs.
// The first (subgraph, pass) whose step error exceeds the tolerance is
// flagged.
//
//   DebugOptions options;
//   options.partition.targets = {"BertLayer"};
//   ASSIGN_OR_RETURN(DebugReport report,
//                    DebugPipeline(gm, pipeline, {input_ids}, options));
//   if (report.first_exceeding >= 0) ... report.steps[report.first_exceeding]
//   std::cout << report.ToJson();
//
// The transformed subgraphs are discarded (use RunPerSubgraph for the
// result); `gm` is untouched.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "partition/partitioner.h"
#include "runtime/graph_module.h"
#include "transforms/pipeline.h"

namespace tracecut::transforms {

struct DebugOptions {
  partition::PartitionOptions partition;
  // A step exceeds the tolerance when its error is above this; the error
  // is relative (max |after - before| / max |before|, over the subgraph's
  // outputs) unless `absolute`.
  double tolerance = 1e-5;
  bool absolute = false;
};

// One pass on one subgraph.
struct DebugStep {
  int subgraph = 0;
  std::string pass;
  bool changed = false;
  bool preserves_computation = true;
  // Against the outputs before this pass.
  double max_abs = 0;
  double max_rel = 0;
  // Against the untransformed subgraph.
  double cumulative_max_abs = 0;
  double cumulative_max_rel = 0;
  bool exceeds = false;
  std::vector<std::string> touched_nodes;
};

struct DebugSubgraph {
  int index = 0;
  std::vector<std::string> module_paths;
  std::vector<std::string> input_names;
  std::vector<std::string> output_names;
};

struct DebugReport {
  double tolerance = 0;
  bool absolute = false;
  std::vector<DebugSubgraph> subgraphs;
  // Subgraph-major, in pipeline order within a subgraph.
  std::vector<DebugStep> steps;
  // Index into `steps` of the first step over the tolerance, or -1.
  int first_exceeding = -1;

  // {"tolerance", "absolute", "first_exceeding": {"subgraph", "pass",
  //  "module_paths", "max_abs", "max_rel"} or null, "subgraphs": [...],
  //  "steps": [{"subgraph", "pass", "changed", "preserves_computation",
  //  "max_abs", "max_rel", "cumulative_max_abs", "cumulative_max_rel",
  //  "exceeds", "touched_nodes"}]}
  std::string ToJson() const;
};

// `inputs`: one per model input, in placeholder order.
absl::StatusOr<DebugReport> DebugPipeline(
    const runtime::GraphModule& gm, Pipeline& pipeline,
    const std::vector<c10::IValue>& inputs, const DebugOptions& options);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_DEBUGGER_H_
