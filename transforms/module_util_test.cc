#include "transforms/module_util.h"

#include <memory>

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/pair_fusion.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::MakeBatchNorm;
using testing::MakeConv2d;
using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;

TEST(ModuleUtilTest, ClassifiesLeaves) {
  torch::jit::Module root = MakeRoot();
  EXPECT_EQ(ClassifyLeaf(MakeLinear(root, 2, 3, true, 1)), LeafKind::kLinear);
  EXPECT_EQ(ClassifyLeaf(testing::MakeConv1D(root, 2, 3, 1)),
            LeafKind::kConv1D);
  EXPECT_EQ(ClassifyLeaf(MakeConv2d(root, 2, 3, 3, true, 1, 1)),
            LeafKind::kConv2d);
  EXPECT_EQ(ClassifyLeaf(MakeBatchNorm(root, 3, true, true, 1)),
            LeafKind::kBatchNorm2d);
  EXPECT_EQ(ClassifyLeaf(MakeBatchNorm(root, 3, true, false, 1)),
            LeafKind::kBatchNorm1d);
  EXPECT_EQ(ClassifyLeaf(root), LeafKind::kOther);
  EXPECT_EQ(ModuleType(MakeLinear(root, 2, 3, true, 1)),
            "torch.nn.modules.linear.Linear");
}

TEST(ModuleUtilTest, ReadsLinear) {
  torch::jit::Module root = MakeRoot();
  auto with_bias = ReadLinear(MakeLinear(root, 2, 3, true, 1));
  ASSERT_OK(with_bias);
  EXPECT_EQ(with_bias->in_features, 2);
  EXPECT_EQ(with_bias->out_features, 3);
  EXPECT_TRUE(with_bias->bias.has_value());
  auto without = ReadLinear(MakeLinear(root, 2, 3, false, 1));
  ASSERT_OK(without);
  EXPECT_FALSE(without->bias.has_value());
  auto conv1d = ReadLinear(testing::MakeConv1D(root, 2, 5, 1));
  ASSERT_OK(conv1d);
  EXPECT_TRUE(conv1d->conv1d);
  EXPECT_EQ(conv1d->in_features, 2);
  EXPECT_EQ(conv1d->out_features, 5);
}

