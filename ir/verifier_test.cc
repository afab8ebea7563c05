#include "ir/verifier.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "ir/internal/graph_test_peer.h"
#include "ir/testing/test_graphs.h"
#include "util/testing/status_matchers.h"

namespace tracecut::ir {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Peer = internal::GraphTestPeer;

// x -> relu -> add(relu, x, alpha=1) -> output, relu scoped so that
// Describe() shows a module path.
struct Small {
  Graph g;
  Node* x;
  Node* w;
  Node* relu;
  Node* add;
  Node* out;
  Small() {
    x = *g.Placeholder("x");
    w = *g.GetAttr("fc.weight", "w");
    relu = *g.CallFunction("aten::relu", {Argument::Ref(x)});
    relu->set_scope(Scope({{"", "M"}, {"act", "torch.nn.ReLU"}}));
    add = *g.CallFunction("aten::add.Tensor",
                          {Argument::Ref(relu), Argument::Ref(x)},
                          {{"alpha", Argument::Int(1)}});
    out = *g.Output(Argument::Ref(add));
  }
};

// Verification fails, blames `culprit` and says `what`.
void ExpectFailure(const Graph& g, const Node* culprit,
                   const std::string& what) {
  const Node* blamed = reinterpret_cast<const Node*>(1);
  absl::Status s = Verify(g, &blamed);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr(what));
  EXPECT_EQ(blamed, culprit);
  if (culprit != nullptr) {
    EXPECT_THAT(std::string(s.message()),
                StartsWith(culprit->Describe() + ": "));
  } else {
    EXPECT_THAT(std::string(s.message()), StartsWith("graph: "));
  }
}

TEST(VerifierTest, AcceptsWellFormedGraphs) {
  Small s;
  const Node* culprit = s.x;
  EXPECT_OK(Verify(s.g, &culprit));
  EXPECT_EQ(culprit, nullptr);
  for (const test_graphs::NamedGraph& c : test_graphs::VariedGraphs()) {
    EXPECT_OK(Verify(*c.graph)) << c.name;
  }
}

TEST(VerifierTest, MessageNamesTheNodeWithScope) {
  Small s;
  Peer::users(s.x).clear();
  absl::Status st = Verify(s.g);
  EXPECT_THAT(std::string(st.message()),
              StartsWith("%x (placeholder x): %relu (call_function "
                         "aten::relu in act) reads it"));
}

// ------------------------------------------------------------- names

TEST(VerifierTest, NameMustBeAnIdentifier) {
  Small s;
  Peer::SetNameIndexed(s.relu, "1relu");
  ExpectFailure(s.g, s.relu, "is not an identifier");
}

TEST(VerifierTest, NamesMustBeUnique) {
  Small s;
  Peer::SetNameUnindexed(s.relu, "x");
  ExpectFailure(s.g, s.relu, "name is also used by %x (placeholder x)");
}

TEST(VerifierTest, NameIndexMustMapEveryNode) {
  Small s;
  Peer::SetIndexEntry(s.g, "relu", nullptr);
  ExpectFailure(s.g, s.relu, "name index does not map its name to it");
}

TEST(VerifierTest, NameIndexMustFollowRenames) {
  Small s;
  Peer::SetNameUnindexed(s.relu, "act");
  // The index still maps "relu", and nothing maps "act".
  ExpectFailure(s.g, s.relu, "name index does not map its name to it");
}

TEST(VerifierTest, NameIndexMustHaveNoStaleEntries) {
  Small s;
  Peer::SetIndexEntry(s.g, "ghost", s.relu);
  ExpectFailure(s.g, s.relu, "stale name index entry \"ghost\"");
}

TEST(VerifierTest, NameIndexMustPointIntoTheGraph) {
  Small s;
  Small other;
  Peer::SetIndexEntry(s.g, "ghost", other.relu);
  ExpectFailure(s.g, nullptr,
                "name index entry \"ghost\" points at a node not in the "
                "graph");
}

// ------------------------------------------------------ membership, order

TEST(VerifierTest, NodeMustPointAtItsGraph) {
  Small s;
  Graph other;
  Peer::SetGraph(s.relu, &other);
  ExpectFailure(s.g, s.relu, "graph pointer");
}

TEST(VerifierTest, OrderKeysMustIncrease) {
  Small s;
  Peer::SetOrderKey(s.relu, Peer::order_key(s.w));
  ExpectFailure(s.g, s.relu, "order key");
}

// ------------------------------------------------------------- operands

