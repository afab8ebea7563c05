#include "transforms/fuse_bias_in_linear.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/torch_status.h"
#include "transforms/fusion_math.h"
#include "transforms/module_util.h"
#include "transforms/node_snapshot.h"
#include "transforms/pair_fusion.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

constexpr char kRole[] = "role";
constexpr char kLinear[] = "linear";
constexpr char kPad[] = "pad";
constexpr char kOriginal[] = "original";

absl::Status FuseOne(runtime::GraphModule& gm, ir::Node* node,
                     const LinearLeaf& leaf, int64_t app) {
  ir::Graph& graph = gm.graph();
  ASSIGN_OR_RETURN(torch::Tensor fused,
                   fusion_math::AppendBiasColumn(leaf.weight, *leaf.bias));
  ASSIGN_OR_RETURN(torch::jit::Module module,
                   MakeLinearModule(gm.module(), fused, std::nullopt));
  auto [parent, leaf_name] = SplitParentPath(node->target());
  ASSIGN_OR_RETURN(
      std::string path,
      AddSubmodule(gm, parent, absl::StrCat(leaf_name, "_bias_fused"), module));
  const std::string name = node->name();
  ir::Node* pad;
  ir::Node* linear;
  {
    ir::Graph::InsertPointGuard guard(graph, node);
    ASSIGN_OR_RETURN(
        pad,
        graph.CallFunction(
            "aten::constant_pad_nd",
            {node->args()[0],
             ir::Argument::List({ir::Argument::Int(0), ir::Argument::Int(1)}),
             ir::Argument::Double(1.0)}));
    ASSIGN_OR_RETURN(
        linear, graph.CallModule(path, {ir::Argument::Ref(pad)}, {}, name));
  }
  pad->set_scope(ParentScope(node->scope()));
  const auto& outs = node->args()[0].node()->meta().outputs;
  if (outs.size() == 1 && !outs[0].shape.empty()) {
    ir::TensorMeta padded = outs[0];
    if (padded.shape.back() >= 0) ++padded.shape.back();
    pad->meta().outputs = {padded};
  }
  MarkTransformed(pad, FuseBiasInLinear::kName, app, {{kRole, kPad}});
  linear->set_scope(
      ReplaceInnermost(node->scope(), path, "torch.nn.modules.linear.Linear"));
  linear->meta().outputs = node->meta().outputs;
  linear->meta().source = node->meta().source;
  MarkTransformed(linear, FuseBiasInLinear::kName, app,
                  {{kRole, kLinear}, {kOriginal, SnapshotNode(*node)}});
  RETURN_IF_ERROR(graph.ReplaceAllUsesWith(node, linear));
  RETURN_IF_ERROR(graph.Erase(node));
  graph.Rename(linear, name);
  return absl::OkStatus();
}

absl::Status UnfuseOne(runtime::GraphModule& gm, ir::Node* linear,
                       int64_t app) {
  ir::Graph& graph = gm.graph();
  const ir::TransformMark* mark =
      FindMark(*linear, FuseBiasInLinear::kName, app);
  RETURN_IF_ERROR(CheckLastMark(*linear, *mark));
  ir::Node* pad = linear->args().size() == 1 && linear->args()[0].is_node()
                      ? linear->args()[0].node()
                      : nullptr;
  const ir::TransformMark* pad_mark =
      pad == nullptr ? nullptr : FindMark(*pad, FuseBiasInLinear::kName, app);
  if (pad_mark == nullptr || pad->users().size() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot undo fuse-bias-in-linear on ", linear->Describe(),
                     ": its padded input was changed"));
  }
  RETURN_IF_ERROR(CheckLastMark(*pad, *pad_mark));
  const std::string path = linear->target();
  const std::string snapshot = mark->data.at(kOriginal);
  RETURN_IF_ERROR(ReplaceWithSnapshot(graph, linear, snapshot).status());
  RETURN_IF_ERROR(graph.Erase(pad));
  return RemoveAttribute(gm, path);
}

}  // namespace

absl::StatusOr<bool> FuseBiasInLinear::Run(runtime::GraphModule& gm) {
  std::vector<std::pair<ir::Node*, LinearLeaf>> sites;
  for (ir::Node* n : gm.graph().nodes()) {
    if (n->op() != ir::OpKind::kCallModule || n->args().size() != 1 ||
        !n->args()[0].is_node() || !n->kwargs().empty()) {
      continue;
    }
    absl::StatusOr<torch::jit::Module> m = gm.GetSubmodule(n->target());
    if (!m.ok() || ClassifyLeaf(*m) != LeafKind::kLinear) continue;
    absl::StatusOr<LinearLeaf> leaf = ReadLinear(*m);
    if (!leaf.ok() || !leaf->bias) continue;
    sites.emplace_back(n, *std::move(leaf));
  }
  if (sites.empty()) return false;
  const int64_t app = NextApplicationId(gm.graph());
  for (auto& [node, leaf] : sites) {
    RETURN_IF_ERROR(runtime::TorchCall(
        kName, [&, n = node, &l = leaf] { return FuseOne(gm, n, l, app); }));
  }
  return true;
}

absl::StatusOr<bool> FuseBiasInLinear::Reverse(runtime::GraphModule& gm) {
  std::optional<int64_t> app = LatestApplicationId(gm.graph(), kName);
  if (!app) return false;
  RETURN_IF_ERROR(CheckIsLatestApplication(gm.graph(), kName, *app));
  std::vector<ir::Node*> linears;
  for (ir::Node* n : GetTransformedNodes(gm.graph(), kName, *app)) {
    const ir::TransformMark* m = FindMark(*n, kName, *app);
    auto it = m->data.find(kRole);
    if (it != m->data.end() && it->second == kLinear) linears.push_back(n);
  }
  for (ir::Node* n : linears) {
    RETURN_IF_ERROR(runtime::TorchCall(absl::StrCat(kName, " (reverse)"),
                                       [&] { return UnfuseOne(gm, n, *app); }));
  }
  return true;
}

}  // namespace tracecut::transforms
