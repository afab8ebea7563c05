#include "transforms/per_subgraph.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transforms/per_subgraph_internal.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace internal {

partition::Partition ClonePartition(const partition::Partition& p) {
  partition::Partition copy;
  for (const partition::Subgraph& s : p.subgraphs) {
    partition::Subgraph c;
    c.index = s.index;
    c.graph = s.graph->Clone();
    c.module_paths = s.module_paths;
    c.input_names = s.input_names;
    c.output_names = s.output_names;
    c.last_use = s.last_use;
    c.param_targets = s.param_targets;
    c.leaf_modules = s.leaf_modules;
    c.param_bytes = s.param_bytes;
    c.node_count = s.node_count;
    c.warnings = s.warnings;
    copy.subgraphs.push_back(std::move(c));
  }
  copy.targets_used = p.targets_used;
  copy.model_inputs = p.model_inputs;
  copy.model_outputs = p.model_outputs;
  copy.output_graph = p.output_graph->Clone();
  copy.home = p.home;
  copy.warnings = p.warnings;
  return copy;
}

std::string SubgraphLabel(const partition::Subgraph& s) {
  std::string label = absl::StrCat("subgraph ", s.index);
  if (!s.module_paths.empty()) {
    absl::StrAppend(&label, " (", absl::StrJoin(s.module_paths, ", "), ")");
  }
  return label;
}

std::vector<std::string> TouchedNodes(const ir::Graph& graph,
                                      absl::string_view pass, int64_t app) {
  std::vector<std::string> names;
  for (const ir::Node* n : GetTransformedNodes(graph, pass, app)) {
    names.push_back(n->name());
  }
  return names;
}

ObserverScope::ObserverScope(Pipeline& pipeline, PassObserver observer)
    : pipeline_(pipeline), saved_(pipeline.options().after_pass) {
  PassObserver user = saved_;
  pipeline_.mutable_options().after_pass =
      [observer = std::move(observer), user](
          const PassRecord& r, const runtime::GraphModule& gm) -> absl::Status {
    RETURN_IF_ERROR(observer(r, gm));
    return user ? user(r, gm) : absl::OkStatus();
  };
}

ObserverScope::~ObserverScope() {
  pipeline_.mutable_options().after_pass = saved_;
}

absl::StatusOr<bool> RunOnSubgraph(Pipeline& pipeline,
                                   const runtime::GraphModule& owner,
                                   partition::Subgraph& s, int64_t base) {
  runtime::GraphModule sub(owner.module(), std::move(s.graph));
  PinApplicationId(sub.graph(), base);
  absl::StatusOr<bool> changed = pipeline.Run(sub);
  PinApplicationId(sub.graph(), std::nullopt);
  s.graph = sub.graph().Clone();
  if (!changed.ok()) {
    return absl::Status(
        changed.status().code(),
        absl::StrCat(SubgraphLabel(s), ": ", changed.status().message()));
  }
  return *changed;
}

}  // namespace internal

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
    internal::ObserverScope scope(
        pipeline, [&](const PassRecord& r, const runtime::GraphModule& sub) {
          SubgraphPassReport p;
          p.pass = r.name;
          p.changed = r.changed;
          p.time_ms = absl::ToDoubleMilliseconds(r.time);
          p.touched_nodes = internal::TouchedNodes(sub.graph(), r.name, r.app);
          report.passes.push_back(std::move(p));
          return absl::OkStatus();
        });
    ASSIGN_OR_RETURN(bool changed,
                     internal::RunOnSubgraph(pipeline, work, s, base));
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