TEST(VerifierTest, OperandMustComeBeforeItsUser) {
  Small s;
  Peer::MoveUnchecked(s.g, s.add, s.relu);  // add now precedes relu.
  ExpectFailure(s.g, s.add,
                "argument 0 references %relu (call_function aten::relu in "
                "act), which does not come before it");
}

TEST(VerifierTest, OperandMustNotBeTheNodeItself) {
  Small s;
  Peer::SetArgsUnchecked(s.relu, {Argument::Ref(s.relu)});
  ExpectFailure(s.g, s.relu, "does not come before it");
}

TEST(VerifierTest, OperandMustBeInTheSameGraph) {
  Small s;
  Small other;
  Peer::SetKwargsUnchecked(s.add, {{"alpha", Argument::Ref(other.x)}});
  ExpectFailure(s.g, s.add,
                "kwarg alpha references a node that is not in this graph");
}

TEST(VerifierTest, OperandMustNotBeNull) {
  Small s;
  Peer::SetArgsUnchecked(
      s.relu, {Argument::List({Argument::Int(1), Argument::Ref(nullptr)})});
  ExpectFailure(s.g, s.relu, "argument 0 is a null node reference");
}

TEST(VerifierTest, KwargNamesMustBeIdentifiers) {
  Small s;
  Peer::SetKwargsUnchecked(s.add, {{"not ok", Argument::Int(1)}});
  ExpectFailure(s.g, s.add, "kwarg name \"not ok\" is not an identifier");
}

TEST(VerifierTest, KwargNamesMustBeUnique) {
  Small s;
  ASSERT_OK(s.add->SetKwargs(
      {{"alpha", Argument::Int(1)}, {"alpha", Argument::Int(2)}}));
  ExpectFailure(s.g, s.add, "kwarg alpha is given twice");
}

// ---------------------------------------------------------------- users

TEST(VerifierTest, UsersMustIncludeEveryReader) {
  Small s;
  Peer::users(s.x) = {s.add};
  ExpectFailure(s.g, s.x,
                "%relu (call_function aten::relu in act) reads it but is "
                "missing from its users list");
}

TEST(VerifierTest, UsersMustOnlyHoldReaders) {
  Small s;
  Peer::users(s.w).push_back(s.add);
  ExpectFailure(s.g, s.w, "users list holds %add");
  EXPECT_THAT(std::string(Verify(s.g).message()),
              HasSubstr("which does not read it"));
}

TEST(VerifierTest, UsersMustHaveNoDuplicates) {
  Small s;
  Peer::users(s.x).push_back(s.relu);
  ExpectFailure(s.g, s.x, "twice");
}

TEST(VerifierTest, UsersMustBeInTheGraph) {
  Small s;
  Small other;
  Peer::users(s.x).push_back(other.relu);
  ExpectFailure(s.g, s.x, "users list holds a node that is not in this graph");
}

TEST(VerifierTest, ReaderMissingAfterSetArgsBypass) {
  // Operands changed behind the graph's back: the old input keeps a stale
  // user and the new one misses it.
  Small s;
  Peer::SetArgsUnchecked(s.relu, {Argument::Ref(s.w)});
  ExpectFailure(s.g, s.x, "which does not read it");
}

// ------------------------------------------------------------------ ops

TEST(VerifierTest, OpKindMustBeValid) {
  Small s;
  Peer::SetOp(s.relu, static_cast<OpKind>(42));
  ExpectFailure(s.g, s.relu, "invalid op kind 42");
}

TEST(VerifierTest, PlaceholdersMustComeFirst) {
  Small s;
  Graph::InsertPointGuard guard(s.g, s.add);
  Node* late = *s.g.Placeholder("late");
  ExpectFailure(s.g, late,
                "placeholder comes after %w (get_attr fc.weight); "
                "placeholders must come first");
}

TEST(VerifierTest, PlaceholderMustNotReadNodes) {
  Small s;
  Graph::InsertPointGuard guard(s.g, s.w);
  Node* p = *s.g.AddNode(OpKind::kPlaceholder, "p", {Argument::Ref(s.x)});
  ExpectFailure(s.g, p, "placeholder must not read other nodes, but reads %x");
}

TEST(VerifierTest, PlaceholderMayHaveAConstantDefault) {
  Small s;
  Graph::InsertPointGuard guard(s.g, s.w);
  ASSERT_OK(s.g.AddNode(OpKind::kPlaceholder, "p", {Argument::Int(3)}));
  EXPECT_OK(Verify(s.g));
}

