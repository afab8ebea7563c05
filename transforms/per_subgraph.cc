#include "transforms/per_subgraph.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transforms/instrumentation.h"
#include "transforms/per_subgraph_internal.h"
#include "util/status_macros.h"

namespace tracecut::transforms {

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

absl::StatusOr<PerSubgraphResult> RunPerSubgraph(
    const runtime::GraphModule& gm, const partition::Partition& partition,
    Pipeline& pipeline) {
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
    const runtime::GraphModule& gm, Pipeline& pipeline,
    const partition::PartitionOptions& options) {
  ASSIGN_OR_RETURN(partition::Partition p,
                   partition::PartitionGraph(gm.graph(), options));
  return RunPerSubgraph(gm, p, pipeline);
}

std::string PerSubgraphReportJson(const PerSubgraphResult& result) {
  std::vector<std::string> subgraphs;
  for (const SubgraphRunReport& s : result.subgraphs) {
    std::vector<std::string> paths, passes;
    for (const std::string& p : s.module_paths) paths.push_back(JsonQuote(p));
    for (const SubgraphPassReport& p : s.passes) {
      std::vector<std::string> touched;
      for (const std::string& n : p.touched_nodes)
        touched.push_back(JsonQuote(n));
      char ms[32];
      std::snprintf(ms, sizeof(ms), "%.3f", p.time_ms);
      passes.push_back(absl::StrCat(
          "{\"pass\": ", JsonQuote(p.pass), ", \"changed\": ",
          p.changed ? "true" : "false", ", \"time_ms\": ", ms,
          ", \"touched_nodes\": [", absl::StrJoin(touched, ", "), "]}"));
    }
    subgraphs.push_back(absl::StrCat(
        "{\"index\": ", s.index, ", \"module_paths\": [",
        absl::StrJoin(paths, ", "), "], \"node_count\": ", s.node_count,
        ", \"changed\": ", s.changed ? "true" : "false", ", \"passes\": [",
        absl::StrJoin(passes, ", "), "]}"));
  }
  return absl::StrCat("{\"changed\": ", result.changed ? "true" : "false",
                      ", \"subgraphs\": [", absl::StrJoin(subgraphs, ", "),
                      "]}\n");
}

}  // namespace tracecut::transforms
