#include "transforms/per_subgraph.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "transforms/instrumentation.h"
#include "transforms/per_subgraph_internal.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::transforms {

absl::StatusOr<PerSubgraphResult> RunPerSubgraph(
    const runtime::GraphModule& gm, const partition::Partition& partition,
    PassPipeline& pipeline) {
  ASSIGN_OR_RETURN(runtime::GraphModule work, gm.Clone());
  partition::Partition parts = internal::ClonePartition(partition);
  const int64_t base = NextApplicationId(gm.graph());
  std::vector<SubgraphRunReport> reports;
  bool any = false;
  for (partition::Subgraph& s : parts.subgraphs) {
    SubgraphRunReport report;
    report.index = s.index;
    report.module_paths = s.module_paths;
    report.node_count = s.node_count;
    PassChangeRecorder recorder;
    bool changed = false;
    {
      ScopedInstrumentation scope(pipeline, recorder);
      ASSIGN_OR_RETURN(changed,
                       internal::RunOnSubgraph(pipeline, work, s, base));
    }
    // One record per recorder entry, in the same order.
    const std::vector<PassRecord>& records = pipeline.records();
    for (size_t i = 0; i < recorder.entries().size(); ++i) {
      const PassChangeRecorder::Entry& e = recorder.entries()[i];
      report.passes.push_back(
          {e.pass, e.changed,
           i < records.size() ? absl::ToDoubleMilliseconds(records[i].time) : 0,
           e.touched_nodes});
    }
    report.changed = changed;
    any |= changed;
    reports.push_back(std::move(report));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> graph,
                   partition::Reassemble(parts));
  runtime::GraphModule module(work.module(), std::move(graph));
  module.mutable_extra_files() = gm.extra_files();
  return PerSubgraphResult{std::move(module), std::move(parts),
                           std::move(reports), any};
}

absl::StatusOr<PerSubgraphResult> RunPerSubgraph(
    const runtime::GraphModule& gm, PassPipeline& pipeline,
    const partition::PartitionOptions& options) {
  ASSIGN_OR_RETURN(partition::Partition p,
                   partition::PartitionGraph(gm.graph(), options));
  return RunPerSubgraph(gm, p, pipeline);
}

std::string PerSubgraphReportJson(const PerSubgraphResult& result) {
  util::Json subgraphs = util::Json::array();
  for (const SubgraphRunReport& s : result.subgraphs) {
    util::Json passes = util::Json::array();
    for (const SubgraphPassReport& p : s.passes) {
      util::Json pass = util::Json::object();
      pass["pass"] = p.pass;
      pass["changed"] = p.changed;
      // To the microsecond, as before.
      pass["time_ms"] = std::round(p.time_ms * 1000) / 1000;
      pass["touched_nodes"] = p.touched_nodes;
      passes.push_back(std::move(pass));
    }
    util::Json subgraph = util::Json::object();
    subgraph["index"] = s.index;
    subgraph["module_paths"] = s.module_paths;
    subgraph["node_count"] = s.node_count;
    subgraph["changed"] = s.changed;
    subgraph["passes"] = std::move(passes);
    subgraphs.push_back(std::move(subgraph));
  }
  util::Json report = util::Json::object();
  report["changed"] = result.changed;
  report["subgraphs"] = std::move(subgraphs);
  return util::DumpJson(report, 2) + "\n";
}

}  // namespace tracecut::transforms