TEST(VerifierTest, GetAttrMustNotReadNodes) {
  Small s;
  Graph::InsertPointGuard guard(s.g, s.add);
  Node* a = *s.g.AddNode(OpKind::kGetAttr, "a.b", {Argument::Ref(s.relu)});
  ExpectFailure(s.g, a, "get_attr must not read other nodes, but reads %relu");
}

TEST(VerifierTest, TargetsMustBeWellFormed) {
  struct Case {
    OpKind op;
    std::string target;
  };
  for (const Case& c : std::vector<Case>{
           {OpKind::kGetAttr, ""},
           {OpKind::kGetAttr, "a..b"},
           {OpKind::kGetAttr, ".a"},
           {OpKind::kGetAttr, "."},
           {OpKind::kCallModule, "model.layers.0."},
           {OpKind::kCallModule, "block1..block1-0"},
           {OpKind::kCallModule, ""},
           {OpKind::kCallFunction, "linear"},
           {OpKind::kCallFunction, "aten::"},
           {OpKind::kCallFunction, "::linear"},
           {OpKind::kCallFunction, "aten::add."},
           {OpKind::kCallFunction, "aten::add.Tensor.x"},
           {OpKind::kCallFunction, "aten::1add"},
           {OpKind::kCallFunction, "aten:linear"},
           {OpKind::kCallFunction, ""},
           {OpKind::kCallMethod, ""},
           {OpKind::kCallMethod, "a.b"},
       }) {
    SCOPED_TRACE(std::string(OpKindName(c.op)) + " " + c.target);
    Small s;
    Graph::InsertPointGuard guard(s.g, s.out);
    Node* n = *s.g.AddNode(c.op, c.target, {}, {}, "n");
    ExpectFailure(s.g, n,
                  "malformed " + std::string(OpKindName(c.op)) + " target");
  }
  Small s;
  Node* p = *s.g.AddNode(OpKind::kPlaceholder, "", {}, {}, "p");
  ASSERT_OK(s.g.MoveBefore(p, s.w));
  ExpectFailure(s.g, p, "malformed placeholder target \"\"");
}

TEST(VerifierTest, CheckTargetAcceptsTheConventions) {
  EXPECT_OK(CheckTarget(OpKind::kCallFunction, "aten::linear"));
  EXPECT_OK(CheckTarget(OpKind::kCallFunction, "aten::add.Tensor"));
  EXPECT_OK(CheckTarget(OpKind::kCallFunction, "prim::NumToTensor.Scalar"));
  EXPECT_OK(CheckTarget(OpKind::kCallFunction, "aten::__and__.Tensor"));
  EXPECT_OK(CheckTarget(OpKind::kCallFunction, "getitem"));
  EXPECT_OK(CheckTarget(OpKind::kGetAttr, "model.layers.0.q_proj.weight"));
  EXPECT_OK(CheckTarget(OpKind::kGetAttr, "_tensor_constant0"));
  EXPECT_OK(CheckTarget(OpKind::kCallModule, "model.layers.0.mlp"));
  EXPECT_OK(CheckTarget(OpKind::kCallMethod, "view"));
  EXPECT_OK(CheckTarget(OpKind::kPlaceholder, "3d input"));
  EXPECT_OK(CheckTarget(OpKind::kOutput, "output"));
}

TEST(VerifierTest, ModulePathsAreWhatPyTorchAccepts) {
  // Any non-empty segment without '.': torchvision's RegNet names its blocks
  // "block1-0"; nn.Module.add_module takes leading digits, non-ASCII,
  // spaces, quotes and backslashes too.
  for (const std::string& path : std::vector<std::string>{
           "trunk_output.block1.block1-0.proj.0",
           "0.1",
           "3d",
           "a b.c",
           "bl\xc3\xb6"
           "ck.\xd0\xb1\xd0\xbb\xd0\xbe\xd0\xba",
           "q\"uote.back\\slash",
           "tab\t.new\nline",
           "x:y.*",
       }) {
    SCOPED_TRACE(path);
    EXPECT_OK(CheckTarget(OpKind::kGetAttr, path));
    EXPECT_OK(CheckTarget(OpKind::kCallModule, path));
    Small s;
    Graph::InsertPointGuard guard(s.g, s.out);
    Node* m = *s.g.CallModule(path, {Argument::Ref(s.x)});
    m->set_scope(Scope(
        {{"", "M"}, {path, "torchvision.ops.misc.Conv2dNormActivation"}}));
    EXPECT_TRUE(IsIdentifier(m->name())) << m->name();
    EXPECT_OK(Verify(s.g));
  }
}

