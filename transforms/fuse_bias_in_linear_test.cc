#include "transforms/fuse_bias_in_linear.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::ExpectNoRewrite;
using testing::ExpectRewrite;
using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;
using testing::MaxRelError;
using testing::Rand;
using testing::RunGraph;
using util::testing::IsOkAndHolds;

torch::jit::Module TwoLinearsRoot() {
  torch::jit::Module root = MakeRoot();
  torch::jit::Module block = MakeRoot("Block");
  block.register_module("fc", MakeLinear(root, 5, 7, true, 1));
  block.register_module("proj", MakeLinear(root, 7, 3, false, 2));
  root.register_module("block", block);
  return root;
}

constexpr char kTwoLinears[] = R"(graph {
  %x = placeholder[x]()
  %fc = call_module[block.fc](%x) scope[:"Root", block:"Block", block.fc:"torch.nn.modules.linear.Linear"] meta{out=[tensor([2, 4, 7], float32, "cpu")]}
  %proj = call_module[block.proj](%fc) scope[:"Root", block:"Block", block.proj:"torch.nn.modules.linear.Linear"]
  %output = output[output](%proj)
})";

// fc's input padded with a column of ones (in block's scope), fc replaced by
// a bias-free linear whose last weight column is the bias; proj has no bias.
constexpr char kFused[] = R"(graph {
  %x = placeholder[x]()
  %constant_pad_nd = call_function[aten::constant_pad_nd](%x, [0, 1], 1.0) scope[:"Root", block:"Block"]
  %fc = call_module[block.fc_bias_fused](%constant_pad_nd) scope[:"Root", block:"Block", block.fc_bias_fused:"torch.nn.modules.linear.Linear"] meta{out=[tensor([2, 4, 7], float32, "cpu")]}
  %proj = call_module[block.proj](%fc) scope[:"Root", block:"Block", block.proj:"torch.nn.modules.linear.Linear"]
  %output = output[output](%proj)
})";

TEST(FuseBiasInLinearTest, FoldsBiasIntoWeightOnPaddedInput) {
  std::optional<runtime::GraphModule> fused;
  ASSERT_TRUE(ExpectRewrite(TwoLinearsRoot(), kTwoLinears, FuseBiasInLinear(),
                            kFused, &fused));
  ASSERT_OK_AND_ASSIGN(torch::Tensor w,
                       fused->GetTensor("block.fc_bias_fused.weight"));
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{7, 6}));
  EXPECT_TRUE(
      fused->GetSubmodule("block.fc_bias_fused")->attr("bias").isNone());

  runtime::GraphModule original =
      MakeGraphModule(TwoLinearsRoot(), kTwoLinears);
  std::vector<c10::IValue> in = {Rand({2, 4, 5}, 41)};
  ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> before,
                       RunGraph(original, in));
  ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> after, RunGraph(*fused, in));
  EXPECT_LT(MaxRelError(after, before), 1e-5);

  ASSERT_THAT(FuseBiasInLinear().Reverse(*fused), IsOkAndHolds(true));
  EXPECT_EQ(DiffGraphModules(*fused, original), "");
}

TEST(FuseBiasInLinearTest, DoesNotFireWithoutBias) {
  torch::jit::Module root = MakeRoot();
  root.register_module("fc", MakeLinear(root, 5, 7, false, 1));
  root.register_module("c1d", testing::MakeConv1D(root, 5, 7, 2));
  EXPECT_TRUE(ExpectNoRewrite(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[fc](%x)
  %c1d = call_module[c1d](%x)
  %output = output[output]((%fc, %c1d))
})",
                              FuseBiasInLinear()));
}

}  // namespace
}  // namespace tracecut::transforms
