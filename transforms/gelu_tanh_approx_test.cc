#include "transforms/gelu_tanh_approx.h"

#include "gtest/gtest.h"
#include "transforms/fusion_math.h"
#include "transforms/test_util.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::MakeGraphModule;
using testing::MakeRoot;
using testing::Rand;
using testing::RunGraph;

runtime::GraphModule MakeGelus() {
  return MakeGraphModule(MakeRoot(), R"(graph {
  %x = placeholder[x]()
  %gelu = call_function[aten::gelu](%x, "none")
  %gelu_1 = call_function[aten::gelu](%gelu, "tanh")
  %output = output[output](%gelu_1)
})");
}

TEST(GeluTanhApproxTest, ApproximatesAndSaysSo) {
  runtime::GraphModule original = MakeGelus();
  GeluTanhApprox pass;
  EXPECT_FALSE(pass.preserves_computation());
  auto copy = original.Clone();
  ASSERT_TRUE(pass.Run(*copy).value());
  EXPECT_EQ(copy->graph().FindNode("gelu")->args()[1],
            ir::Argument::String("tanh"));
  EXPECT_EQ(GetTransformedNodes(copy->graph(), GeluTanhApprox::kName).size(),
            1u);
  std::vector<c10::IValue> in = {Rand({64, 64}, 1) * 4};
  auto before = RunGraph(original, in);
  auto after = RunGraph(*copy, in);
  ASSERT_TRUE(before.ok() && after.ok());
  const auto err = fusion_math::CompareTensors((*after)[0], (*before)[0]);
  // The tanh form is off by up to ~5e-4: visible, small.
  EXPECT_GT(err.max_abs, 1e-5);
  EXPECT_LT(err.max_abs, 1e-3);
  ASSERT_TRUE(pass.Reverse(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, original), "");
}

TEST(GeluTanhApproxTest, DoesNotFireOnTanhGelu) {
  runtime::GraphModule gm = MakeGraphModule(MakeRoot(), R"(graph {
  %x = placeholder[x]()
  %gelu = call_function[aten::gelu](%x, "tanh")
  %output = output[output](%gelu)
})");
  auto copy = gm.Clone();
  EXPECT_FALSE(GeluTanhApprox().Run(*copy).value());
}

}  // namespace
}  // namespace tracecut::transforms
