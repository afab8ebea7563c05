#include "ir/graph.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/verifier.h"
#include "util/status_macros.h"
#include "util/testing/status_matchers.h"

namespace tracecut::ir {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// x -> relu -> add(relu, x) -> output
struct Small {
  Graph g;
  Node* x;
  Node* relu;
  Node* add;
  Node* out;
  Small() {
    x = *g.Placeholder("x");
    relu = *g.CallFunction("aten::relu", {Argument::Ref(x)});
    add = *g.CallFunction("aten::add.Tensor",
                          {Argument::Ref(relu), Argument::Ref(x)},
                          {{"alpha", Argument::Int(1)}});
    out = *g.Output(Argument::Ref(add));
  }
};

TEST(GraphTest, BuildsWithUsesAndNames) {
  Small s;
  EXPECT_EQ(s.relu->name(), "relu");
  EXPECT_EQ(s.add->name(), "add");
  EXPECT_THAT(s.x->users(), ElementsAre(s.relu, s.add));
  EXPECT_THAT(s.add->inputs(), ElementsAre(s.relu, s.x));
  EXPECT_EQ(s.g.output_node(), s.out);
  EXPECT_EQ(s.g.FindNode("relu"), s.relu);
  EXPECT_TRUE(s.x->IsBefore(s.add));
}

TEST(GraphTest, UniqueNamesAreSanitisedAndSuffixed) {
  Graph g;
  Node* a = *g.GetAttr("layers.0.weight");
  Node* b = *g.GetAttr("layers.0.weight");
  Node* c = *g.GetAttr("x", "layers_0_weight_1");
  EXPECT_EQ(a->name(), "layers_0_weight");
  EXPECT_EQ(b->name(), "layers_0_weight_1");
  EXPECT_EQ(c->name(), "layers_0_weight_2");
  EXPECT_EQ((*g.Placeholder("3d"))->name(), "_3d");
}

TEST(GraphTest, RejectsOperandAfterNode) {
  Small s;
  absl::Status st = s.relu->SetArgs({Argument::Ref(s.add)});
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("does not come before"));
  // Nothing changed.
  EXPECT_THAT(s.relu->inputs(), ElementsAre(s.x));
}

TEST(GraphTest, InsertBeforeKeepsOrder) {
  Small s;
  Graph::InsertPointGuard guard(s.g, s.add);
  Node* neg = *s.g.CallFunction("aten::neg", {Argument::Ref(s.relu)});
  EXPECT_TRUE(s.relu->IsBefore(neg));
  EXPECT_TRUE(neg->IsBefore(s.add));
  EXPECT_EQ(neg->next(), s.add);
  ASSERT_OK(s.g.ReplaceAllUsesWith(s.relu, neg));
  EXPECT_THAT(s.add->inputs(), ElementsAre(neg, s.x));
  EXPECT_THAT(s.relu->users(), ElementsAre(neg));
}

TEST(GraphTest, ReplaceAllUsesWithRejectsLaterReplacement) {
  Small s;
  // relu reads x but comes before add.
  absl::Status st = s.g.ReplaceAllUsesWith(s.x, s.add);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(s.relu->inputs(), ElementsAre(s.x));
  EXPECT_THAT(s.add->inputs(), ElementsAre(s.relu, s.x));
}

TEST(GraphTest, EraseNeedsNoUsers) {
  Small s;
  EXPECT_FALSE(s.g.Erase(s.relu).ok());
  ASSERT_OK(s.g.Erase(s.out));
  ASSERT_OK(s.g.Erase(s.add));
  EXPECT_THAT(s.x->users(), ElementsAre(s.relu));
  EXPECT_EQ(s.g.size(), 2u);
  EXPECT_EQ(s.g.FindNode("add"), nullptr);
}

