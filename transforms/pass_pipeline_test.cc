#include "transforms/pass_pipeline.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "ir/proto.h"
#include "ir/text.h"
#include "transforms/change_truediv_to_mul_by_inverse.h"
#include "transforms/eliminate_dead_code.h"
#include "transforms/fuse_batchnorm2d_in_conv2d.h"
#include "transforms/fuse_bias_in_linear.h"
#include "transforms/gelu_tanh_approx.h"
#include "transforms/merge_linears.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;

// q (bias), k (no bias) and v (bias) on %x, then x / 4 and a GELU.
runtime::GraphModule MakeModel() {
  torch::jit::Module root = MakeRoot();
  root.register_module("q", MakeLinear(root, 4, 4, true, 1));
  root.register_module("k", MakeLinear(root, 4, 2, false, 2));
  root.register_module("v", MakeLinear(root, 4, 4, true, 3));
  return MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %q = call_module[q](%x) scope[:"Root", q:"torch.nn.modules.linear.Linear"]
  %k = call_module[k](%x) scope[:"Root", k:"torch.nn.modules.linear.Linear"]
  %v = call_module[v](%x) scope[:"Root", v:"torch.nn.modules.linear.Linear"]
  %div = call_function[aten::div.Scalar](%q, 4.0)
  %gelu = call_function[aten::gelu](%div, "none")
  %output = output[output]((%gelu, %k, %v))
})");
}

// Deliberately broken: gives the GELU an operator name no verifier accepts.
class BreaksTarget : public Transformation {
 public:
  absl::string_view name() const override { return "breaks-target"; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override {
    gm.graph().FindNode("gelu")->set_target("not an operator!");
    return true;
  }
};

// Deliberately broken: points a call at a module that does not exist.
class DanglingModule : public Transformation {
 public:
  absl::string_view name() const override { return "dangling-module"; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override {
    gm.graph().FindNode("k")->set_target("no.such.module");
    return true;
  }
};

// Breaks the graph but claims to have changed nothing: not checked.
class QuietBreak : public Transformation {
 public:
  absl::string_view name() const override { return "quiet-break"; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override {
    gm.graph().FindNode("k")->set_target("no.such.module");
    return false;
  }
};

class Fails : public Transformation {
 public:
  absl::string_view name() const override { return "fails"; }
  absl::StatusOr<bool> Run(runtime::GraphModule&) override {
    return absl::InvalidArgumentError("bad node %k");
  }
};

TEST(PipelineTest, VerifierNamesTheBrokenPass) {
  runtime::GraphModule gm = MakeModel();
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<BreaksTarget>();
  pipeline.AddPass<EliminateDeadCode>();
  auto result = pipeline.Apply(gm);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(result.status().message(),
                               "failed after breaks-target: %gelu"))
      << result.status();
  // The passes before it ran; the one after did not.
  ASSERT_EQ(pipeline.records().size(), 2u);
  EXPECT_EQ(pipeline.records()[0].name, "merge-linears");
  // The input is untouched.
  EXPECT_EQ(DiffGraphModules(gm, MakeModel()), "");
}

TEST(PipelineTest, ModuleReferencesAreCheckedToo) {
  PassPipeline pipeline;
  pipeline.AddPass<DanglingModule>();
  auto result = pipeline.Apply(MakeModel());
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::StartsWith(result.status().message(),
                               "failed after dangling-module: %k"))
      << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "no.such.module"));
}

TEST(PipelineTest, ChecksOnlyAfterChangesAndBeforeTheFirstPass) {
  PassPipeline pipeline;
  pipeline.AddPass<QuietBreak>();
  EXPECT_TRUE(pipeline.Apply(MakeModel()).ok());  // Claimed no change.
  // Now the input is broken: reported before any pass runs.
  runtime::GraphModule broken = MakeModel();
  broken.graph().FindNode("k")->set_target("no.such.module");
  PassPipeline other;
  other.AddPass<MergeLinears>();
  auto result = other.Apply(broken);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::StartsWith(result.status().message(), "invalid input: %k"))
      << result.status();
}

TEST(PipelineTest, PassErrorsNameThePass) {
  PassPipeline pipeline;
  pipeline.AddPass<Fails>();
  auto result = pipeline.Apply(MakeModel());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "fails failed: bad node %k");
}

