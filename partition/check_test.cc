#include "partition/check.h"

#include <torch/script.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "partition/module_sizes.h"
#include "partition/partitioner.h"
#include "partition/subgraph.h"
#include "runtime/compare.h"
#include "runtime/graph_module.h"
#include "util/testing/status_matchers.h"

namespace tracecut::partition {
namespace {

using ir::Argument;
using ir::Node;
using ::testing::HasSubstr;

Argument R(Node* n) { return Argument::Ref(n); }

std::shared_ptr<torch::jit::CompilationUnit> Cu() {
  static auto* cu = new std::shared_ptr<torch::jit::CompilationUnit>(
      std::make_shared<torch::jit::CompilationUnit>());
  return *cu;
}

torch::Tensor Det(c10::IntArrayRef shape, uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::rand(shape, gen) * 2 - 1;
}

torch::jit::Module Linear(int64_t in, int64_t out, uint64_t seed) {
  torch::jit::Module m("Linear", Cu(), /*shouldMangle=*/true);
  m.register_parameter("weight", Det({out, in}, seed), false);
  m.register_parameter("bias", Det({out}, seed + 1), false);
  m.define(R"(
def forward(self, x):
    return torch.linear(x, self.weight, self.bias)
)");
  return m;
}

// A small decoder: a head (scale, mask), `layers` Layer modules (weight w,
// leaf mlp), glue between layers 0 and 1 in the root, lm_head; returns
// (logits, mask).
struct Tiny {
  torch::jit::Module root{"Tiny", Cu(), true};
  std::unique_ptr<ir::Graph> graph = std::make_unique<ir::Graph>();
};

Tiny MakeTiny(int layers) {
  Tiny t;
  torch::jit::Module model("Model", Cu(), true);
  torch::jit::Module list("Layers", Cu(), true);
  for (int i = 0; i < layers; ++i) {
    torch::jit::Module layer("Layer", Cu(), true);
    layer.register_parameter("w", Det({8, 8}, 10 + i), false);
    layer.register_module("mlp", Linear(8, 8, 100 + 2 * i));
    list.register_module(std::to_string(i), layer);
  }
  model.register_module("layers", list);
  t.root.register_module("model", model);
  t.root.register_module("lm_head", Linear(8, 4, 7));
  t.root.register_buffer("scale", Det({8}, 3));

  ir::Graph& g = *t.graph;
  ir::Scope root(std::vector<ir::ScopeEntry>{{"", "Tiny"}});
  auto fn = [&](const std::string& name, const std::string& op,
                std::vector<Argument> args, const ir::Scope& scope) {
    Node* n = *g.CallFunction(op, std::move(args), {}, name);
    n->set_scope(scope);
    return n;
  };
  Node* x = *g.Placeholder("x");
  Node* scale = *g.GetAttr("scale");
  Node* h = fn("h0", "aten::mul.Tensor", {R(x), R(scale)}, root);
  Node* mask = fn("mask", "aten::relu", {R(x)}, root);
  Node* m = mask;
  for (int i = 0; i < layers; ++i) {
    std::string p = absl::StrCat("model.layers.", i);
    std::string l = absl::StrCat("l", i, "_");
    ir::Scope scope = root.Push(ir::ScopeEntry{p, "Layer"});
    Node* w = *g.GetAttr(p + ".w", l + "w");
    w->set_scope(scope);
    Node* a =
        fn(l + "a", "aten::linear", {R(h), R(w), Argument::None()}, scope);
    Node* a2 =
        fn(l + "a2", "aten::add.Tensor", {R(a), R(m), Argument::Int(1)}, scope);
    Node* mlp = *g.CallModule(p + ".mlp", {R(a2)}, {}, l + "mlp");
    mlp->set_scope(scope.Push(ir::ScopeEntry{p + ".mlp", "Linear"}));
    Node* th = fn(l + "t", "aten::tanh", {R(mlp)}, scope);
    h = fn(l + "out", "aten::add.Tensor", {R(h), R(th), Argument::Int(1)},
           scope);
    if (i == 0) {
      m = fn("glue", "aten::mul.Scalar", {R(mask), Argument::Double(0.5)},
             root);
    }
  }
  Node* logits = *g.CallModule("lm_head", {R(h)}, {}, "logits");
  logits->set_scope(root.Push(ir::ScopeEntry{"lm_head", "Linear"}));
  (void)*g.Output(Argument::Tuple({R(logits), R(mask)}));
  return t;
}

PartitionOptions Layers() {
  PartitionOptions o;
  o.targets = {"Layer"};
  return o;
}

TEST(CheckTest, SubgraphsInOrderMatchTheWholeGraph) {
  Tiny t = MakeTiny(3);
  for (int per : {1, 2}) {
    PartitionOptions o = Layers();
    o.targets_per_subgraph = per;
    auto p = PartitionGraph(*t.graph, o);
    ASSERT_OK(p);
    auto r = CheckPartition(*t.graph, t.root, *p, {Det({2, 8}, 1)});
    ASSERT_OK(r);
    EXPECT_TRUE(r->passed);
    EXPECT_TRUE(r->output.passed);
    EXPECT_EQ(r->output.max_abs_error, 0.0);
    EXPECT_EQ(r->output.elements, 2 * 4 + 2 * 8);  // (logits, mask)
    EXPECT_EQ(r->first_divergent, -1);
    EXPECT_EQ(r->first_failing, -1);
    ASSERT_EQ(r->subgraphs.size(), p->subgraphs.size());
    for (const runtime::CompareResult& s : r->subgraphs) {
      EXPECT_TRUE(s.passed);
      EXPECT_EQ(s.max_abs_error, 0.0);
      EXPECT_GT(s.elements, 0);
    }
    EXPECT_GT(r->peak_cached_values, 0);
    std::printf(
        "[ check ] %d per subgraph: %zu subgraphs, %s, "
        "peak cached values %lld\n",
        per, p->subgraphs.size(), r->output.ErrorSummary().c_str(),
        static_cast<long long>(r->peak_cached_values));
  }
}

TEST(CheckTest, GraphModuleOverloadAndRunPartition) {
  Tiny t = MakeTiny(2);
  auto p = PartitionGraph(*t.graph, Layers());
  ASSERT_OK(p);
  runtime::GraphModule gm(t.root, std::move(t.graph));
  auto r = CheckPartition(gm, *p, {Det({3, 8}, 2)});
  ASSERT_OK(r);
  EXPECT_TRUE(r->passed);
  EXPECT_EQ(r->output.max_abs_error, 0.0);

  PartitionRunStats stats;
  auto out = RunPartition(*p, gm.module(), {Det({3, 8}, 2)}, &stats);
  ASSERT_OK(out);
  ASSERT_TRUE(out->isTuple());
  EXPECT_EQ(out->toTupleRef().elements()[0].toTensor().sizes(),
            (std::vector<int64_t>{3, 4}));
  EXPECT_GT(stats.peak_cached_values, 0);

  auto bad = RunPartition(*p, gm.module(), {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckTest, ReportsTheSubgraphThatDiverges) {
  Tiny t = MakeTiny(3);
  auto p = PartitionGraph(*t.graph, Layers());
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  // Break layer 1 (subgraph 2).
  ir::Node* n = p->subgraphs[2].graph->FindNode("l1_t");
  ASSERT_NE(n, nullptr);
  n->set_target("aten::sigmoid");
  auto r = CheckPartition(*t.graph, t.root, *p, {Det({2, 8}, 1)});
  ASSERT_OK(r);
  EXPECT_FALSE(r->passed);
  EXPECT_FALSE(r->output.passed);
  EXPECT_GT(r->output.max_abs_error, 0.0);
  EXPECT_EQ(r->first_divergent, 2);
  EXPECT_EQ(r->first_failing, 2);
  ASSERT_EQ(r->subgraphs.size(), 4u);
  EXPECT_EQ(r->subgraphs[1].max_abs_error, 0.0);
  EXPECT_GT(r->subgraphs[2].max_abs_error, 0.0);
  ASSERT_TRUE(r->subgraphs[2].worst.has_value());
  // The subgraph's output value, by name.
  EXPECT_EQ(r->subgraphs[2].worst->path, "%l1_out");
  ASSERT_TRUE(r->output.worst.has_value());
  EXPECT_EQ(r->output.worst->path, "[0]");  // logits
  EXPECT_THAT(r->output.FailureSummary("output"),
              HasSubstr("elements exceed atol 1e-05 + rtol 0.0001*|ref|; "
                        "worst at output [0] element "));
}

// A divergence within tolerance: reported (first_divergent), not failed.
TEST(CheckTest, TolerancesDecideWhatFails) {
  Tiny t = MakeTiny(3);
  auto p = PartitionGraph(*t.graph, Layers());
  ASSERT_OK(p);
  // Layer 1 (subgraph 2) adds 1.001 * tanh(...) instead of tanh(...).
  ir::Node* n = p->subgraphs[2].graph->FindNode("l1_out");
  ASSERT_NE(n, nullptr);
  ASSERT_OK(n->SetArg(2, Argument::Double(1.001)));

  auto strict = CheckPartition(*t.graph, t.root, *p, {Det({2, 8}, 1)});
  ASSERT_OK(strict);
  EXPECT_FALSE(strict->passed);
  EXPECT_EQ(strict->first_divergent, 2);
  EXPECT_EQ(strict->first_failing, 2);
  EXPECT_GT(strict->subgraphs[2].violations, 0);

  auto loose = CheckPartition(*t.graph, t.root, *p, {Det({2, 8}, 1)},
                              runtime::CompareOptions{1e-2, 1e-2});
  ASSERT_OK(loose);
  EXPECT_TRUE(loose->passed);
  EXPECT_TRUE(loose->output.passed);
  EXPECT_GT(loose->output.max_abs_error, 0.0);
  EXPECT_EQ(loose->first_divergent, 2);
  EXPECT_EQ(loose->first_failing, -1);
  EXPECT_EQ(loose->subgraphs[2].rtol, 1e-2);

  auto bad = CheckPartition(*t.graph, t.root, *p, {Det({2, 8}, 1)},
                            runtime::CompareOptions{-1, 0});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckTest, RunErrorsNameTheSubgraph) {
  Tiny t = MakeTiny(2);
  auto p = PartitionGraph(*t.graph, Layers());
  ASSERT_OK(p);
  p->subgraphs[1].graph->FindNode("l0_t")->set_target("aten::no_such_op");
  auto r = CheckPartition(*t.graph, t.root, *p, {Det({2, 8}, 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("subgraph 1"));
  EXPECT_THAT(r.status().message(), HasSubstr("no_such_op"));
}

TEST(ModuleSizesTest, TensorsAndLeafModules) {
  Tiny t = MakeTiny(2);
  ParamBytesFn bytes = ModuleParamBytes(t.root);
  EXPECT_EQ(bytes("model.layers.0.w"), 8 * 8 * 4);
  EXPECT_EQ(bytes("model.layers.0.mlp"), (8 * 8 + 8) * 4);
  EXPECT_EQ(bytes("model.layers.1"), (8 * 8 + 8 * 8 + 8) * 4);
  EXPECT_EQ(bytes("scale"), 8 * 4);
  EXPECT_EQ(bytes("model.layers.7"), std::nullopt);
  EXPECT_EQ(bytes("scale.x"), std::nullopt);

  PartitionOptions o = Layers();
  o.param_bytes = bytes;
  auto p = PartitionGraph(*t.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 3u);
  EXPECT_EQ(p->subgraphs[0].param_bytes, 8 * 4);
  EXPECT_EQ(p->subgraphs[1].param_bytes, (8 * 8 + 8 * 8 + 8) * 4);
  // The last layer with lm_head (Linear 8 -> 4).
  EXPECT_EQ(p->subgraphs[2].param_bytes,
            (8 * 8 + 8 * 8 + 8) * 4 + (4 * 8 + 4) * 4);
}

// A subgraph output whose structure differs from the whole graph's value
// names the subgraph and the value.
TEST(CheckTest, StructureMismatchNamesSubgraphAndValue) {
  Tiny t = MakeTiny(2);
  auto p = PartitionGraph(*t.graph, Layers());
  ASSERT_OK(p);
  // Layer 0's output becomes [2, 1] instead of [2, 8].
  ir::Node* n = p->subgraphs[1].graph->FindNode("l0_out");
  ASSERT_NE(n, nullptr);
  n->set_target("aten::sum.dim_IntList");
  ASSERT_OK(n->SetArgs({n->args()[0], Argument::List({Argument::Int(1)}),
                        Argument::Bool(true)}));
  auto r = CheckPartition(*t.graph, t.root, *p, {Det({2, 8}, 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("subgraph 1 output %l0_out: shape [2, 1] vs [2, 8]"));
}

}  // namespace
}  // namespace tracecut::partition
