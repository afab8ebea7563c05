#include "tracer/leaf_policy.h"

#include "gtest/gtest.h"

namespace tracecut::tracer {
namespace {

TEST(LeafPolicyTest, PathsWithPyTorchNames) {
  LeafPolicy p = LeafPolicy::None();
  p.AddTypeOrPath("block1-0");
  EXPECT_TRUE(p.IsLeaf("block1-0", "m.ResBottleneckBlock"));
  // A path pattern names a path from the root, not a segment anywhere.
  EXPECT_FALSE(
      p.IsLeaf("trunk_output.block1.block1-0", "m.ResBottleneckBlock"));
  p.AddTypeOrPath("trunk_output.*.block1-0").AddTypeOrPath("sp ace");
  EXPECT_TRUE(p.IsLeaf("trunk_output.block1.block1-0", "m.ResBottleneckBlock"));
  EXPECT_FALSE(
      p.IsLeaf("trunk_output.block1.block1-1", "m.ResBottleneckBlock"));
  EXPECT_TRUE(p.IsLeaf("sp ace", "m.Block"));
}

TEST(LeafPolicyTest, DefaultLeavesAreTorchNnBuiltinsAndConv1D) {
  LeafPolicy p = LeafPolicy::Default();
  EXPECT_TRUE(p.IsLeaf("fc", "torch.nn.modules.linear.Linear"));
  EXPECT_TRUE(p.IsLeaf("emb", "torch.nn.modules.sparse.Embedding"));
  EXPECT_TRUE(p.IsLeaf("q", "torch.ao.nn.quantized.modules.linear.Linear"));
  EXPECT_FALSE(p.IsLeaf("seq", "torch.nn.modules.container.Sequential"));
  EXPECT_FALSE(p.IsLeaf("list", "torch.nn.modules.container.ModuleList"));
  EXPECT_FALSE(p.IsLeaf("dict", "torch.nn.modules.container.ModuleDict"));
  EXPECT_TRUE(p.IsLeaf("h.0.attn.c_attn", "transformers.pytorch_utils.Conv1D"));
  EXPECT_TRUE(p.IsLeaf("x", "pytorch_utils.Conv1D"));
  EXPECT_FALSE(p.IsLeaf("model", "transformers.models.llama.LlamaModel"));
  // torch.fx's default has no Conv1D.
  EXPECT_FALSE(LeafPolicy::TorchNn().IsLeaf("x", "pytorch_utils.Conv1D"));
  EXPECT_TRUE(
      LeafPolicy::TorchNn().IsLeaf("fc", "torch.nn.modules.linear.Linear"));
  EXPECT_FALSE(
      LeafPolicy::None().IsLeaf("fc", "torch.nn.modules.linear.Linear"));
}

TEST(LeafPolicyTest, ByTypeShortQualifiedOrPattern) {
  LeafPolicy p = LeafPolicy::None();
  p.AddType("LlamaRMSNorm");
  EXPECT_TRUE(p.IsLeaf(
      "model.norm", "transformers.models.llama.modeling_llama.LlamaRMSNorm"));
  EXPECT_FALSE(p.IsLeaf("model.norm", "x.NotLlamaRMSNorm"));
  LeafPolicy q = LeafPolicy::None();
  q.AddType("transformers.models.llama.modeling_llama.LlamaMLP");
  EXPECT_TRUE(
      q.IsLeaf("m", "transformers.models.llama.modeling_llama.LlamaMLP"));
  EXPECT_FALSE(q.IsLeaf("m", "other.LlamaMLP"));
  LeafPolicy r = LeafPolicy::None();
  r.AddType("*RMSNorm");
  EXPECT_TRUE(r.IsLeaf("n", "a.b.MistralRMSNorm"));
}

TEST(LeafPolicyTest, ByPathGlobPredicateAndEither) {
  LeafPolicy p = LeafPolicy::None();
  p.AddPath("model.layers.*.mlp");
  EXPECT_TRUE(p.IsLeaf("model.layers.0.mlp", "LlamaMLP"));
  EXPECT_FALSE(p.IsLeaf("model.layers.0.self_attn", "LlamaAttention"));
  // A path pattern does not match types.
  EXPECT_FALSE(p.IsLeaf("x", "model.layers.0.mlp"));

  LeafPolicy q = LeafPolicy::None();
  q.AddPredicate([](absl::string_view path, absl::string_view type) {
    return path.size() > 3 && type == "T";
  });
  EXPECT_TRUE(q.IsLeaf("abcd", "T"));
  EXPECT_FALSE(q.IsLeaf("abc", "T"));

  LeafPolicy e = LeafPolicy::None();
  e.AddTypeOrPath("encoder.block.gate").AddTypeOrPath("DynamicGate");
  EXPECT_TRUE(e.IsLeaf("encoder.block.gate", "m.Other"));
  EXPECT_TRUE(e.IsLeaf("elsewhere", "m.DynamicGate"));
  EXPECT_FALSE(e.IsLeaf("encoder.block", "m.DynamicBlock"));
}

}  // namespace
}  // namespace tracecut::tracer
