#include "transforms/eliminate_dead_code.h"

#include <vector>

#include "transforms/purity.h"
#include "util/status_macros.h"

namespace tracecut::transforms {

absl::StatusOr<bool> EliminateDeadCode::Run(runtime::GraphModule& gm) {
  ir::Graph& graph = gm.graph();
  std::vector<ir::Node*> order;
  for (ir::Node* n : graph.nodes()) order.push_back(n);
  bool changed = false;
  // Walking backwards, a node's users are visited (and maybe erased) first.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    ir::Node* n = *it;
    if (!n->users().empty() || !IsPureNode(*n, modules_are_pure_)) continue;
    RETURN_IF_ERROR(graph.Erase(n));
    changed = true;
  }
  return changed;
}

}  // namespace tracecut::transforms