TEST(GraphTest, ManyInsertsAtTheSamePointRenumber) {
  Small s;
  Graph::InsertPointGuard guard(s.g, s.add);
  Node* prev = s.relu;
  for (int i = 0; i < 100; ++i) {
    prev = *s.g.CallFunction("aten::neg", {Argument::Ref(prev)});
  }
  for (Node* n = s.g.first(); n->next() != nullptr; n = n->next()) {
    EXPECT_TRUE(n->IsBefore(n->next()));
  }
}

TEST(GraphTest, MoveBeforeChecksDependencies) {
  Small s;
  EXPECT_FALSE(s.g.MoveBefore(s.relu, s.x).ok());
  EXPECT_FALSE(s.g.MoveBefore(s.relu, nullptr).ok());
  Node* c = *s.g.GetAttr("c");  // After the output.
  ASSERT_OK(s.g.MoveBefore(c, s.relu));
  EXPECT_EQ(c->prev(), s.x);
}

TEST(GraphTest, CloneIsDeepAndEqual) {
  Small s;
  s.relu->set_scope(Scope({{"", "M"}, {"act", "torch.nn.ReLU"}}));
  s.relu->meta().outputs.push_back({{2, 3}, "float32", "cpu"});
  s.relu->meta().transforms.push_back({"p", {{"k", "v"}}});
  s.g.meta().assumptions.push_back("x.dim() == 2");
  absl::flat_hash_map<const Node*, Node*> map;
  std::unique_ptr<Graph> c = s.g.Clone(&map);
  EXPECT_TRUE(StructurallyEqual(s.g, *c));
  EXPECT_NE(map.at(s.relu), s.relu);
  EXPECT_EQ(map.at(s.relu)->graph(), c.get());
  EXPECT_THAT(map.at(s.x)->users(), ElementsAre(map.at(s.relu), map.at(s.add)));
  map.at(s.relu)->meta().outputs.clear();
  EXPECT_FALSE(StructurallyEqual(s.g, *c));
}

// Meta is shared copy-on-write: a write through meta() reaches only the
// node written to, whichever of the sharing nodes it is.
TEST(GraphTest, SharedMetaIsCopiedOnWrite) {
  Small s;
  s.relu->meta().outputs.push_back({{2, 3}, "float32", "cpu"});
  s.relu->meta().source = SourceLocation{"m.py", 7, "y = relu(x)"};
  Graph other;
  Node* copy = *other.Placeholder("copy");
  copy->ShareMetaOf(*s.relu);
  const Node* shared = copy;
  EXPECT_EQ(&shared->meta(), &std::as_const(*s.relu).meta());
  copy->meta().outputs[0].shape = {4};
  EXPECT_THAT(s.relu->meta().outputs[0].shape, ElementsAre(2, 3));
  EXPECT_THAT(copy->meta().outputs[0].shape, ElementsAre(4));
  EXPECT_EQ(copy->meta().source->line, 7);

  // The other way round, and with a node whose meta is empty.
  copy->ShareMetaOf(*s.relu);
  s.relu->meta().source->line = 8;
  EXPECT_EQ(copy->meta().source->line, 7);
  copy->ShareMetaOf(*s.x);
  EXPECT_TRUE(copy->meta() == NodeMeta());
  copy->meta().transforms.push_back({"p", {}});
  EXPECT_TRUE(std::as_const(*s.x).meta() == NodeMeta());

  // A clone shares until written, then keeps its own.
  std::unique_ptr<Graph> c = s.g.Clone();
  s.relu->meta().outputs.clear();
  EXPECT_THAT(c->FindNode(s.relu->name())->meta().outputs,
              ::testing::SizeIs(1));
}