TEST(ModuleUtilTest, ReadsConv2dFromForwardGraph) {
  torch::jit::Module root = MakeRoot();
  auto conv = ReadConv2d(MakeConv2d(root, 3, 4, 3, false, 1, 1));
  ASSERT_OK(conv);
  EXPECT_EQ(conv->padding, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(conv->stride, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(conv->groups, 1);
  EXPECT_FALSE(conv->bias.has_value());
}

// torch.jit.trace's form: aten::_convolution with every argument constant.
TEST(ModuleUtilTest, ReadsTracedConvolution) {
  torch::jit::Module root = MakeRoot();
  torch::jit::Module m(
      c10::QualifiedName("__torch__.torch.nn.modules.conv.Conv2d"),
      root._ivalue()->compilation_unit(), /*shouldMangle=*/true);
  m.register_attribute("training", c10::BoolType::get(), false);
  m.register_parameter("weight", torch::ones({4, 1, 3, 3}), false);
  m.define(R"(
def forward(self, x: Tensor) -> Tensor:
    return torch._convolution(x, self.weight, None, [2, 2], [0, 1], [1, 1], False, [0, 0], 2, False, False, True, True)
)");
  auto conv = ReadConv2d(m);
  ASSERT_OK(conv);
  EXPECT_EQ(conv->stride, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(conv->padding, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(conv->groups, 2);
  EXPECT_FALSE(conv->bias.has_value());
}

TEST(ModuleUtilTest, ReadsBatchNorm) {
  torch::jit::Module root = MakeRoot();
  auto affine = ReadBatchNorm(MakeBatchNorm(root, 3, true, true, 1));
  ASSERT_OK(affine);
  EXPECT_TRUE(affine->weight.has_value());
  EXPECT_DOUBLE_EQ(affine->eps, 1e-5);
  auto plain = ReadBatchNorm(MakeBatchNorm(root, 3, false, false, 1));
  ASSERT_OK(plain);
  EXPECT_FALSE(plain->weight.has_value());
  EXPECT_FALSE(plain->bias.has_value());
}

// torch.jit.script's form: eps a class constant, training an attribute.
TEST(ModuleUtilTest, ReadsScriptedBatchNormConstants) {
  torch::jit::Module root = MakeRoot();
  torch::jit::Module bn = MakeBatchNorm(root, 3, true, true, 1);
  bn.type()->addConstant("eps", 0.5);
  auto params = ReadBatchNorm(bn);
  ASSERT_OK(params);
  EXPECT_DOUBLE_EQ(params->eps, 0.5);
  bn.setattr("training", true);
  EXPECT_EQ(ReadBatchNorm(bn).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ModuleUtilTest, AddsAndRemovesSubmodulesUnderSharedTypes) {
  torch::jit::Module root = MakeRoot();
  // Two blocks of one type, as torch.jit.script shares types.
  torch::jit::Module block = MakeRoot("Block");
  block.register_module("fc", MakeLinear(root, 2, 2, true, 1));
  // A second instance of the same type.
  torch::jit::Module shared(block._ivalue()->compilation_unit(), block.type());
  shared.register_attribute("training", c10::BoolType::get(), false);
  torch::jit::Module fc = block.attr("fc").toModule();
  torch::jit::Module fc2(fc._ivalue()->compilation_unit(), fc.type());
  fc2.setattr("training", false);
  fc2.setattr("weight", torch::ones({2, 2}));
  fc2.setattr("bias", torch::ones({2}));
  shared.register_module("fc", fc2);
  root.register_module("b0", block);
  root.register_module("b1", shared);
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %output = output[output](%x)
})");
  ASSERT_EQ(gm.GetSubmodule("b0")->type(), gm.GetSubmodule("b1")->type());
  auto path =
      AddSubmodule(gm, "b0", "fc-merged", MakeLinear(root, 2, 4, true, 3));
  ASSERT_OK(path);
  EXPECT_EQ(*path, "b0.fc_merged");
  // b0 got a private type; b1 is unaffected.
  EXPECT_NE(gm.GetSubmodule("b0")->type(), gm.GetSubmodule("b1")->type());
  EXPECT_FALSE(gm.GetSubmodule("b1")->hasattr("fc_merged"));
  EXPECT_OK(gm.GetSubmodule("b0.fc_merged"));
  // A second one gets a fresh name.
  auto again =
      AddSubmodule(gm, "b0", "fc_merged", MakeLinear(root, 2, 4, true, 3));
  ASSERT_OK(again);
  EXPECT_EQ(*again, "b0.fc_merged_1");
  ASSERT_OK(RemoveAttribute(gm, "b0.fc_merged"));
  EXPECT_FALSE(gm.GetSubmodule("b0.fc_merged").ok());
  EXPECT_OK(gm.GetSubmodule("b0.fc_merged_1"));
  EXPECT_OK(gm.GetSubmodule("b0.fc"));
  EXPECT_FALSE(RemoveAttribute(gm, "b0.nothing").ok());
}

TEST(ModuleUtilTest, Paths) {
  EXPECT_EQ(SplitParentPath("a.b.c"),
            (std::pair<std::string, std::string>{"a.b", "c"}));
  EXPECT_EQ(SplitParentPath("c"),
            (std::pair<std::string, std::string>{"", "c"}));
  EXPECT_EQ(JoinPath("", "c"), "c");
  EXPECT_EQ(JoinPath("a", "c"), "a.c");
}

TEST(ModuleUtilTest, Scopes) {
  ir::Scope s({{"", "Root"}, {"a", "A"}, {"a.fc", "Linear"}});
  EXPECT_EQ(ReplaceInnermost(s, "a.x", "X").path(), "a.x");
  EXPECT_EQ(ReplaceInnermost(s, "a.x", "X").depth(), 3u);
  EXPECT_EQ(ParentScope(s).path(), "a");
  EXPECT_EQ(ReplaceInnermost(ir::Scope(), "x", "X").depth(), 1u);
}

}  // namespace
}  // namespace tracecut::transforms
