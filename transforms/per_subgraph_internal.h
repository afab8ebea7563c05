#ifndef TRACECUT_TRANSFORMS_PER_SUBGRAPH_INTERNAL_H_
#define TRACECUT_TRANSFORMS_PER_SUBGRAPH_INTERNAL_H_

// Pieces of the per-subgraph runner the layer-by-layer debugger shares.
// Internal to transforms/.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "partition/subgraph.h"
#include "runtime/graph_module.h"
#include "transforms/pass_pipeline.h"

namespace tracecut::transforms::internal {

// A deep copy (graphs cloned).
partition::Partition ClonePartition(const partition::Partition& p);

// "subgraph 3 (model.layers.2)".
std::string SubgraphLabel(const partition::Subgraph& s);

// Runs `pipeline` on subgraph `s` as a GraphModule over owner.module(),
// with application ids starting at `base`; `s.graph` is replaced by the
// result (also on error). Errors are prefixed with SubgraphLabel(s).
absl::StatusOr<bool> RunOnSubgraph(PassPipeline& pipeline,
                                   const runtime::GraphModule& owner,
                                   partition::Subgraph& s, int64_t base);

}  // namespace tracecut::transforms::internal

#endif  // TRACECUT_TRANSFORMS_PER_SUBGRAPH_INTERNAL_H_
