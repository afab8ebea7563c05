#include "transforms/node_snapshot.h"

#include <memory>

#include "gtest/gtest.h"
#include "ir/text.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

std::unique_ptr<ir::Graph> Parse(absl::string_view text) {
  auto g = ir::ParseGraph(text);
  EXPECT_OK(g);
  return std::move(g).value();
}

constexpr char kGraph[] = R"(graph {
  %x = placeholder[x]()
  %w = get_attr[w]()
  %add = call_function[aten::add.Tensor](%x, %w, alpha=2) scope[:"Root", blk:"Block"] meta{out=[tensor([2, 3], float32, "cpu")], src="m.py":3:"x + w", transform=[mark("p", {"app": "1"})], extra={note: [1, 2.5, "s"]}}
  %relu = call_function[aten::relu](%add)
  %output = output[output](%relu)
})";

TEST(NodeSnapshotTest, ReplaceRestoresTheNodeExactly) {
  std::unique_ptr<ir::Graph> original = Parse(kGraph);
  std::unique_ptr<ir::Graph> g = original->Clone();
  ir::Node* add = g->FindNode("add");
  const std::string snapshot = SnapshotNode(*add);
  EXPECT_EQ(SnapshotName(snapshot).value(), "add");
  // Rewrite it in place, as a pass would.
  ASSERT_OK(add->SetArgs({ir::Argument::Ref(g->FindNode("x"))}));
  add->set_target("aten::neg");
  add->set_scope(ir::Scope());
  add->meta() = ir::NodeMeta();
  auto restored = ReplaceWithSnapshot(*g, add, snapshot);
  ASSERT_OK(restored);
  EXPECT_EQ((*restored)->name(), "add");
  EXPECT_TRUE(ir::StructurallyEqual(*g, *original)) << ir::PrintGraph(*g);
}

TEST(NodeSnapshotTest, RestoresAnErasedNodeBeforeAGivenNode) {
  std::unique_ptr<ir::Graph> original = Parse(kGraph);
  std::unique_ptr<ir::Graph> g = original->Clone();
  ir::Node* add = g->FindNode("add");
  ir::Node* relu = g->FindNode("relu");
  const std::string snapshot = SnapshotNode(*add);
  ASSERT_OK(relu->SetArgs({ir::Argument::Ref(g->FindNode("x"))}));
  ASSERT_OK(g->Erase(add));
  auto node = RestoreNode(*g, snapshot, relu);
  ASSERT_OK(node);
  ASSERT_OK(relu->SetArgs({ir::Argument::Ref(*node)}));
  EXPECT_TRUE(ir::StructurallyEqual(*g, *original)) << ir::PrintGraph(*g);
}

TEST(NodeSnapshotTest, FailsWhenAnOperandIsGone) {
  std::unique_ptr<ir::Graph> g = Parse(kGraph);
  const std::string snapshot = SnapshotNode(*g->FindNode("add"));
  ir::Graph other;
  ASSERT_OK(other.Placeholder("x"));
  auto node = RestoreNode(other, snapshot, nullptr);
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().message().find("%w"), std::string::npos)
      << node.status();
  EXPECT_FALSE(RestoreNode(other, "garbage", nullptr).ok());
}

}  // namespace
}  // namespace tracecut::transforms
