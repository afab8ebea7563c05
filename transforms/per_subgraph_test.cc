#include "transforms/per_subgraph.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ir/text.h"
#include "partition/partitioner.h"
#include "transforms/change_truediv_to_mul_by_inverse.h"
#include "transforms/fusion_math.h"
#include "transforms/merge_linears.h"
#include "transforms/test_util.h"
#include "util/json.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

// An object's member names, in order.
std::vector<std::string> Keys(const util::Json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;
using testing::MaxRelError;
using testing::Rand;
using testing::RunGraph;

// Two "Block" layers: q, k, v (8 -> 8) on the layer input, summed, divided
// by 2, GELU.
std::string Layer(int i, const std::string& in) {
  const std::string p = absl::StrCat("layers.", i);
  const std::string scope = absl::StrCat("scope[:\"Root\", ", p, ":\"Block\"");
  auto leaf = [&](const char* name) {
    return absl::StrCat("  %", name, "_", i, " = call_module[", p, ".", name,
                        "](%", in, ") ", scope, ", ", p, ".", name,
                        ":\"torch.nn.modules.linear.Linear\"]\n");
  };
  return absl::StrCat(
      leaf("q"), leaf("k"), leaf("v"), "  %add_", i,
      " = call_function[aten::add.Tensor](%q_", i, ", %k_", i, ", 1) ", scope,
      "]\n", "  %add2_", i, " = call_function[aten::add.Tensor](%add_", i,
      ", %v_", i, ", 1) ", scope, "]\n", "  %div_", i,
      " = call_function[aten::div.Scalar](%add2_", i, ", 2.0) ", scope, "]\n",
      "  %h_", i, " = call_function[aten::gelu](%div_", i, ", \"none\") ",
      scope, "]\n");
}

runtime::GraphModule MakeTwoLayers() {
  torch::jit::Module root = MakeRoot();
  torch::jit::Module layers = MakeRoot("ModuleList");
  for (int i = 0; i < 2; ++i) {
    torch::jit::Module block = MakeRoot("Block");
    block.register_module("q", MakeLinear(root, 8, 8, true, 10 * i + 1));
    block.register_module("k", MakeLinear(root, 8, 8, false, 10 * i + 2));
    block.register_module("v", MakeLinear(root, 8, 8, true, 10 * i + 3));
    layers.register_module(absl::StrCat(i), block);
  }
  root.register_module("layers", layers);
  return MakeGraphModule(
      root,
      absl::StrCat("graph {\n  %x = placeholder[x]()\n", Layer(0, "x"),
                   Layer(1, "h_0"), "  %output = output[output](%h_1)\n}\n"));
}

partition::PartitionOptions Blocks() {
  partition::PartitionOptions options;
  options.targets = {"Block"};
  return options;
}

TEST(PerSubgraphTest, TransformsEachSubgraphAndReassembles) {
  runtime::GraphModule original = MakeTwoLayers();
  PassPipeline pipeline;
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  pipeline.AddPass<MergeLinears>();
  auto result = RunPerSubgraph(original, pipeline, Blocks());
  ASSERT_OK(result);
  EXPECT_TRUE(result->changed);
  ASSERT_EQ(result->subgraphs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const SubgraphRunReport& s = result->subgraphs[i];
    EXPECT_EQ(s.module_paths,
              std::vector<std::string>{absl::StrCat("layers.", i)});
    ASSERT_EQ(s.passes.size(), 2u);
    EXPECT_EQ(s.passes[0].pass, "change-truediv-to-mul-by-inverse");
    EXPECT_EQ(s.passes[0].touched_nodes,
              std::vector<std::string>{absl::StrCat("div_", i)});
    EXPECT_EQ(s.passes[1].pass, "merge-linears");
    EXPECT_EQ(s.passes[1].touched_nodes.size(), 5u);  // merged, split, 3 items
  }
  const ir::Graph& g = result->module.graph();
  EXPECT_NE(g.FindNode("q_k_v_merged"), nullptr) << ir::PrintGraph(g);
  EXPECT_NE(g.FindNode("q_k_v_merged_1"), nullptr);
  EXPECT_OK(result->module.GetSubmodule("layers.1.q_k_v_merged"));
  // The input is untouched.
  EXPECT_FALSE(original.GetSubmodule("layers.1.q_k_v_merged").ok());

  std::vector<c10::IValue> in = {Rand({3, 8}, 9)};
  auto before = RunGraph(original, in);
  auto after = RunGraph(result->module, in);
  ASSERT_TRUE(before.ok() && after.ok()) << after.status();
  EXPECT_LT(MaxRelError(*after, *before), 1e-5);

  const std::string text = PerSubgraphReportJson(*result);
  EXPECT_EQ(text.back(), '\n');
  auto json = util::ParseJson(text, "report");
  ASSERT_OK(json);
  EXPECT_EQ(Keys(*json), (std::vector<std::string>{"changed", "subgraphs"}));
  EXPECT_EQ((*json).at("changed"), true);
  const util::Json& subgraphs = (*json).at("subgraphs");
  ASSERT_EQ(subgraphs.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const SubgraphRunReport& s = result->subgraphs[i];
    const util::Json& j = subgraphs[i];
    EXPECT_EQ(Keys(j),
              (std::vector<std::string>{"index", "module_paths", "node_count",
                                        "changed", "passes"}));
    EXPECT_EQ(j.at("index"), s.index);
    EXPECT_EQ(j.at("module_paths"),
              util::Json::array({absl::StrCat("layers.", i)}));
    EXPECT_EQ(j.at("node_count"), s.node_count);
    EXPECT_EQ(j.at("changed"), true);
    ASSERT_EQ(j.at("passes").size(), 2u);
    for (int k = 0; k < 2; ++k) {
      const util::Json& pass = j.at("passes").at(k);
      EXPECT_EQ(Keys(pass),
                (std::vector<std::string>{"pass", "changed", "time_ms",
                                          "touched_nodes"}));
      EXPECT_EQ(pass.at("pass"), s.passes[k].pass);
      EXPECT_EQ(pass.at("changed"), s.passes[k].changed);
      ASSERT_TRUE(pass.at("time_ms").is_number()) << pass;
      EXPECT_NEAR(pass.at("time_ms").get<double>(), s.passes[k].time_ms, 5e-4);
      EXPECT_EQ(pass.at("touched_nodes"),
                util::Json(s.passes[k].touched_nodes));
    }
    EXPECT_EQ(j.at("passes").at(1).at("pass"), "merge-linears");
  }

  // The reassembled module reverses like a whole-graph run: back to the
  // reassembled untransformed partition, parameters bit for bit.
  ASSERT_TRUE(pipeline.Reverse(result->module).value());
  auto p = partition::PartitionGraph(original.graph(), Blocks());
  ASSERT_OK(p);
  auto plain = partition::Reassemble(*p);
  ASSERT_OK(plain);
  runtime::GraphModule expected(original.module(), std::move(plain).value());
  EXPECT_EQ(testing::DiffGraphModules(result->module, expected), "");
  auto undone = RunGraph(result->module, in);
  EXPECT_TRUE(fusion_math::BitwiseEqual((*undone)[0], (*before)[0]));
}

class BreaksLayerOne : public Transformation {
 public:
  absl::string_view name() const override { return "breaks-layer-one"; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override {
    ir::Node* n = gm.graph().FindNode("h_1");
    if (n == nullptr) return false;
    n->set_target("bad target");
    return true;
  }
};

TEST(PerSubgraphTest, ErrorsNameTheSubgraphAndPass) {
  PassPipeline pipeline;
  pipeline.AddPass<BreaksLayerOne>();
  auto result = RunPerSubgraph(MakeTwoLayers(), pipeline, Blocks());
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::StartsWith(
      result.status().message(),
      "subgraph 1 (layers.1): failed after breaks-layer-one: %h_1"))
      << result.status();
}

TEST(PerSubgraphTest, NothingToDo) {
  PassPipeline pipeline;
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  runtime::GraphModule gm = MakeGraphModule(MakeRoot(), R"(graph {
  %x = placeholder[x]()
  %relu = call_function[aten::relu](%x) scope[:"Root", b:"Block"]
  %output = output[output](%relu)
})");
  auto result = RunPerSubgraph(gm, pipeline, Blocks());
  ASSERT_OK(result);
  EXPECT_FALSE(result->changed);
  EXPECT_EQ(result->subgraphs.size(), 1u);
}

}  // namespace
}  // namespace tracecut::transforms
