#include "transforms/fuse_batchnorm1d_in_linear.h"

#include <string>

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/pass_pipeline.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::MakeBatchNorm;
using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;
using testing::MaxRelError;
using testing::Rand;
using testing::RunGraph;

// fc1 (6 -> 8) -> bn1 (8) on [N, 6]; bn2 (8) -> fc2 (8 -> 3) on [N, 8];
// seq_fc (16 -> 8) -> seq_bn (8) on [N, 8, 16]: the 3-D trap, where the
// channel count matches the linear's output features by coincidence.
runtime::GraphModule MakeMlpBn(bool with_meta = true) {
  torch::jit::Module root = MakeRoot();
  root.register_module("fc1", MakeLinear(root, 6, 8, true, 1));
  root.register_module("bn1", MakeBatchNorm(root, 8, true, false, 2));
  root.register_module("bn2", MakeBatchNorm(root, 8, false, false, 3));
  root.register_module("fc2", MakeLinear(root, 8, 3, false, 4));
  root.register_module("seq_fc", MakeLinear(root, 16, 8, true, 5));
  root.register_module("seq_bn", MakeBatchNorm(root, 8, true, false, 6));
  auto meta = [&](const char* shape) {
    return with_meta ? std::string(" meta{out=[tensor([") + shape +
                           "], float32, \"cpu\")]}"
                     : std::string();
  };
  return MakeGraphModule(root,
                         "graph {\n"
                         "  %x = placeholder[x]()\n"
                         "  %s = placeholder[s]()\n"
                         "  %fc1 = call_module[fc1](%x)" +
                             meta("4, 8") +
                             "\n"
                             "  %bn1 = call_module[bn1](%fc1)" +
                             meta("4, 8") +
                             "\n"
                             "  %relu = call_function[aten::relu](%bn1)" +
                             meta("4, 8") +
                             "\n"
                             "  %bn2 = call_module[bn2](%relu)" +
                             meta("4, 8") +
                             "\n"
                             "  %fc2 = call_module[fc2](%bn2)" +
                             meta("4, 3") +
                             "\n"
                             "  %seq_fc = call_module[seq_fc](%s)" +
                             meta("4, 8, 8") +
                             "\n"
                             "  %seq_bn = call_module[seq_bn](%seq_fc)" +
                             meta("4, 8, 8") +
                             "\n"
                             "  %output = output[output]((%fc2, %seq_bn))\n"
                             "}\n");
}

std::vector<c10::IValue> Inputs(uint64_t seed) {
  return {Rand({4, 6}, seed) * 2, Rand({4, 8, 16}, seed + 1) * 2};
}

TEST(FuseBatchNorm1dInLinearTest, FusesBothOrdersOnTwoDInputsOnly) {
  runtime::GraphModule original = MakeMlpBn();
  PassPipeline pipeline;
  pipeline.AddPass<FuseBatchNorm1dInLinear>();
  auto fused = pipeline.Apply(original);
  ASSERT_OK(fused);
  const ir::Graph& g = fused->graph();
  // Linear -> BN: the fused call keeps fc1's name.
  EXPECT_EQ(g.FindNode("bn1"), nullptr) << ir::PrintGraph(g);
  EXPECT_EQ(g.FindNode("fc1")->target(), "fc1_bn1_fused");
  EXPECT_EQ(g.FindNode("relu")->args()[0].node()->name(), "fc1");
  // BN -> Linear: the fused call reads the BN's input and keeps fc2's name.
  EXPECT_EQ(g.FindNode("bn2"), nullptr);
  EXPECT_EQ(g.FindNode("fc2")->target(), "fc2_bn2_fused");
  EXPECT_EQ(g.FindNode("fc2")->args()[0].node()->name(), "relu");
  // 3-D: left alone.
  EXPECT_EQ(g.FindNode("seq_bn")->target(), "seq_bn");
  EXPECT_EQ(g.FindNode("seq_fc")->target(), "seq_fc");

  for (uint64_t seed : {31, 32}) {
    auto before = RunGraph(original, Inputs(seed));
    auto after = RunGraph(*fused, Inputs(seed));
    ASSERT_OK(before);
    ASSERT_OK(after);
    EXPECT_LT(MaxRelError(*after, *before), 1e-5);
  }
  auto reversed = pipeline.Reverse(*fused);
  ASSERT_OK(reversed);
  EXPECT_EQ(DiffGraphModules(*fused, original), "");
}

TEST(FuseBatchNorm1dInLinearTest, DoesNotFireWithoutKnownShapes) {
  runtime::GraphModule gm = MakeMlpBn(/*with_meta=*/false);
  auto copy = gm.Clone();
  EXPECT_FALSE(FuseBatchNorm1dInLinear().Run(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, gm), "");
}

// What fusing the 3-D pair would do: wrong numbers, which is why the pass
// refuses it.
TEST(FuseBatchNorm1dInLinearTest, ThreeDFoldWouldBeWrong) {
  runtime::GraphModule gm = MakeMlpBn();
  ir::Graph& g = gm.graph();
  // Pretend the pair is 2-D: the pass then fuses it...
  g.FindNode("seq_fc")->meta().outputs[0].shape = {4, 8};
  auto copy = gm.Clone();
  ASSERT_TRUE(FuseBatchNorm1dInLinear().Run(*copy).value());
  ASSERT_EQ(copy->graph().FindNode("seq_bn"), nullptr);
  // ...and the 3-D output no longer matches.
  auto before = RunGraph(gm, Inputs(5));
  auto after = RunGraph(*copy, Inputs(5));
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_GT(MaxRelError({(*after)[1]}, {(*before)[1]}), 1e-2);
}

}  // namespace
}  // namespace tracecut::transforms
