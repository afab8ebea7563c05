#include "transforms/merge_linears.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"
#include "transforms/fusion_math.h"
#include "transforms/module_util.h"
#include "transforms/node_snapshot.h"
#include "transforms/pair_fusion.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

// Mark roles and data keys.
constexpr char kRole[] = "role";
constexpr char kMerged[] = "merged";
constexpr char kSplit[] = "split";
constexpr char kOutput[] = "output";
constexpr char kIndex[] = "index";
constexpr char kOriginal[] = "original";

struct Candidate {
  ir::Node* node;
  LinearLeaf leaf;
};

// What layers must share to be merged.
struct GroupKey {
  ir::Node* input;
  bool conv1d;
  int64_t in_features;
  c10::ScalarType dtype;
  std::string device;
  bool operator<(const GroupKey& o) const {
    return std::tie(input, conv1d, in_features, dtype, device) <
           std::tie(o.input, o.conv1d, o.in_features, o.dtype, o.device);
  }
};

// The merged output's meta: the first layer's with the last dimension
// summed (-1 when any is unknown). Empty unless every layer's is known.
std::vector<ir::TensorMeta> MergedMeta(const std::vector<Candidate>& group) {
  ir::TensorMeta merged;
  int64_t last = 0;
  for (const Candidate& c : group) {
    const auto& outs = c.node->meta().outputs;
    if (outs.size() != 1 || outs[0].shape.empty()) return {};
    if (merged.shape.empty()) merged = outs[0];
    if (outs[0].shape.size() != merged.shape.size()) return {};
    const int64_t d = outs[0].shape.back();
    last = (last < 0 || d < 0) ? -1 : last + d;
  }
  merged.shape.back() = last;
  return {merged};
}

absl::Status MergeGroup(runtime::GraphModule& gm,
                        const std::vector<Candidate>& group, int64_t app) {
  ir::Graph& graph = gm.graph();
  const bool conv1d = group[0].leaf.conv1d;
  std::vector<fusion_math::WeightAndBias> parts;
  std::vector<std::string> names;
  for (const Candidate& c : group) {
    parts.push_back({c.leaf.weight, c.leaf.bias});
    names.push_back(SplitParentPath(c.node->target()).second);
  }
  const int64_t out_dim = group[0].leaf.out_dim();
  ASSIGN_OR_RETURN(fusion_math::WeightAndBias merged,
                   fusion_math::ConcatLinears(parts, out_dim));
  const std::vector<int64_t> sizes = fusion_math::OutFeatures(parts, out_dim);

  ir::Node* first = group[0].node;
  ASSIGN_OR_RETURN(torch::jit::Module first_module,
                   gm.GetSubmodule(first->target()));
  const std::string type =
      conv1d ? ModuleType(first_module) : "torch.nn.modules.linear.Linear";
  absl::StatusOr<torch::jit::Module> module =
      conv1d ? MakeConv1DModule(gm.module(), merged.weight, merged.bias, type)
             : MakeLinearModule(gm.module(), merged.weight, merged.bias);
  RETURN_IF_ERROR(module.status());
  const std::string hint = absl::StrCat(absl::StrJoin(names, "_"), "_merged");
  ASSIGN_OR_RETURN(
      std::string path,
      AddSubmodule(gm, SplitParentPath(first->target()).first, hint, *module));

  ir::Node* input = first->args()[0].node();
  ir::Node* merged_node;
  ir::Node* split;
  {
    ir::Graph::InsertPointGuard guard(graph, first);
    ASSIGN_OR_RETURN(
        merged_node,
        graph.CallModule(path, {ir::Argument::Ref(input)}, {}, hint));
    std::vector<ir::Argument> size_args;
    for (int64_t s : sizes) size_args.push_back(ir::Argument::Int(s));
    ASSIGN_OR_RETURN(
        split, graph.CallFunction("aten::split_with_sizes",
                                  {ir::Argument::Ref(merged_node),
                                   ir::Argument::List(std::move(size_args)),
                                   ir::Argument::Int(-1)}));
  }
  merged_node->set_scope(ReplaceInnermost(first->scope(), path, type));
  merged_node->meta().outputs = MergedMeta(group);
  merged_node->meta().source = first->meta().source;
  MarkTransformed(merged_node, MergeLinears::kName, app, {{kRole, kMerged}});
  split->set_scope(ParentScope(first->scope()));
  for (const Candidate& c : group) {
    if (c.node->meta().outputs.size() == 1) {
      split->meta().outputs.push_back(c.node->meta().outputs[0]);
    }
  }
  if (split->meta().outputs.size() != group.size()) split->meta().outputs = {};
  MarkTransformed(split, MergeLinears::kName, app, {{kRole, kSplit}});

  for (size_t i = 0; i < group.size(); ++i) {
    ir::Node* old = group[i].node;
    const std::string name = old->name();
    ir::Node* item;
    {
      ir::Graph::InsertPointGuard guard(graph, old);
      ASSIGN_OR_RETURN(
          item, graph.CallFunction("getitem",
                                   {ir::Argument::Ref(split),
                                    ir::Argument::Int(static_cast<int64_t>(i))},
                                   {}, name));
    }
    item->set_scope(ParentScope(old->scope()));
    item->meta().outputs = old->meta().outputs;
    item->meta().source = old->meta().source;
    MarkTransformed(item, MergeLinears::kName, app,
                    {{kRole, kOutput},
                     {kIndex, absl::StrCat(i)},
                     {kOriginal, SnapshotNode(*old)}});
    RETURN_IF_ERROR(graph.ReplaceAllUsesWith(old, item));
    RETURN_IF_ERROR(graph.Erase(old));
    graph.Rename(item, name);
  }
  return absl::OkStatus();
}