TEST(PipelineTest, DumpsAfterMatchingPassesAndTimesEach) {
  PassPipelineOptions options;
  std::vector<std::string> dumped;
  options.dump_after = "merge-*";
  options.dump_sink = [&](absl::string_view pass, absl::string_view text) {
    dumped.push_back(std::string(pass));
    EXPECT_TRUE(absl::StrContains(text, "aten::split_with_sizes")) << text;
  };
  PassPipeline pipeline("optimize", options);
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  pipeline.AddPass<FuseBatchNorm2dInConv2d>();  // Nothing to do here.
  auto out = pipeline.Apply(MakeModel());
  ASSERT_OK(out);
  EXPECT_EQ(dumped, std::vector<std::string>{"merge-linears"});
  ASSERT_EQ(pipeline.records().size(), 3u);
  EXPECT_TRUE(pipeline.records()[0].changed);
  EXPECT_TRUE(pipeline.records()[1].changed);
  EXPECT_FALSE(pipeline.records()[2].changed);
  const std::string report = pipeline.TimingReport();
  EXPECT_TRUE(absl::StrContains(report, "merge-linears: changed, "));
  EXPECT_TRUE(
      absl::StrContains(report, "fuse-batchnorm2d-in-conv2d: unchanged, "));
}

TEST(PipelineTest, PassNamePatterns) {
  EXPECT_TRUE(PassNameMatches("*", "merge-linears"));
  EXPECT_TRUE(PassNameMatches("fuse-*-in-*", "fuse-batchnorm2d-in-conv2d"));
  EXPECT_TRUE(PassNameMatches("merge-linear?", "merge-linears"));
  EXPECT_FALSE(PassNameMatches("merge", "merge-linears"));
  EXPECT_TRUE(PassNameMatches("re:fuse-.*|merge-linears", "merge-linears"));
  EXPECT_FALSE(PassNameMatches("re:fuse", "fuse-bias-in-linear"));
  EXPECT_FALSE(PassNameMatches("re:(", "x"));
  EXPECT_FALSE(PassNameMatches("", "x"));
}

TEST(PipelineTest, ReverseUndoesInReverseOrderBitForBit) {
  runtime::GraphModule original = MakeModel();
  PassPipeline pipeline;
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  pipeline.AddPass<MergeLinears>();
  // Rewrites the merged linear (it has a bias): must be undone first.
  pipeline.AddPass<FuseBiasInLinear>();
  pipeline.AddPass<GeluTanhApprox>();
  EXPECT_TRUE(pipeline.is_reversible());
  EXPECT_FALSE(pipeline.preserves_computation());
  auto out = pipeline.Apply(original);
  ASSERT_OK(out);
  ir::Node* merged = out->graph().FindNode("q_k_v_merged");
  ASSERT_NE(merged, nullptr);
  // fuse-bias-in-linear replaced the merged call: merge-linears' mark now
  // lives in its snapshot.
  EXPECT_NE(FindMark(*merged, FuseBiasInLinear::kName), nullptr);
  EXPECT_EQ(FindMark(*merged, MergeLinears::kName), nullptr);

  // Undoing merge-linears alone, out of order, is refused.
  auto early = MergeLinears().Reverse(*out);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(early.status().message(), "fuse-bias-in-linear"))
      << early.status();

  auto undone = pipeline.Reverse(*out);
  ASSERT_OK(undone);
  EXPECT_TRUE(*undone);
  EXPECT_EQ(DiffGraphModules(*out, original), "");
  ASSERT_EQ(pipeline.records().size(), 4u);
  EXPECT_EQ(pipeline.records()[0].name, "gelu-tanh-approx (reverse)");
}

TEST(PipelineTest, SamePassTwiceUndoesTheLatestApplicationFirst) {
  runtime::GraphModule original = MakeModel();
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<FuseBiasInLinear>();
  pipeline.AddPass<MergeLinears>();      // Nothing left to merge.
  pipeline.AddPass<FuseBiasInLinear>();  // Nothing with a bias left.
  auto out = pipeline.Apply(original);
  ASSERT_OK(out);
  ASSERT_OK(pipeline.Reverse(*out));
  EXPECT_EQ(DiffGraphModules(*out, original), "");
}

