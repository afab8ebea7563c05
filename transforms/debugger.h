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
// Both go through runtime/compare.h. A step exceeds the tolerances when its
// outputs fail the comparison with the outputs before the pass
// (|after - before| <= atol + rtol*|before| elementwise; defaults rtol 1e-4,
// atol 1e-5), or cannot be compared with them (a changed shape or output
// count). The first (subgraph, pass) that exceeds them is flagged.
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
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "partition/partitioner.h"
#include "runtime/compare.h"
#include "runtime/graph_module.h"
#include "transforms/pass_pipeline.h"

namespace tracecut::transforms {

struct DebugOptions {
  partition::PartitionOptions partition;
  // The tolerances a step's outputs must meet against the outputs before it.
  runtime::CompareOptions compare;
};

// One pass on one subgraph.
struct DebugStep {
  int subgraph = 0;
  std::string pass;
  bool changed = false;
  bool preserves_computation = true;
  // Against the outputs before this pass (runtime::CompareResult's
  // max_abs_error, max_rel_error; +inf where they cannot be compared).
  double max_abs = 0;
  double max_rel = 0;
  // Elements compared, and those over the tolerances.
  int64_t elements = 0;
  int64_t violations = 0;
  // The worst violation; its path names the subgraph output ("%add_1").
  std::optional<runtime::ElementDiff> worst;
  // Why the outputs could not be compared ("%add_1: shape [4, 8] vs
  // [4, 16]"), or empty.
  std::string mismatch;
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
  double rtol = 0;
  double atol = 0;
  std::vector<DebugSubgraph> subgraphs;
  // Subgraph-major, in pipeline order within a subgraph.
  std::vector<DebugStep> steps;
  // Index into `steps` of the first step over the tolerance, or -1.
  int first_exceeding = -1;

  // {"rtol", "atol", "first_exceeding": {"subgraph", "pass",
  //  "module_paths", "max_abs", "max_rel", "violations", "elements",
  //  "worst" (ElementDiff::ToString() or null), "mismatch" (or null)} or
  //  null, "subgraphs": [...], "steps": [{"subgraph", "pass", "changed",
  //  "preserves_computation", "max_abs", "max_rel", "violations",
  //  "cumulative_max_abs", "cumulative_max_rel", "exceeds",
  //  "touched_nodes"}]}
  // Written by util::DumpJson (indent 2, then a newline): doubles in their
  // shortest round-trip form, non-finite ones (the infinite errors of
  // outputs that cannot be compared) as null.
  std::string ToJson() const;
};

// `inputs`: one per model input, in placeholder order. Bad tolerances are
// InvalidArgument.
absl::StatusOr<DebugReport> DebugPipeline(
    const runtime::GraphModule& gm, PassPipeline& pipeline,
    const std::vector<c10::IValue>& inputs, const DebugOptions& options);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_DEBUGGER_H_
