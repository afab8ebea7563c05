#include "transforms/gelu_tanh_approx.h"

#include <vector>

#include "transforms/node_snapshot.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

constexpr char kOriginal[] = "original";

}  // namespace

absl::StatusOr<bool> GeluTanhApprox::Run(runtime::GraphModule& gm) {
  ir::Graph& graph = gm.graph();
  const int64_t app = NextApplicationId(graph);
  bool changed = false;
  for (ir::Node* n : graph.nodes()) {
    if (n->op() != ir::OpKind::kCallFunction || n->target() != "aten::gelu") {
      continue;
    }
    // gelu(Tensor self, *, str approximate="none"): positional per the IR
    // conventions, or a kwarg.
    const ir::Argument* approx = nullptr;
    bool positional = false;
    if (n->args().size() == 2) {
      approx = &n->args()[1];
      positional = true;
    } else if (n->args().size() == 1) {
      approx = n->kwarg("approximate");
    } else {
      continue;
    }
    if (approx != nullptr && (approx->kind() != ir::Argument::Kind::kString ||
                              approx->as_string() != "none")) {
      continue;
    }
    const std::string snapshot = SnapshotNode(*n);
    if (positional) {
      RETURN_IF_ERROR(n->SetArg(1, ir::Argument::String("tanh")));
    } else {
      RETURN_IF_ERROR(n->SetKwarg("approximate", ir::Argument::String("tanh")));
    }
    MarkTransformed(n, kName, app, {{kOriginal, snapshot}});
    changed = true;
  }
  return changed;
}

absl::StatusOr<bool> GeluTanhApprox::Reverse(runtime::GraphModule& gm) {
  ir::Graph& graph = gm.graph();
  std::optional<int64_t> app = LatestApplicationId(graph, kName);
  if (!app) return false;
  RETURN_IF_ERROR(CheckIsLatestApplication(graph, kName, *app));
  for (ir::Node* n : GetTransformedNodes(graph, kName, *app)) {
    const ir::TransformMark* m = FindMark(*n, kName, *app);
    RETURN_IF_ERROR(CheckLastMark(*n, *m));
    RETURN_IF_ERROR(
        ReplaceWithSnapshot(graph, n, m->data.at(kOriginal)).status());
  }
  return true;
}

}  // namespace tracecut::transforms
