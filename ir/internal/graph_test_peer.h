#ifndef TRACECUT_IR_INTERNAL_GRAPH_TEST_PEER_H_
#define TRACECUT_IR_INTERNAL_GRAPH_TEST_PEER_H_

// Test-only access to Graph and Node internals. Graph's mutators never break
// an invariant, so verifier tests (and tests of code that must cope with a
// broken graph) use this peer to break them on purpose:
//
//   Node* relu = ...;
//   internal::GraphTestPeer::users(x).clear();  // x no longer knows relu.
//   EXPECT_FALSE(Verify(g).ok());
//
// Every function bypasses all checks and leaves the rest of the graph as it
// is; nothing here is safe to use outside tests.

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::ir::internal {

class GraphTestPeer {
 public:
  // The node's use list, writable.
  static std::vector<Node*>& users(Node* node) { return node->users_; }

  // Replaces operands without checking them or updating any use list.
  static void SetArgsUnchecked(Node* node, std::vector<Argument> args) {
    node->args_ = std::move(args);
  }
  static void SetKwargsUnchecked(Node* node, Kwargs kwargs) {
    node->kwargs_ = std::move(kwargs);
  }

  // Changes the node's name without touching the graph's name index.
  static void SetNameUnindexed(Node* node, std::string name) {
    node->name_ = std::move(name);
  }
  // Changes the name and the index entry, with no validity or uniqueness
  // check (to make two nodes share a name, or a name that is no identifier).
  static void SetNameIndexed(Node* node, std::string name) {
    node->graph_->by_name_.erase(node->name_);
    node->name_ = std::move(name);
    node->graph_->by_name_[node->name_] = node;
  }
  // Adds, replaces or removes (node == nullptr) a name index entry.
  static void SetIndexEntry(Graph& graph, absl::string_view name, Node* node) {
    if (node == nullptr) {
      graph.by_name_.erase(name);
    } else {
      graph.by_name_[std::string(name)] = node;
    }
  }

  static int64_t order_key(const Node* node) { return node->order_; }
  static void SetOrderKey(Node* node, int64_t key) { node->order_ = key; }

  static void SetOp(Node* node, OpKind op) { node->op_ = op; }
  static void SetGraph(Node* node, Graph* graph) { node->graph_ = graph; }

  // Moves `node` right before `before` (nullptr: the end) with no dependency
  // check, then renumbers so that only the topological order is broken, not
  // the order keys.
  static void MoveUnchecked(Graph& graph, Node* node, Node* before) {
    graph.Unlink(node);
    graph.Link(node, before);
    graph.Renumber();
  }
};

}  // namespace tracecut::ir::internal

#endif  // TRACECUT_IR_INTERNAL_GRAPH_TEST_PEER_H_
