#include "transforms/pair_fusion.h"

#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transforms/module_util.h"
#include "transforms/node_snapshot.h"
#include "transforms/transformation.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

constexpr char kFirst[] = "first";
constexpr char kSecond[] = "second";
constexpr char kAnchor[] = "anchor";
constexpr char kErasedNext[] = "erased_next";
constexpr char kModule[] = "module";

}  // namespace

ir::Scope ReplaceInnermost(const ir::Scope& scope, const std::string& path,
                           const std::string& type) {
  std::vector<ir::ScopeEntry> stack = scope.stack();
  if (!stack.empty()) stack.pop_back();
  stack.push_back({path, type});
  return ir::Scope(std::move(stack));
}

ir::Scope ParentScope(const ir::Scope& scope) {
  std::vector<ir::ScopeEntry> stack = scope.stack();
  if (!stack.empty()) stack.pop_back();
  return ir::Scope(std::move(stack));
}

absl::StatusOr<ir::Node*> FusePair(ir::Graph& graph, const PairFusion& fusion,
                                   absl::string_view pass, int64_t app) {
  ir::Node* first = fusion.first;
  ir::Node* second = fusion.second;
  if (first->users().size() != 1 || first->users()[0] != second) {
    return absl::FailedPreconditionError(
        absl::StrCat("FusePair: ", first->Describe(), " must feed only ",
                     second->Describe()));
  }
  ir::Node* anchor = fusion.anchor_is_first ? first : second;
  ir::Node* erased = fusion.anchor_is_first ? second : first;
  ir::Node* erased_next = erased->next();
  std::map<std::string, std::string> data = {
      {kFirst, SnapshotNode(*first)},
      {kSecond, SnapshotNode(*second)},
      {kAnchor, fusion.anchor_is_first ? kFirst : kSecond},
      {kErasedNext, erased_next == nullptr ? "" : erased_next->name()},
      {kModule, fusion.module_path},
  };
  const std::string anchor_name = anchor->name();
  ir::Node* fused;
  {
    ir::Graph::InsertPointGuard guard(graph, anchor);
    ASSIGN_OR_RETURN(fused, graph.CallModule(fusion.module_path, fusion.args,
                                             {}, anchor_name));
  }
  fused->set_scope(ReplaceInnermost(anchor->scope(), fusion.module_path,
                                    fusion.module_type));
  fused->meta().outputs = second->meta().outputs;
  fused->meta().source = anchor->meta().source;
  MarkTransformed(fused, pass, app, std::move(data));
  RETURN_IF_ERROR(graph.ReplaceAllUsesWith(second, fused));
  RETURN_IF_ERROR(graph.Erase(second));
  RETURN_IF_ERROR(graph.Erase(first));
  graph.Rename(fused, anchor_name);
  return fused;
}

absl::Status UnfusePair(runtime::GraphModule& gm, ir::Node* fused,
                        absl::string_view pass, int64_t app) {
  ir::Graph& graph = gm.graph();
  const ir::TransformMark* mark = FindMark(*fused, pass, app);
  if (mark == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(fused->Describe(), " carries no ", pass, " mark"));
  }
  RETURN_IF_ERROR(CheckLastMark(*fused, *mark));
  const std::map<std::string, std::string> data = mark->data;
  for (const char* key : {kFirst, kSecond, kAnchor, kErasedNext, kModule}) {
    if (data.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          fused->Describe(), ": ", pass, " mark lacks '", key, "'"));
    }
  }
  const bool anchor_is_first = data.at(kAnchor) == kFirst;
  ir::Node* erased_next = nullptr;
  if (!data.at(kErasedNext).empty()) {
    erased_next = graph.FindNode(data.at(kErasedNext));
    if (erased_next == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot undo ", pass, " on ", fused->Describe(), ": node %",
          data.at(kErasedNext), " is gone (undo later passes first)"));
    }
  }
  // Restore `first` before `second`: second reads first by name.
  ir::Node* restored[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    const bool is_anchor = (i == 0) == anchor_is_first;
    const std::string& snap = data.at(i == 0 ? kFirst : kSecond);
    if (is_anchor) {
      // In the fused node's place; it takes the name once the fused node
      // gives it up.
      ASSIGN_OR_RETURN(ir::Node * n, RestoreNode(graph, snap, fused));
      ASSIGN_OR_RETURN(std::string name, SnapshotName(snap));
      graph.Rename(fused, absl::StrCat(name, "_fused_tmp"));
      graph.Rename(n, name);
      restored[i] = n;
    } else {
      // `erased_next` may name the fused node itself (when the erased node
      // came right before the anchor): then it goes right before it.
      ir::Node* before = erased_next;
      if (before != nullptr && before->graph() != &graph) before = nullptr;
      ASSIGN_OR_RETURN(restored[i], RestoreNode(graph, snap, before));
    }
  }
  RETURN_IF_ERROR(graph.ReplaceAllUsesWith(fused, restored[1]));
  RETURN_IF_ERROR(graph.Erase(fused));
  return RemoveAttribute(gm, data.at(kModule));
}

}  // namespace tracecut::transforms