std::string Role(const ir::TransformMark& m) {
  auto it = m.data.find(kRole);
  return it == m.data.end() ? "" : it->second;
}

absl::Status Unmerge(runtime::GraphModule& gm, ir::Node* merged, int64_t app) {
  ir::Graph& graph = gm.graph();
  const ir::TransformMark* mark = FindMark(*merged, MergeLinears::kName, app);
  RETURN_IF_ERROR(CheckLastMark(*merged, *mark));
  if (merged->users().size() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot undo merge-linears: ", merged->Describe(),
                     " must be read only by its split"));
  }
  ir::Node* split = merged->users()[0];
  const ir::TransformMark* split_mark =
      FindMark(*split, MergeLinears::kName, app);
  if (split_mark == nullptr || Role(*split_mark) != kSplit) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot undo merge-linears: ", split->Describe(),
                     " is not the split it created"));
  }
  RETURN_IF_ERROR(CheckLastMark(*split, *split_mark));
  // Copy: restoring edits split's users.
  const std::vector<ir::Node*> items = split->users();
  for (ir::Node* item : items) {
    const ir::TransformMark* m = FindMark(*item, MergeLinears::kName, app);
    if (m == nullptr || Role(*m) != kOutput || !m->data.count(kOriginal)) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot undo merge-linears: ", item->Describe(),
                       " reads the split but is not one of its outputs"));
    }
    RETURN_IF_ERROR(CheckLastMark(*item, *m));
  }
  for (ir::Node* item : items) {
    const std::string snapshot =
        FindMark(*item, MergeLinears::kName, app)->data.at(kOriginal);
    RETURN_IF_ERROR(ReplaceWithSnapshot(graph, item, snapshot).status());
  }
  const std::string path = merged->target();
  RETURN_IF_ERROR(graph.Erase(split));
  RETURN_IF_ERROR(graph.Erase(merged));
  return RemoveAttribute(gm, path);
}

}  // namespace

absl::StatusOr<bool> MergeLinears::Run(runtime::GraphModule& gm) {
  ir::Graph& graph = gm.graph();
  const absl::flat_hash_map<std::string, int> calls = CallSiteCounts(graph);
  std::map<GroupKey, size_t> index;
  std::vector<std::vector<Candidate>> groups;
  for (ir::Node* n : graph.nodes()) {
    if (n->op() != ir::OpKind::kCallModule || n->args().size() != 1 ||
        !n->args()[0].is_node() || !n->kwargs().empty() ||
        calls.at(n->target()) != 1) {
      continue;
    }
    absl::StatusOr<torch::jit::Module> m = gm.GetSubmodule(n->target());
    if (!m.ok()) continue;  // CheckModuleReferences reports these.
    const LeafKind kind = ClassifyLeaf(*m);
    if (kind != LeafKind::kLinear && kind != LeafKind::kConv1D) continue;
    absl::StatusOr<LinearLeaf> leaf = ReadLinear(*m);
    if (!leaf.ok()) continue;  // Not a well-formed layer: leave it alone.
    GroupKey key{n->args()[0].node(), leaf->conv1d, leaf->in_features,
                 leaf->weight.scalar_type(), leaf->weight.device().str()};
    auto [it, inserted] = index.emplace(key, groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back({n, *std::move(leaf)});
  }
  bool changed = false;
  const int64_t app = NextApplicationId(graph);
  for (const std::vector<Candidate>& group : groups) {
    if (group.size() < 2) continue;
    RETURN_IF_ERROR(runtime::TorchCall(
        "merge-linears", [&] { return MergeGroup(gm, group, app); }));
    changed = true;
  }
  return changed;
}

absl::StatusOr<bool> MergeLinears::Reverse(runtime::GraphModule& gm) {
  std::optional<int64_t> app = LatestApplicationId(gm.graph(), kName);
  if (!app) return false;
  RETURN_IF_ERROR(CheckIsLatestApplication(gm.graph(), kName, *app));
  std::vector<ir::Node*> merged;
  for (ir::Node* n : GetTransformedNodes(gm.graph(), kName, *app)) {
    if (Role(*FindMark(*n, kName, *app)) == kMerged) merged.push_back(n);
  }
  for (ir::Node* n : merged) {
    RETURN_IF_ERROR(runtime::TorchCall("undoing merge-linears",
                                       [&] { return Unmerge(gm, n, *app); }));
  }
  return true;
}

}  // namespace tracecut::transforms
