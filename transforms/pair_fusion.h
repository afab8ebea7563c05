#ifndef TRACECUT_TRANSFORMS_PAIR_FUSION_H_
#define TRACECUT_TRANSFORMS_PAIR_FUSION_H_

// The graph surgery shared by passes that fuse two consecutive leaf-module
// calls into one new module (Conv2d -> BatchNorm2d, Linear -> BatchNorm1d,
// BatchNorm1d -> Linear), and its exact undo. Internal to transforms/.
//
// Before (first feeds second, and nothing else reads first):
//   %conv = call_module[conv](%x)
//   ...
//   %bn = call_module[bn](%conv)
//   ... users of %bn ...
// After FusePair(anchor = first):
//   %conv = call_module[conv_bn_fused](%x)   <- new node, mark(pass, {...})
//   ... users now read %conv ...
//
// The fused node takes the anchor's name and position (the anchor is `first`
// for conv->bn and linear->bn, `second` for bn->linear) and the second's
// users. Its mark records snapshots of both originals, the name of the node
// that followed the erased one, and the module path to delete on undo. The
// original modules stay registered, untouched, so undoing is exact.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"

namespace tracecut::transforms {

struct PairFusion {
  ir::Node* first = nullptr;   // Feeds `second`; read by nothing else.
  ir::Node* second = nullptr;  // Reads `first` as its only operand.
  bool anchor_is_first = true;
  // The module the fused call runs (already registered) and its type.
  std::string module_path;
  std::string module_type;
  // Operands of the fused call (those of `first`).
  std::vector<ir::Argument> args;
};

// Rewrites the graph as above and returns the fused node.
absl::StatusOr<ir::Node*> FusePair(ir::Graph& graph, const PairFusion& fusion,
                                   absl::string_view pass, int64_t app);

// Undoes FusePair on `fused` (a node carrying `pass`'s mark from `app`):
// restores both original nodes where they were, with their names, operands,
// scopes and meta, and removes the fused module from `gm`.
absl::Status UnfusePair(runtime::GraphModule& gm, ir::Node* fused,
                        absl::string_view pass, int64_t app);

// `scope` with its innermost entry replaced by {path, type} (pushed when
// `scope` is empty): the scope of a call to a module that stands in for the
// innermost one.
ir::Scope ReplaceInnermost(const ir::Scope& scope, const std::string& path,
                           const std::string& type);

// `scope` without its innermost entry.
ir::Scope ParentScope(const ir::Scope& scope);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_PAIR_FUSION_H_
