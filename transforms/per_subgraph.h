#ifndef TRACECUT_TRANSFORMS_PER_SUBGRAPH_H_
#define TRACECUT_TRANSFORMS_PER_SUBGRAPH_H_

// Runs a pipeline on each subgraph of a partition (partition/partitioner.h)
// and reassembles the results into one GraphModule, reporting per subgraph
// what each pass changed.
//
//   partition::PartitionOptions options;
//   options.targets = {"LlamaDecoderLayer"};
//   PassPipeline pipeline;
//   pipeline.AddPass<MergeLinears>();
//   ASSIGN_OR_RETURN(PerSubgraphResult r,
//                    RunPerSubgraph(gm, pipeline, options));
//   // r.module: the transformed copy (gm is untouched);
//   // r.subgraphs[i].passes[j].touched_nodes: what pass j did in subgraph i.
//   std::cout << PerSubgraphReportJson(r);
//
// How: gm is cloned once; every subgraph becomes a GraphModule over the
// clone's module (new modules and buffers that passes add are shared by
// all subgraphs) and the pipeline runs on it with the same first
// application id, so pass step i carries id base + i in every subgraph and
// the reassembled module can be undone with pipeline.Reverse like a
// whole-graph run. A pass only sees one subgraph at a time: patterns that
// span two subgraphs are not rewritten.
//
// The result's graph is partition::Reassemble's: the same nodes as the
// original, in subgraph order (parameter reads merged and placed in their
// first subgraph). Reversing it gives back Reassemble of the untransformed
// partition, bit for bit, which computes exactly what the original did.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "partition/partitioner.h"
#include "partition/subgraph.h"
#include "runtime/graph_module.h"
#include "transforms/pass_pipeline.h"

namespace tracecut::transforms {

struct SubgraphPassReport {
  std::string pass;
  bool changed = false;
  double time_ms = 0;
  // Nodes of the subgraph that carry this pass's mark afterwards (graph
  // order).
  std::vector<std::string> touched_nodes;
};

struct SubgraphRunReport {
  int index = 0;
  std::vector<std::string> module_paths;
  int64_t node_count = 0;
  bool changed = false;
  std::vector<SubgraphPassReport> passes;
};

struct PerSubgraphResult {
  runtime::GraphModule module;
  // The partition with the transformed subgraph graphs.
  partition::Partition partition;
  std::vector<SubgraphRunReport> subgraphs;
  bool changed = false;
};

// Partitions gm.graph() with `options`, runs `pipeline` on every subgraph of
// a clone of `gm` and reassembles. Errors name the subgraph:
// "subgraph 3 (model.layers.2): failed after merge-linears: ...".
absl::StatusOr<PerSubgraphResult> RunPerSubgraph(
    const runtime::GraphModule& gm, PassPipeline& pipeline,
    const partition::PartitionOptions& options);

// The same on an existing partition of gm.graph() (left unchanged).
absl::StatusOr<PerSubgraphResult> RunPerSubgraph(
    const runtime::GraphModule& gm, const partition::Partition& partition,
    PassPipeline& pipeline);

// {"changed": bool, "subgraphs": [{"index", "module_paths", "node_count",
//  "changed", "passes": [{"pass", "changed", "time_ms", "touched_nodes"}]}]}
// by util::DumpJson (indent 2, then a newline); time_ms to the microsecond.
std::string PerSubgraphReportJson(const PerSubgraphResult& result);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_PER_SUBGRAPH_H_