TEST(VerifierTest, MalformedModulePathMessage) {
  absl::Status s = CheckTarget(OpKind::kCallModule, "a..b-0");
  EXPECT_EQ(s.message(),
            "malformed call_module target \"a..b-0\": expected a dotted "
            "path of non-empty segments without '.' (any other characters "
            "allowed, as in PyTorch), e.g. \"model.layers.0.mlp\"");
  // Non-ASCII stays readable; control characters are escaped.
  EXPECT_THAT(
      std::string(CheckTarget(OpKind::kGetAttr, "\xc3\xa9.\n.").message()),
      StartsWith("malformed get_attr target \"\xc3\xa9.\\n.\""));
}

TEST(VerifierTest, ScopePathsMustBeRootOrModulePaths) {
  for (const std::string& bad :
       {std::string("a..b"), std::string("."), std::string("block1-0.")}) {
    SCOPED_TRACE(bad);
    Small s;
    s.relu->set_scope(Scope({{"", "M"}, {bad, "T"}}));
    ExpectFailure(s.g, s.relu,
                  "scope entry 1 has a malformed module path \"" + bad + "\"");
  }
  Small s;
  s.relu->set_scope(
      Scope({{"", "M"}, {"block1", "AnyStage"}, {"block1.block1-0", "B"}}));
  EXPECT_OK(Verify(s.g));
}

TEST(VerifierTest, DescribeQuotesAmbiguousPaths) {
  Small s;
  s.relu->set_scope(Scope({{"", "M"}, {"my block.0", "T"}}));
  EXPECT_EQ(s.relu->Describe(),
            "%relu (call_function aten::relu in \"my block.0\")");
  Node* m;
  {
    Graph::InsertPointGuard guard(s.g, s.out);
    m = *s.g.CallModule("a\"b.\xc3\xa9", {Argument::Ref(s.x)});
  }
  EXPECT_EQ(m->Describe(), "%a_b__ (call_module \"a\\\"b.\xc3\xa9\")");
  s.relu->set_scope(Scope({{"", "M"}, {"block1-0", "T"}}));
  EXPECT_EQ(s.relu->Describe(), "%relu (call_function aten::relu in block1-0)");
}

// --------------------------------------------------------------- output

TEST(VerifierTest, GraphNeedsAnOutput) {
  Graph g;
  ExpectFailure(g, nullptr, "graph has no output node");
  ASSERT_OK(g.Placeholder("x"));
  ExpectFailure(g, nullptr, "graph has no output node");
}

TEST(VerifierTest, OnlyOneOutput) {
  Small s;
  Node* second = *s.g.AddNode(OpKind::kOutput, "output", {Argument::None()});
  ExpectFailure(s.g, second, "second output node; the first is %output");
}

TEST(VerifierTest, OutputMustBeLast) {
  Small s;
  Node* late = *s.g.GetAttr("late");
  ExpectFailure(s.g, s.out, "output node is not last; %late (get_attr late)");
  (void)late;
}

TEST(VerifierTest, OutputTakesOnePositionalArgument) {
  Small s;
  ASSERT_OK(s.out->SetArgs({Argument::Ref(s.add), Argument::None()}));
  ExpectFailure(s.g, s.out, "has 2 argument(s) and 0 kwarg(s)");
  ASSERT_OK(s.out->SetArgs({}));
  ExpectFailure(s.g, s.out, "has 0 argument(s)");
  ASSERT_OK(s.out->SetArgs({Argument::None()}));
  ASSERT_OK(s.out->SetKwargs({{"k", Argument::None()}}));
  ExpectFailure(s.g, s.out, "1 kwarg(s)");
}

TEST(VerifierTest, OutputMustHaveNoUsers) {
  Small s;
  // The only way to read the output is from after it, so the output is no
  // longer last; either way the graph is rejected at the output.
  ASSERT_OK(s.g.CallFunction("aten::neg", {Argument::Ref(s.out)}));
  ExpectFailure(s.g, s.out, "output node is not last");
}

// ----------------------------------------------------------------- meta

TEST(VerifierTest, NodeMetaExtraMustBeConstant) {
  Small s;
  s.relu->meta().extra["k"] = Argument::List({Argument::Ref(s.x)});
  ExpectFailure(s.g, s.relu,
                "meta extra \"k\" references a node; meta values must be "
                "constants");
}

TEST(VerifierTest, GraphMetaExtraMustBeConstant) {
  Small s;
  s.g.meta().extra["k"] = Argument::Ref(s.x);
  ExpectFailure(s.g, nullptr, "graph meta extra \"k\" references a node");
}

}  // namespace
}  // namespace tracecut::ir