// Nodes live in slabs: many of them (past the largest slab) keep their
// addresses, an erased node's slot is reused, and everything is freed
// (ASan checks) whether erased or not.
TEST(GraphTest, ManyNodesAndErasedSlotsReused) {
  Graph g;
  Node* x = *g.Placeholder("x");
  std::vector<Node*> nodes;
  Node* prev = x;
  for (int i = 0; i < 10000; ++i) {
    prev = *g.CallFunction("aten::relu", {Argument::Ref(prev)}, {},
                           absl::StrCat("r", i));
    nodes.push_back(prev);
  }
  Node* out = *g.Output(Argument::Ref(prev));
  g.SetInsertBefore(out);
  EXPECT_EQ(g.size(), 10002u);
  int k = 0;
  for (Node* n : g.nodes()) {
    if (n->op() != OpKind::kCallFunction) continue;
    EXPECT_EQ(n, nodes[k++]);
  }
  EXPECT_EQ(nodes[5000]->args()[0].node(), nodes[4999]);
  Node* dead = *g.CallFunction("aten::neg", {Argument::Ref(x)}, {}, "dead");
  ASSERT_OK(g.Erase(dead));
  Node* again = *g.CallFunction("aten::neg", {Argument::Ref(x)}, {}, "again");
  EXPECT_EQ(again, dead);
  EXPECT_EQ(g.FindNode("dead"), nullptr);
  EXPECT_EQ(g.FindNode("again"), again);
  EXPECT_THAT(x->users(), ElementsAre(nodes[0], again));
  EXPECT_OK(Verify(g));
}

TEST(ScopeTest, DemanglesAndShortens) {
  EXPECT_EQ(Scope::DemangleType(
                "__torch__.torch.nn.modules.container.___torch_mangle_58."
                "Sequential"),
            "torch.nn.modules.container.Sequential");
  EXPECT_EQ(Scope::ShortType("a.b.LlamaDecoderLayer"), "LlamaDecoderLayer");
  Scope s = Scope().Push({"", "M"}).Push({"model.layers.0", "x.Layer"});
  EXPECT_EQ(s.path(), "model.layers.0");
  EXPECT_EQ(s.short_type(), "Layer");
  EXPECT_TRUE(s.Contains(""));
  EXPECT_FALSE(s.Contains("model"));
}

TEST(ScopeTest, SharedCopiesStayIndependent) {
  Scope a = Scope().Push({"", "M"});
  Scope b = a;
  b = b.Push({"m", "x.L"});
  EXPECT_EQ(a.depth(), 1u);
  EXPECT_EQ(b.depth(), 2u);
  EXPECT_EQ(a, Scope(std::vector<ScopeEntry>{{"", "M"}}));
  EXPECT_NE(a, b);
  EXPECT_EQ(Scope(), Scope(std::vector<ScopeEntry>{}));
  EXPECT_TRUE(Scope(std::vector<ScopeEntry>{}).empty());
  EXPECT_EQ(Scope().path(), "");
}

// Past a few operands, duplicates are found by a hash set instead of a scan.
TEST(GraphTest, ManyOperandsGiveDistinctInputsInOrder) {
  Graph g;
  std::vector<Node*> xs;
  std::vector<Argument> refs;
  for (int i = 0; i < 40; ++i) {
    xs.push_back(*g.Placeholder("x" + std::to_string(i)));
    refs.push_back(Argument::Ref(xs.back()));
  }
  for (int i = 39; i >= 0; --i) refs.push_back(Argument::Ref(xs[i]));
  Node* cat = *g.CallFunction("aten::cat", {Argument::List(refs)});
  EXPECT_EQ(cat->inputs(), xs);
  for (Node* x : xs) EXPECT_THAT(x->users(), ElementsAre(cat));
}

TEST(ArgumentTest, EqualityAndMapping) {
  Small s;
  Argument a = Argument::List({Argument::Ref(s.x), Argument::Double(0.5),
                               Argument::Tuple({Argument::None()})});
  EXPECT_EQ(a, a);
  EXPECT_NE(a, Argument::Tuple(a.elements()));
  Argument m = a.MapNodes([&](Node*) { return s.relu; });
  EXPECT_EQ(m.elements()[0].node(), s.relu);
  EXPECT_FALSE(a.IsConstant());
  EXPECT_TRUE(Argument::Double(std::nan("")) == Argument::Double(std::nan("")));
  EXPECT_FALSE(Argument::Double(0.0) == Argument::Double(-0.0));
}

}  // namespace
}  // namespace tracecut::ir
