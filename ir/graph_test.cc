#include "ir/graph.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
