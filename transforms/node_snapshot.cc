#include "transforms/node_snapshot.h"

#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ir/text.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

// The snapshotted node of a parsed snapshot: its only non-placeholder.
absl::StatusOr<const ir::Node*> SnapshotRoot(const ir::Graph& g) {
  const ir::Node* root = nullptr;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() == ir::OpKind::kPlaceholder && !n->users().empty()) continue;
    if (root != nullptr) {
      return absl::InvalidArgumentError("snapshot holds more than one node");
    }
    root = n;
  }
  if (root == nullptr) {
    return absl::InvalidArgumentError("snapshot holds no node");
  }
  return root;
}

absl::StatusOr<std::unique_ptr<ir::Graph>> ParseSnapshot(
    absl::string_view snapshot) {
  ir::ParseOptions options;
  options.verify = false;  // No output node, possibly a lone placeholder.
  auto g = ir::ParseGraph(snapshot, options);
  if (!g.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed node snapshot: ", g.status().message()));
  }
  return std::move(g).value();
}

}  // namespace

std::string SnapshotNode(const ir::Node& node) {
  ir::Graph g;
  absl::flat_hash_map<ir::Node*, ir::Node*> map;
  for (ir::Node* in : node.inputs()) {
    // Placeholders keep the names of the nodes they stand for; names are
    // unique in the original graph, so they are here too.
    ir::Node* p = g.Placeholder(in->name()).value();
    map[in] = p;
  }
  auto remap = [&](ir::Node* n) { return map.at(n); };
  std::vector<ir::Argument> args;
  for (const ir::Argument& a : node.args()) args.push_back(a.MapNodes(remap));
  ir::Kwargs kwargs;
  for (const auto& [k, v] : node.kwargs()) {
    kwargs.emplace_back(k, v.MapNodes(remap));
  }
  ir::Node* copy = g.AddNode(node.op(), node.target(), std::move(args),
                             std::move(kwargs), node.name())
                       .value();
  g.Rename(copy, node.name());
  copy->set_scope(node.scope());
  copy->meta() = node.meta();
  return ir::PrintGraph(g);
}

absl::StatusOr<std::string> SnapshotName(absl::string_view snapshot) {
  ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> g, ParseSnapshot(snapshot));
  ASSIGN_OR_RETURN(const ir::Node* root, SnapshotRoot(*g));
  return root->name();
}

absl::StatusOr<ir::Node*> RestoreNode(ir::Graph& graph,
                                      absl::string_view snapshot,
                                      ir::Node* before) {
  ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> g, ParseSnapshot(snapshot));
  ASSIGN_OR_RETURN(const ir::Node* root, SnapshotRoot(*g));
  absl::Status missing = absl::OkStatus();
  auto resolve = [&](ir::Node* p) -> ir::Node* {
    ir::Node* n = graph.FindNode(p->name());
    if (n == nullptr && missing.ok()) {
      missing = absl::FailedPreconditionError(
          absl::StrCat("cannot restore %", root->name(), ": it reads %",
                       p->name(), ", which is no longer in the graph"));
    }
    return n;
  };
  std::vector<ir::Argument> args;
  for (const ir::Argument& a : root->args())
    args.push_back(a.MapNodes(resolve));
  ir::Kwargs kwargs;
  for (const auto& [k, v] : root->kwargs()) {
    kwargs.emplace_back(k, v.MapNodes(resolve));
  }
  RETURN_IF_ERROR(missing);
  ir::Graph::InsertPointGuard guard(graph, before);
  ASSIGN_OR_RETURN(ir::Node * node,
                   graph.AddNode(root->op(), root->target(), std::move(args),
                                 std::move(kwargs), root->name()));
  node->set_scope(root->scope());
  node->meta() = root->meta();
  return node;
}

absl::StatusOr<ir::Node*> ReplaceWithSnapshot(ir::Graph& graph,
                                              ir::Node* current,
                                              absl::string_view snapshot) {
  ASSIGN_OR_RETURN(ir::Node * restored, RestoreNode(graph, snapshot, current));
  ASSIGN_OR_RETURN(std::string name, SnapshotName(snapshot));
  RETURN_IF_ERROR(graph.ReplaceAllUsesWith(current, restored));
  RETURN_IF_ERROR(graph.Erase(current));
  graph.Rename(restored, name);
  return restored;
}

}  // namespace tracecut::transforms
