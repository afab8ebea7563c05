#include "transforms/fuse_batchnorm2d_in_conv2d.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/torch_status.h"
#include "transforms/fusion_math.h"
#include "transforms/module_util.h"
#include "transforms/pair_fusion.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

// The module a call_module node calls, when it is of `kind`.
std::optional<torch::jit::Module> LeafOf(const runtime::GraphModule& gm,
                                         const ir::Node* n, LeafKind kind) {
  if (n->op() != ir::OpKind::kCallModule || n->args().size() != 1 ||
      !n->args()[0].is_node() || !n->kwargs().empty()) {
    return std::nullopt;
  }
  absl::StatusOr<torch::jit::Module> m = gm.GetSubmodule(n->target());
  if (!m.ok() || ClassifyLeaf(*m) != kind) return std::nullopt;
  return *m;
}

absl::Status FuseOne(runtime::GraphModule& gm, ir::Node* conv_node,
                     ir::Node* bn_node, Conv2dLeaf conv,
                     const fusion_math::BatchNormParams& bn, int64_t app) {
  ASSIGN_OR_RETURN(
      fusion_math::WeightAndBias fused,
      fusion_math::FoldBatchNormIntoPreceding(conv.weight, conv.bias, bn));
  conv.weight = fused.weight;
  conv.bias = fused.bias;
  ASSIGN_OR_RETURN(torch::jit::Module module,
                   MakeConv2dModule(gm.module(), conv));
  auto [parent, conv_name] = SplitParentPath(conv_node->target());
  const std::string bn_name = SplitParentPath(bn_node->target()).second;
  ASSIGN_OR_RETURN(
      std::string path,
      AddSubmodule(gm, parent, absl::StrCat(conv_name, "_", bn_name, "_fused"),
                   module));
  PairFusion fusion;
  fusion.first = conv_node;
  fusion.second = bn_node;
  fusion.anchor_is_first = true;
  fusion.module_path = path;
  fusion.module_type = "torch.nn.modules.conv.Conv2d";
  fusion.args = conv_node->args();
  return FusePair(gm.graph(), fusion, FuseBatchNorm2dInConv2d::kName, app)
      .status();
}

}  // namespace

absl::StatusOr<bool> FuseBatchNorm2dInConv2d::Run(runtime::GraphModule& gm) {
  struct Site {
    ir::Node* conv;
    ir::Node* bn;
    Conv2dLeaf conv_leaf;
    fusion_math::BatchNormParams bn_params;
  };
  std::vector<Site> sites;
  for (ir::Node* bn : gm.graph().nodes()) {
    std::optional<torch::jit::Module> bn_module =
        LeafOf(gm, bn, LeafKind::kBatchNorm2d);
    if (!bn_module) continue;
    ir::Node* conv = bn->args()[0].node();
    std::optional<torch::jit::Module> conv_module =
        LeafOf(gm, conv, LeafKind::kConv2d);
    if (!conv_module || conv->users().size() != 1) continue;
    absl::StatusOr<Conv2dLeaf> conv_leaf = ReadConv2d(*conv_module);
    absl::StatusOr<fusion_math::BatchNormParams> params =
        ReadBatchNorm(*bn_module);
    if (!conv_leaf.ok() || !params.ok()) continue;  // Not foldable.
    if (conv_leaf->weight.size(0) != params->running_mean.numel()) continue;
    sites.push_back({conv, bn, *std::move(conv_leaf), *std::move(params)});
  }
  if (sites.empty()) return false;
  const int64_t app = NextApplicationId(gm.graph());
  for (Site& s : sites) {
    RETURN_IF_ERROR(runtime::TorchCall(kName, [&] {
      return FuseOne(gm, s.conv, s.bn, s.conv_leaf, s.bn_params, app);
    }));
  }
  return true;
}

absl::StatusOr<bool> FuseBatchNorm2dInConv2d::Reverse(
    runtime::GraphModule& gm) {
  std::optional<int64_t> app = LatestApplicationId(gm.graph(), kName);
  if (!app) return false;
  RETURN_IF_ERROR(CheckIsLatestApplication(gm.graph(), kName, *app));
  for (ir::Node* n : GetTransformedNodes(gm.graph(), kName, *app)) {
    RETURN_IF_ERROR(runtime::TorchCall(absl::StrCat(kName, " (reverse)"), [&] {
      return UnfusePair(gm, n, kName, *app);
    }));
  }
  return true;
}

}  // namespace tracecut::transforms
