#ifndef TRACECUT_TRANSFORMS_NODE_SNAPSHOT_H_
#define TRACECUT_TRANSFORMS_NODE_SNAPSHOT_H_

// Snapshots of nodes a pass erases or rewrites, kept as strings in a
// TransformMark so that Reverse can put back exactly the node that was there
// (name, op, target, operands, scope and meta, earlier marks included). No
// LibTorch here.
//
//   mark_data["bn"] = SnapshotNode(*bn_node);
//   ... later, in Reverse:
//   ASSIGN_OR_RETURN(ir::Node* bn, RestoreNode(graph, mark_data["bn"], next));
//
// A snapshot is the IR text form (ir/text.h) of a small graph: one
// placeholder per node the snapshotted node reads (named like it), then the
// node itself. Restoring resolves those names in the target graph, so every
// node the original read must exist there again by then, which holds when
// passes are undone in reverse order.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::transforms {

std::string SnapshotNode(const ir::Node& node);

// Recreates the snapshotted node right before `before` (nullptr: at the
// end) and returns it. It gets its original name when that name is free;
// otherwise a fresh one, and the caller renames it once the node holding the
// name is gone (see ReplaceWithSnapshot).
absl::StatusOr<ir::Node*> RestoreNode(ir::Graph& graph,
                                      absl::string_view snapshot,
                                      ir::Node* before);

// Puts the snapshotted node back in place of `current`: recreates it right
// before `current`, makes every user of `current` read it, erases `current`
// and gives the restored node its original name.
absl::StatusOr<ir::Node*> ReplaceWithSnapshot(ir::Graph& graph,
                                              ir::Node* current,
                                              absl::string_view snapshot);

// The original name recorded in a snapshot.
absl::StatusOr<std::string> SnapshotName(absl::string_view snapshot);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_NODE_SNAPSHOT_H_
