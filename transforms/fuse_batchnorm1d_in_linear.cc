#include "transforms/fuse_batchnorm1d_in_linear.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "runtime/torch_status.h"
#include "transforms/fusion_math.h"
#include "transforms/module_util.h"
#include "transforms/pair_fusion.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

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

// Whether the value `n` produces is known to be 2-D ([N, C]), the only
// layout where BatchNorm1d's channels are the Linear's features.
bool KnownTwoD(const ir::Node* n) {
  const auto& outs = n->meta().outputs;
  return outs.size() == 1 && outs[0].shape.size() == 2;
}

struct Site {
  ir::Node* first;
  ir::Node* second;
  bool bn_first;
  LinearLeaf linear;
  fusion_math::BatchNormParams bn;
};

absl::Status FuseOne(runtime::GraphModule& gm, const Site& s, int64_t app) {
  ir::Node* linear_node = s.bn_first ? s.second : s.first;
  ir::Node* bn_node = s.bn_first ? s.first : s.second;
  absl::StatusOr<fusion_math::WeightAndBias> fused =
      s.bn_first ? fusion_math::FoldBatchNormIntoFollowingLinear(
                       s.linear.weight, s.linear.bias, s.bn)
                 : fusion_math::FoldBatchNormIntoPreceding(s.linear.weight,
                                                           s.linear.bias, s.bn);
  RETURN_IF_ERROR(fused.status());
  ASSIGN_OR_RETURN(torch::jit::Module module,
                   MakeLinearModule(gm.module(), fused->weight, fused->bias));
  auto [parent, linear_name] = SplitParentPath(linear_node->target());
  const std::string bn_name = SplitParentPath(bn_node->target()).second;
  ASSIGN_OR_RETURN(
      std::string path,
      AddSubmodule(gm, parent,
                   absl::StrCat(linear_name, "_", bn_name, "_fused"), module));
  PairFusion fusion;
  fusion.first = s.first;
  fusion.second = s.second;
  // The fused call takes the Linear's name and place.
  fusion.anchor_is_first = !s.bn_first;
  fusion.module_path = path;
  fusion.module_type = "torch.nn.modules.linear.Linear";
  fusion.args = s.first->args();
  return FusePair(gm.graph(), fusion, FuseBatchNorm1dInLinear::kName, app)
      .status();
}

}  // namespace

absl::StatusOr<bool> FuseBatchNorm1dInLinear::Run(runtime::GraphModule& gm) {
  std::vector<Site> sites;
  for (ir::Node* second : gm.graph().nodes()) {
    if (second->op() != ir::OpKind::kCallModule || second->args().size() != 1 ||
        !second->args()[0].is_node()) {
      continue;
    }
    ir::Node* first = second->args()[0].node();
    if (first->users().size() != 1 || !KnownTwoD(first)) continue;
    for (bool bn_first : {false, true}) {
      std::optional<torch::jit::Module> bn =
          LeafOf(gm, bn_first ? first : second, LeafKind::kBatchNorm1d);
      std::optional<torch::jit::Module> linear =
          LeafOf(gm, bn_first ? second : first, LeafKind::kLinear);
      if (!bn || !linear) continue;
      absl::StatusOr<LinearLeaf> l = ReadLinear(*linear);
      absl::StatusOr<fusion_math::BatchNormParams> b = ReadBatchNorm(*bn);
      if (!l.ok() || !b.ok()) continue;
      const int64_t features = bn_first ? l->in_features : l->out_features;
      const int64_t channel = first->meta().outputs[0].shape[1];
      if (b->running_mean.numel() != features ||
          (channel >= 0 && channel != features)) {
        continue;
      }
      sites.push_back({first, second, bn_first, *std::move(l), *std::move(b)});
    }
  }
  // A node can be in two candidate pairs (bn -> fc -> bn): fuse the first.
  std::vector<Site> chosen;
  absl::flat_hash_set<ir::Node*> used;
  for (Site& s : sites) {
    if (used.contains(s.first) || used.contains(s.second)) continue;
    used.insert(s.first);
    used.insert(s.second);
    chosen.push_back(std::move(s));
  }
  if (chosen.empty()) return false;
  const int64_t app = NextApplicationId(gm.graph());
  for (const Site& s : chosen) {
    RETURN_IF_ERROR(
        runtime::TorchCall(kName, [&] { return FuseOne(gm, s, app); }));
  }
  return true;
}

absl::StatusOr<bool> FuseBatchNorm1dInLinear::Reverse(
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
