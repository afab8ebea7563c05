#include "transforms/fuse_bias_in_linear.h"

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/pipeline.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;
using testing::MaxRelError;
using testing::Rand;
using testing::RunGraph;

runtime::GraphModule MakeTwoLinears() {
  torch::jit::Module root = MakeRoot();
  torch::jit::Module block = MakeRoot("Block");
  block.register_module("fc", MakeLinear(root, 5, 7, true, 1));
  block.register_module("proj", MakeLinear(root, 7, 3, false, 2));
  root.register_module("block", block);
  return MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[block.fc](%x) scope[:"Root", block:"Block", block.fc:"torch.nn.modules.linear.Linear"] meta{out=[tensor([2, 4, 7], float32, "cpu")]}
  %proj = call_module[block.proj](%fc) scope[:"Root", block:"Block", block.proj:"torch.nn.modules.linear.Linear"]
  %output = output[output](%proj)
})");
}

TEST(FuseBiasInLinearTest, FoldsBiasIntoWeightOnPaddedInput) {
  runtime::GraphModule original = MakeTwoLinears();
  Pipeline pipeline;
  pipeline.AddPass<FuseBiasInLinear>();
  auto fused = pipeline.Apply(original);
  ASSERT_OK(fused);
  const ir::Graph& g = fused->graph();
  ir::Node* fc = g.FindNode("fc");
  EXPECT_EQ(fc->target(), "block.fc_bias_fused") << ir::PrintGraph(g);
  EXPECT_EQ(fc->scope().path(), "block.fc_bias_fused");
  ir::Node* pad = fc->args()[0].node();
  EXPECT_EQ(pad->target(), "aten::constant_pad_nd");
  EXPECT_EQ(pad->scope().path(), "block");
  // proj has no bias: untouched.
  EXPECT_EQ(g.FindNode("proj")->target(), "block.proj");
  auto w = fused->GetTensor("block.fc_bias_fused.weight");
  ASSERT_OK(w);
  EXPECT_EQ(w->sizes(), (std::vector<int64_t>{7, 6}));
  EXPECT_TRUE(
      fused->GetSubmodule("block.fc_bias_fused")->attr("bias").isNone());

  std::vector<c10::IValue> in = {Rand({2, 4, 5}, 41)};
  auto before = RunGraph(original, in);
  auto after = RunGraph(*fused, in);
  ASSERT_TRUE(before.ok() && after.ok()) << after.status();
  EXPECT_LT(MaxRelError(*after, *before), 1e-5);

  ASSERT_TRUE(pipeline.Reverse(*fused).value());
  EXPECT_EQ(DiffGraphModules(*fused, original), "");
}

TEST(FuseBiasInLinearTest, DoesNotFireWithoutBias) {
  torch::jit::Module root = MakeRoot();
  root.register_module("fc", MakeLinear(root, 5, 7, false, 1));
  root.register_module("c1d", testing::MakeConv1D(root, 5, 7, 2));
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[fc](%x)
  %c1d = call_module[c1d](%x)
  %output = output[output]((%fc, %c1d))
})");
  auto copy = gm.Clone();
  EXPECT_FALSE(FuseBiasInLinear().Run(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, gm), "");
}

}  // namespace
}  // namespace tracecut::transforms