TEST(PipelineTest, MarksSurviveTheTextFormForReverse) {
  torch::jit::Module root = MakeRoot();
  root.register_module("conv", testing::MakeConv2d(root, 3, 4, 3, false, 1, 1));
  root.register_module("bn", testing::MakeBatchNorm(root, 4, true, true, 2));
  runtime::GraphModule original = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %conv = call_module[conv](%x)
  %bn = call_module[bn](%conv)
  %output = output[output](%bn)
})");
  PassPipeline pipeline;
  pipeline.AddPass<FuseBatchNorm2dInConv2d>();
  pipeline.AddPass<MergeLinears>();
  auto out = pipeline.Apply(original);
  ASSERT_OK(out);
  // Through text and back, with the same module.
  const std::string text = ir::PrintGraph(out->graph());
  auto parsed = ir::ParseGraph(text);
  ASSERT_OK(parsed);
  runtime::GraphModule reloaded(out->module(), std::move(parsed).value());
  EXPECT_EQ(
      GetTransformedNodes(reloaded.graph(), FuseBatchNorm2dInConv2d::kName)
          .size(),
      1u);
  ASSERT_TRUE(pipeline.Reverse(reloaded).value());
  EXPECT_EQ(DiffGraphModules(reloaded, original), "");
}

TEST(PipelineTest, MarksSurviveTheProtobufFormForReverse) {
  runtime::GraphModule original = MakeModel();
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  auto out = pipeline.Apply(original);
  ASSERT_OK(out);
  auto bytes = ir::SerializeGraph(out->graph());
  ASSERT_OK(bytes);
  auto back = ir::DeserializeGraph(*bytes);
  ASSERT_OK(back);
  runtime::GraphModule reloaded(out->module(), std::move(back).value());
  ASSERT_TRUE(pipeline.Reverse(reloaded).value());
  EXPECT_EQ(DiffGraphModules(reloaded, original), "");
}

TEST(PipelineTest, ReverseRefusesNonReversiblePasses) {
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<EliminateDeadCode>();
  EXPECT_FALSE(pipeline.is_reversible());
  auto out = pipeline.Apply(MakeModel());
  ASSERT_OK(out);
  auto undone = pipeline.Reverse(*out);
  ASSERT_FALSE(undone.ok());
  EXPECT_EQ(undone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(undone.status().message(), "eliminate-dead-code"));
}

TEST(PipelineTest, PipelinesNest) {
  runtime::GraphModule original = MakeModel();
  auto inner = std::make_unique<PassPipeline>("inner");
  inner->AddPass<MergeLinears>();
  PassPipeline outer("outer");
  outer.AddPass(std::move(inner));
  outer.AddPass<ChangeTrueDivToMulByInverse>();
  auto out = outer.Apply(original);
  ASSERT_OK(out);
  EXPECT_EQ(outer.records()[0].name, "inner");
  EXPECT_TRUE(outer.records()[0].changed);
  ASSERT_TRUE(outer.Reverse(*out).value());
  EXPECT_EQ(DiffGraphModules(*out, original), "");
}

TEST(TransformMarksTest, ApplicationIdsAndQueries) {
  runtime::GraphModule gm = MakeModel();
  ir::Graph& g = gm.graph();
  EXPECT_EQ(NextApplicationId(g), 1);
  MarkTransformed(g.FindNode("q"), "a", 1, {{"k", "v"}});
  MarkTransformed(g.FindNode("k"), "a", 1);
  MarkTransformed(g.FindNode("k"), "b", 2);
  MarkTransformed(g.FindNode("v"), "a", 3);
  EXPECT_EQ(NextApplicationId(g), 4);
  EXPECT_EQ(LatestApplicationId(g, "a"), 3);
  EXPECT_EQ(LatestApplicationId(g, "c"), std::nullopt);
  EXPECT_EQ(GetTransformedNodes(g, "a").size(), 3u);
  EXPECT_EQ(GetTransformedNodes(g, "a", 1).size(), 2u);
  const ir::TransformMark* m = FindMark(*g.FindNode("q"), "a");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->data.at("k"), "v");
  EXPECT_EQ(MarkApplicationId(*m), 1);
  const ir::TransformMark* ka = FindMark(*g.FindNode("k"), "a");
  EXPECT_FALSE(CheckLastMark(*g.FindNode("k"), *ka).ok());
  EXPECT_TRUE(
      CheckLastMark(*g.FindNode("k"), *FindMark(*g.FindNode("k"), "b")).ok());
  EXPECT_EQ(RemoveMarks(g.FindNode("k"), "b", 2), 1);
  EXPECT_OK(CheckLastMark(*g.FindNode("k"), *ka));
  // Marks are meta: the clone has them.
  auto clone = g.Clone();
  EXPECT_EQ(GetTransformedNodes(*clone, "a").size(), 3u);
}

}  // namespace
}  // namespace tracecut::transforms
