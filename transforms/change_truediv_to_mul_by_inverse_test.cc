#include "transforms/change_truediv_to_mul_by_inverse.h"

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/fusion_math.h"
#include "transforms/pipeline.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::MakeGraphModule;
using testing::MakeRoot;
using testing::Rand;
using testing::RunGraph;

// x / 8.0 (scalar), x / _tensor_constant0 (traced form, value 4), and
// x / 3.0 and x / _tensor_constant1 (value 3): only the powers of two are
// exact.
runtime::GraphModule MakeDivs() {
  torch::jit::Module root = MakeRoot();
  root.register_buffer("_tensor_constant0", torch::tensor(4.0, at::kDouble));
  root.register_buffer("_tensor_constant1", torch::tensor(3.0, at::kDouble));
  return MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %div = call_function[aten::div.Scalar](%x, 8.0) meta{out=[tensor([5, 7], float32, "cpu")]}
  %_tensor_constant0 = get_attr[_tensor_constant0]()
  %div_1 = call_function[aten::div.Tensor](%div, %_tensor_constant0)
  %div_2 = call_function[aten::div.Scalar](%div_1, 3.0)
  %_tensor_constant1 = get_attr[_tensor_constant1]()
  %div_3 = call_function[aten::div.Tensor](%div_2, %_tensor_constant1)
  %div_4 = call_function[aten::div.Tensor_mode](%div_3, %_tensor_constant0, "floor")
  %output = output[output]((%div_1, %div_3, %div_4))
})");
}

TEST(ChangeTrueDivTest, RewritesPowersOfTwoExactly) {
  runtime::GraphModule original = MakeDivs();
  Pipeline pipeline;
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  EXPECT_TRUE(pipeline.preserves_computation());
  auto out = pipeline.Apply(original);
  ASSERT_OK(out);
  const ir::Graph& g = out->graph();
  EXPECT_EQ(g.FindNode("div")->target(), "aten::mul.Scalar")
      << ir::PrintGraph(g);
  EXPECT_EQ(g.FindNode("div")->args()[1], ir::Argument::Double(0.125));
  EXPECT_EQ(g.FindNode("div_1")->target(), "aten::mul.Tensor");
  EXPECT_EQ(g.FindNode("div_1")->args()[1].node()->target(),
            "_tensor_constant0_reciprocal");
  EXPECT_EQ(g.FindNode("div_2")->target(), "aten::div.Scalar");
  EXPECT_EQ(g.FindNode("div_3")->target(), "aten::div.Tensor");
  EXPECT_EQ(g.FindNode("div_4")->target(), "aten::div.Tensor_mode");
  EXPECT_EQ(out->GetTensor("_tensor_constant0_reciprocal")->item<double>(),
            0.25);

  for (uint64_t seed : {1, 2, 3}) {
    std::vector<c10::IValue> in = {Rand({5, 7}, seed) * 1000};
    auto before = RunGraph(original, in);
    auto after = RunGraph(*out, in);
    ASSERT_TRUE(before.ok() && after.ok()) << after.status();
    // Bit for bit.
    for (size_t i = 0; i < before->size(); ++i) {
      EXPECT_TRUE(fusion_math::BitwiseEqual((*after)[i], (*before)[i])) << i;
    }
  }
  ASSERT_TRUE(pipeline.Reverse(*out).value());
  EXPECT_EQ(DiffGraphModules(*out, original), "");
}

TEST(ChangeTrueDivTest, InexactModeIsFlaggedAndCloseToOneUlp) {
  runtime::GraphModule original = MakeDivs();
  ChangeTrueDivToMulByInverse pass(/*allow_inexact=*/true);
  EXPECT_FALSE(pass.preserves_computation());
  auto copy = original.Clone();
  ASSERT_TRUE(pass.Run(*copy).value());
  EXPECT_EQ(copy->graph().FindNode("div_2")->target(), "aten::mul.Scalar");
  EXPECT_EQ(copy->graph().FindNode("div_3")->target(), "aten::mul.Tensor");
  EXPECT_EQ(copy->graph().FindNode("div_4")->target(), "aten::div.Tensor_mode");
  std::vector<c10::IValue> in = {Rand({5, 7}, 4) * 1000};
  auto before = RunGraph(original, in);
  auto after = RunGraph(*copy, in);
  ASSERT_TRUE(before.ok() && after.ok());
  // x / 3 versus x * fl(1/3): within a couple of fp32 ulps.
  EXPECT_LT(testing::MaxRelError({(*after)[1]}, {(*before)[1]}), 3e-7);
  ASSERT_TRUE(pass.Reverse(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, original), "");
}

TEST(ChangeTrueDivTest, DoesNotFireOnNonConstantDivisors) {
  torch::jit::Module root = MakeRoot();
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %y = placeholder[y]()
  %div = call_function[aten::div.Tensor](%x, %y)
  %div_1 = call_function[aten::div.Scalar](%x, 0.0)
  %output = output[output]((%div, %div_1))
})");
  auto copy = gm.Clone();
  EXPECT_FALSE(ChangeTrueDivToMulByInverse(true).Run(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, gm), "");
}

}  // namespace
}  // namespace tracecut::transforms
