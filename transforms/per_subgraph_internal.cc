#include "transforms/per_subgraph_internal.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status.h"

namespace tracecut::transforms::internal {

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

absl::StatusOr<bool> RunOnSubgraph(PassPipeline& pipeline,
                                   const runtime::GraphModule& owner,
                                   partition::Subgraph& s, int64_t base) {
  runtime::GraphModule sub(owner.module(), std::move(s.graph));
  PinApplicationId(sub.graph(), base);
  absl::StatusOr<bool> changed = pipeline.Run(sub);
  PinApplicationId(sub.graph(), std::nullopt);
  s.graph = sub.graph().Clone();
  return util::Annotate(std::move(changed), SubgraphLabel(s));
}

}  // namespace tracecut::transforms::internal
