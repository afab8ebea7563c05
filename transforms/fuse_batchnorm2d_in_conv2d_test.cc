#include "transforms/fuse_batchnorm2d_in_conv2d.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/pass_pipeline.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::MakeBatchNorm;
using testing::MakeConv2d;
using testing::MakeGraphModule;
using testing::MakeRoot;
using testing::MaxRelError;
using testing::Rand;
using testing::RunGraph;
using util::testing::IsOkAndHolds;

constexpr char kGraph[] = R"(graph {
  %x = placeholder[x]()
  %conv = call_module[conv](%x) scope[:"Root", conv:"torch.nn.modules.conv.Conv2d"] meta{out=[tensor([2, 6, 7, 7], float32, "cpu")]}
  %bn = call_module[bn](%conv) scope[:"Root", bn:"torch.nn.modules.batchnorm.BatchNorm2d"] meta{out=[tensor([2, 6, 7, 7], float32, "cpu")]}
  %relu = call_function[aten::relu](%bn)
  %output = output[output](%relu)
})";

runtime::GraphModule MakeConvBn(bool conv_bias, bool affine,
                                at::ScalarType dtype = at::kFloat) {
  torch::jit::Module root = MakeRoot();
  root.register_module("conv",
                       MakeConv2d(root, 3, 6, 3, conv_bias, 1, 1, dtype));
  root.register_module("bn", MakeBatchNorm(root, 6, affine, true, 2, dtype));
  return MakeGraphModule(root, kGraph);
}

class FuseConvBnTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {
};

TEST_P(FuseConvBnTest, FoldsAndMatchesWithin1e5) {
  const auto [conv_bias, affine] = GetParam();
  runtime::GraphModule original = MakeConvBn(conv_bias, affine);
  PassPipeline pipeline;
  pipeline.AddPass<FuseBatchNorm2dInConv2d>();
  auto fused = pipeline.Apply(original);
  ASSERT_OK(fused);
  const ir::Graph& g = fused->graph();
  EXPECT_EQ(g.FindNode("bn"), nullptr) << ir::PrintGraph(g);
  ir::Node* conv = g.FindNode("conv");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->target(), "conv_bn_fused");
  EXPECT_EQ(conv->scope().path(), "conv_bn_fused");
  EXPECT_EQ(g.FindNode("relu")->args()[0].node(), conv);
  ASSERT_NE(FindMark(*conv, FuseBatchNorm2dInConv2d::kName), nullptr);
  // Fused parameters stay fp32; the fused conv always has a bias.
  EXPECT_EQ(fused->GetTensor("conv_bn_fused.weight")->scalar_type(),
            at::kFloat);
  EXPECT_OK(fused->GetTensor("conv_bn_fused.bias"));

  for (uint64_t seed : {21, 22}) {
    std::vector<c10::IValue> in = {Rand({2, 3, 7, 7}, seed) * 3};
    auto before = RunGraph(original, in);
    auto after = RunGraph(*fused, in);
    ASSERT_OK(before);
    ASSERT_OK(after);
    EXPECT_LT(MaxRelError(*after, *before), 1e-5);
  }

  auto reversed = pipeline.Reverse(*fused);
  ASSERT_OK(reversed);
  EXPECT_TRUE(*reversed);
  EXPECT_EQ(DiffGraphModules(*fused, original), "");
}

INSTANTIATE_TEST_SUITE_P(ConvBiasAndAffine, FuseConvBnTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Bool()));

TEST(FuseBatchNorm2dInConv2dTest, KeepsBFloat16) {
  runtime::GraphModule original = MakeConvBn(true, true, at::kBFloat16);
  std::vector<c10::IValue> in = {Rand({2, 3, 7, 7}, 3, at::kBFloat16)};
  // LibTorch's CPU conv2d takes bf16 (oneDNN, or its reference kernel
  // elsewhere), so the unfused model runs everywhere.
  ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> before,
                       RunGraph(original, in));
  ASSERT_OK_AND_ASSIGN(runtime::GraphModule copy, original.Clone());
  ASSERT_THAT(FuseBatchNorm2dInConv2d().Run(copy), IsOkAndHolds(true));
  // The fusion keeps the model's dtype.
  EXPECT_EQ(copy.GetTensor("conv_bn_fused.weight")->scalar_type(),
            at::kBFloat16);
  EXPECT_EQ(copy.GetTensor("conv_bn_fused.bias")->scalar_type(), at::kBFloat16);
  ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> after, RunGraph(copy, in));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].scalar_type(), at::kBFloat16);
  // The unfused bf16 model rounds after the conv and again after the BN;
  // the fused one rounds its parameters once: a few bf16 ulps apart.
  EXPECT_LT(MaxRelError(after, before), 3e-2);
}

TEST(FuseBatchNorm2dInConv2dTest, DoesNotFireWhenConvOutputIsShared) {
  torch::jit::Module root = MakeRoot();
  root.register_module("conv", MakeConv2d(root, 3, 6, 3, true, 1, 1));
  root.register_module("bn", MakeBatchNorm(root, 6, true, true, 2));
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %conv = call_module[conv](%x)
  %bn = call_module[bn](%conv)
  %add = call_function[aten::add.Tensor](%bn, %conv, 1)
  %output = output[output](%add)
})");
  auto copy = gm.Clone();
  EXPECT_FALSE(FuseBatchNorm2dInConv2d().Run(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, gm), "");
}

TEST(FuseBatchNorm2dInConv2dTest, DoesNotFireWithoutConvOrInTraining) {
  torch::jit::Module root = MakeRoot();
  root.register_module("conv", MakeConv2d(root, 3, 6, 3, true, 1, 1));
  root.register_module("bn", MakeBatchNorm(root, 6, true, true, 2));
  // A BatchNorm traced in training mode (batch statistics).
  torch::jit::Module bn_train(
      c10::QualifiedName("__torch__.torch.nn.modules.batchnorm.BatchNorm2d"),
      root._ivalue()->compilation_unit(), /*shouldMangle=*/true);
  bn_train.register_attribute("training", c10::BoolType::get(), true);
  bn_train.register_buffer("running_mean", torch::zeros({6}));
  bn_train.register_buffer("running_var", torch::ones({6}));
  bn_train.define(R"(
def forward(self, input: Tensor) -> Tensor:
    return torch.batch_norm(input, None, None, self.running_mean, self.running_var, True, 0.1, 1e-05, False)
)");
  root.register_module("bn_train", bn_train);
  root.register_module("conv2", MakeConv2d(root, 3, 6, 3, true, 1, 4));
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %relu = call_function[aten::relu](%x)
  %conv = call_module[conv](%relu)
  %relu_1 = call_function[aten::relu](%conv)
  %bn = call_module[bn](%relu_1)
  %conv2 = call_module[conv2](%x)
  %bn_train = call_module[bn_train](%conv2)
  %output = output[output]((%bn, %bn_train))
})");
  auto copy = gm.Clone();
  EXPECT_FALSE(FuseBatchNorm2dInConv2d().Run(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, gm), "");
}

}  // namespace
}  // namespace tracecut::transforms
