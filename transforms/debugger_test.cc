#include "transforms/debugger.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "transforms/change_truediv_to_mul_by_inverse.h"
#include "transforms/gelu_tanh_approx.h"
#include "transforms/merge_linears.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;
using testing::Rand;

// A head (relu) then two "Block" layers: q, k (8 -> 8) on the layer input,
// summed, divided by 2; layer 1 also applies an exact GELU.
runtime::GraphModule MakeModel() {
  torch::jit::Module root = MakeRoot();
  torch::jit::Module layers = MakeRoot("ModuleList");
  for (int i = 0; i < 2; ++i) {
    torch::jit::Module block = MakeRoot("Block");
    block.register_module("q", MakeLinear(root, 8, 8, true, 10 * i + 1));
    block.register_module("k", MakeLinear(root, 8, 8, false, 10 * i + 2));
    layers.register_module(absl::StrCat(i), block);
  }
  root.register_module("layers", layers);
  return MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %relu = call_function[aten::relu](%x)
  %q_0 = call_module[layers.0.q](%relu) scope[:"Root", layers.0:"Block", layers.0.q:"torch.nn.modules.linear.Linear"]
  %k_0 = call_module[layers.0.k](%relu) scope[:"Root", layers.0:"Block", layers.0.k:"torch.nn.modules.linear.Linear"]
  %add_0 = call_function[aten::add.Tensor](%q_0, %k_0, 1) scope[:"Root", layers.0:"Block"]
  %div_0 = call_function[aten::div.Scalar](%add_0, 2.0) scope[:"Root", layers.0:"Block"]
  %q_1 = call_module[layers.1.q](%div_0) scope[:"Root", layers.1:"Block", layers.1.q:"torch.nn.modules.linear.Linear"]
  %k_1 = call_module[layers.1.k](%div_0) scope[:"Root", layers.1:"Block", layers.1.k:"torch.nn.modules.linear.Linear"]
  %add_1 = call_function[aten::add.Tensor](%q_1, %k_1, 1) scope[:"Root", layers.1:"Block"]
  %gelu_1 = call_function[aten::gelu](%add_1, "none") scope[:"Root", layers.1:"Block"]
  %output = output[output](%gelu_1)
})");
}

TEST(DebuggerTest, FlagsTheFirstLayerAndPassThatBreakTolerance) {
  runtime::GraphModule gm = MakeModel();
  Pipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  pipeline.AddPass<GeluTanhApprox>();
  DebugOptions options;
  options.partition.targets = {"Block"};  // Default tolerances.
  auto report = DebugPipeline(gm, pipeline, {Rand({4, 8}, 3) * 3}, options);
  ASSERT_OK(report);
  // Head + two layers, three passes each.
  ASSERT_EQ(report->subgraphs.size(), 3u);
  ASSERT_EQ(report->steps.size(), 9u);
  for (const DebugStep& s : report->steps) {
    if (s.pass == "merge-linears" && s.subgraph > 0) {
      EXPECT_TRUE(s.changed);
      EXPECT_FALSE(s.exceeds) << s.subgraph;
      EXPECT_LT(s.max_abs, 1e-5) << s.subgraph;
      EXPECT_EQ(s.violations, 0);
      EXPECT_EQ(s.elements, 4 * 8);
      EXPECT_EQ(s.touched_nodes.size(), 4u);  // merged, split, 2 items
    }
    if (s.pass == "change-truediv-to-mul-by-inverse" && s.subgraph == 1) {
      EXPECT_TRUE(s.changed);
      EXPECT_EQ(s.max_abs, 0.0);  // Exact.
    }
  }
  ASSERT_GE(report->first_exceeding, 0);
  const DebugStep& bad = report->steps[report->first_exceeding];
  EXPECT_EQ(bad.subgraph, 2);
  EXPECT_EQ(bad.pass, "gelu-tanh-approx");
  EXPECT_FALSE(bad.preserves_computation);
  EXPECT_GT(bad.max_rel, 1e-4);
  EXPECT_LT(bad.max_abs, 1e-3);
  EXPECT_GT(bad.violations, 0);
  EXPECT_TRUE(bad.mismatch.empty());
  ASSERT_TRUE(bad.worst.has_value());
  EXPECT_EQ(bad.worst->path, "%gelu_1");  // The subgraph's output value.
  EXPECT_GT(bad.worst->abs_error, 1e-5 + 1e-4 * std::abs(bad.worst->expected));
  EXPECT_EQ(bad.touched_nodes, std::vector<std::string>{"gelu_1"});
  EXPECT_GE(bad.cumulative_max_abs, bad.max_abs * 0.5);

  const std::string json = report->ToJson();
  EXPECT_TRUE(absl::StrContains(
      json,
      "\"first_exceeding\": {\"subgraph\": 2, \"pass\": "
      "\"gelu-tanh-approx\", \"module_paths\": [\"layers.1\"]"))
      << json;
  EXPECT_TRUE(absl::StrContains(json, "\"touched_nodes\": [\"gelu_1\"]"));
  EXPECT_TRUE(absl::StrContains(json, "{\"rtol\": 0.0001, \"atol\": 1e-05"))
      << json;
  EXPECT_TRUE(absl::StrContains(json, "\"worst\": \"%gelu_1 element ")) << json;
  // The input is untouched; the pipeline has no instrumentation left.
  EXPECT_FALSE(gm.GetSubmodule("layers.0.q_k_merged").ok());
  EXPECT_TRUE(pipeline.instrumentations().empty());
}

TEST(DebuggerTest, NothingExceedsForPreservingPasses) {
  Pipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  DebugOptions options;
  options.partition.targets = {"Block"};
  auto report =
      DebugPipeline(MakeModel(), pipeline, {Rand({4, 8}, 4)}, options);
  ASSERT_OK(report);
  EXPECT_EQ(report->first_exceeding, -1);
  EXPECT_TRUE(absl::StrContains(report->ToJson(), "\"first_exceeding\": null"));
}

// Loose tolerances let even the GELU approximation pass; bad ones are
// errors.
TEST(DebuggerTest, TolerancesDecideWhatIsFlagged) {
  Pipeline pipeline;
  pipeline.AddPass<GeluTanhApprox>();
  DebugOptions options;
  options.partition.targets = {"Block"};
  options.compare = {1e-2, 1e-2};
  auto loose =
      DebugPipeline(MakeModel(), pipeline, {Rand({4, 8}, 3) * 3}, options);
  ASSERT_OK(loose);
  EXPECT_EQ(loose->first_exceeding, -1);
  EXPECT_EQ(loose->rtol, 1e-2);

  options.compare = {-1, 0};
  auto bad = DebugPipeline(MakeModel(), pipeline, {Rand({4, 8}, 3)}, options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DebuggerTest, RejectsWrongInputCount) {
  Pipeline pipeline;
  DebugOptions options;
  options.partition.targets = {"Block"};
  EXPECT_FALSE(DebugPipeline(MakeModel(), pipeline, {}, options).ok());
}

}  // namespace
}  // namespace tracecut::transforms
