#include "transforms/debugger.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "transforms/change_truediv_to_mul_by_inverse.h"
#include "transforms/gelu_tanh_approx.h"
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
  PassPipeline pipeline;
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

  const std::string text = report->ToJson();
  EXPECT_EQ(text, report->ToJson());  // Deterministic.
  EXPECT_EQ(text.back(), '\n');
  auto json = util::ParseJson(text, "report");
  ASSERT_OK(json);
  EXPECT_EQ(Keys(*json),
            (std::vector<std::string>{"rtol", "atol", "first_exceeding",
                                      "subgraphs", "steps"}));
  EXPECT_EQ((*json).at("rtol"), 1e-4);
  EXPECT_EQ((*json).at("atol"), 1e-5);
  const util::Json& first = (*json).at("first_exceeding");
  EXPECT_EQ(Keys(first),
            (std::vector<std::string>{"subgraph", "pass", "module_paths",
                                      "max_abs", "max_rel", "violations",
                                      "elements", "worst", "mismatch"}));
  EXPECT_EQ(first.at("subgraph"), 2);
  EXPECT_EQ(first.at("pass"), "gelu-tanh-approx");
  EXPECT_EQ(first.at("module_paths"), util::Json::array({"layers.1"}));
  EXPECT_EQ(first.at("max_abs"), bad.max_abs);  // Round-trips exactly.
  EXPECT_EQ(first.at("max_rel"), bad.max_rel);
  EXPECT_EQ(first.at("violations"), bad.violations);
  EXPECT_EQ(first.at("elements"), bad.elements);
  EXPECT_EQ(first.at("worst"), bad.worst->ToString());
  EXPECT_TRUE(absl::StartsWith(first.at("worst").get<std::string>(),
                               "%gelu_1 element "))
      << first;
  EXPECT_TRUE(first.at("mismatch").is_null());

  const util::Json& subgraphs = (*json).at("subgraphs");
  ASSERT_EQ(subgraphs.size(), report->subgraphs.size());
  for (size_t i = 0; i < subgraphs.size(); ++i) {
    const DebugSubgraph& g = report->subgraphs[i];
    EXPECT_EQ(Keys(subgraphs.at(i)),
              (std::vector<std::string>{"index", "module_paths", "input_names",
                                        "output_names"}));
    EXPECT_EQ(subgraphs.at(i).at("index"), g.index);
    EXPECT_EQ(subgraphs.at(i).at("module_paths"), util::Json(g.module_paths));
    EXPECT_EQ(subgraphs.at(i).at("input_names"), util::Json(g.input_names));
    EXPECT_EQ(subgraphs.at(i).at("output_names"), util::Json(g.output_names));
  }
  const util::Json& steps = (*json).at("steps");
  ASSERT_EQ(steps.size(), report->steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const DebugStep& s = report->steps[i];
    const util::Json& j = steps[i];
    EXPECT_EQ(Keys(j),
              (std::vector<std::string>{
                  "subgraph", "pass", "changed", "preserves_computation",
                  "max_abs", "max_rel", "violations", "cumulative_max_abs",
                  "cumulative_max_rel", "exceeds", "touched_nodes"}));
    EXPECT_EQ(j.at("subgraph"), s.subgraph);
    EXPECT_EQ(j.at("pass"), s.pass);
    EXPECT_EQ(j.at("changed"), s.changed);
    EXPECT_EQ(j.at("preserves_computation"), s.preserves_computation);
    EXPECT_EQ(j.at("max_abs"), s.max_abs);
    EXPECT_EQ(j.at("max_rel"), s.max_rel);
    EXPECT_EQ(j.at("violations"), s.violations);
    EXPECT_EQ(j.at("cumulative_max_abs"), s.cumulative_max_abs);
    EXPECT_EQ(j.at("cumulative_max_rel"), s.cumulative_max_rel);
    EXPECT_EQ(j.at("exceeds"), s.exceeds);
    EXPECT_EQ(j.at("touched_nodes"), util::Json(s.touched_nodes));
  }
  EXPECT_EQ(steps.at(report->first_exceeding).at("touched_nodes"),
            util::Json::array({"gelu_1"}));
  // The input is untouched; the pipeline has no instrumentation left.
  EXPECT_FALSE(gm.GetSubmodule("layers.0.q_k_merged").ok());
  EXPECT_TRUE(pipeline.instrumentations().empty());
}

TEST(DebuggerTest, NothingExceedsForPreservingPasses) {
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  DebugOptions options;
  options.partition.targets = {"Block"};
  auto report =
      DebugPipeline(MakeModel(), pipeline, {Rand({4, 8}, 4)}, options);
  ASSERT_OK(report);
  EXPECT_EQ(report->first_exceeding, -1);
  auto json = util::ParseJson(report->ToJson(), "report");
  ASSERT_OK(json);
  ASSERT_TRUE(json->contains("first_exceeding")) << *json;
  EXPECT_TRUE((*json).at("first_exceeding").is_null());
}

// Loose tolerances let even the GELU approximation pass; bad ones are
// errors.
TEST(DebuggerTest, TolerancesDecideWhatIsFlagged) {
  PassPipeline pipeline;
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

// Outputs that cannot be compared have infinite errors: JSON has no
// infinity, so they are null (as NaN is), and `mismatch` says why.
TEST(DebuggerTest, ReportWritesNonFiniteErrorsAsNull) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  DebugReport report;
  report.rtol = 1e-4;
  report.atol = 1e-5;
  report.subgraphs.push_back({0, {"layers.0"}, {"x"}, {"add_0"}});
  DebugStep step;
  step.pass = "breaks \"shape\"";
  step.changed = true;
  step.max_abs = kInf;
  step.max_rel = std::nan("");
  step.mismatch = "%add_0: shape [4, 8] vs [4, 16]";
  step.cumulative_max_abs = kInf;
  step.cumulative_max_rel = -kInf;
  step.exceeds = true;
  report.steps.push_back(step);
  report.first_exceeding = 0;
  auto json = util::ParseJson(report.ToJson(), "report");
  ASSERT_OK(json);
  const util::Json& first = (*json).at("first_exceeding");
  EXPECT_EQ(first.at("pass"), "breaks \"shape\"");
  EXPECT_EQ(first.at("module_paths"), util::Json::array({"layers.0"}));
  EXPECT_TRUE(first.at("max_abs").is_null());
  EXPECT_TRUE(first.at("max_rel").is_null());
  EXPECT_TRUE(first.at("worst").is_null());
  EXPECT_EQ(first.at("mismatch"), "%add_0: shape [4, 8] vs [4, 16]");
  const util::Json& s = (*json).at("steps").at(0);
  EXPECT_TRUE(s.at("max_abs").is_null());
  EXPECT_TRUE(s.at("max_rel").is_null());
  EXPECT_TRUE(s.at("cumulative_max_abs").is_null());
  EXPECT_TRUE(s.at("cumulative_max_rel").is_null());
  EXPECT_EQ(s.at("exceeds"), true);
}

TEST(DebuggerTest, RejectsWrongInputCount) {
  PassPipeline pipeline;
  DebugOptions options;
  options.partition.targets = {"Block"};
  EXPECT_FALSE(DebugPipeline(MakeModel(), pipeline, {}, options).ok());
}

}  // namespace
}  // namespace tracecut::transforms
