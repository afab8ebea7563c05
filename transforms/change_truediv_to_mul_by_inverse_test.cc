#include "transforms/change_truediv_to_mul_by_inverse.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/fusion_math.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::ExpectNoRewrite;
using testing::ExpectRewrite;
using testing::MakeGraphModule;
using testing::MakeRoot;
using testing::Rand;
using testing::RunGraph;
using util::testing::IsOkAndHolds;

// x / 8.0 (scalar), x / _tensor_constant0 (traced form, value 4), and
// x / 3.0 and x / _tensor_constant1 (value 3): only the powers of two are
// exact.
torch::jit::Module DivsRoot() {
  torch::jit::Module root = MakeRoot();
  root.register_buffer("_tensor_constant0", torch::tensor(4.0, at::kDouble));
  root.register_buffer("_tensor_constant1", torch::tensor(3.0, at::kDouble));
  return root;
}

constexpr char kDivs[] = R"(graph {
  %x = placeholder[x]()
  %div = call_function[aten::div.Scalar](%x, 8.0) meta{out=[tensor([5, 7], float32, "cpu")]}
  %_tensor_constant0 = get_attr[_tensor_constant0]()
  %div_1 = call_function[aten::div.Tensor](%div, %_tensor_constant0)
  %div_2 = call_function[aten::div.Scalar](%div_1, 3.0)
  %_tensor_constant1 = get_attr[_tensor_constant1]()
  %div_3 = call_function[aten::div.Tensor](%div_2, %_tensor_constant1)
  %div_4 = call_function[aten::div.Tensor_mode](%div_3, %_tensor_constant0, "floor")
  %output = output[output]((%div_1, %div_3, %div_4))
})";

// Only the exact reciprocals (1/8, 1/4), the tensor one as a new buffer;
// the floor division stays.
constexpr char kExact[] = R"(graph {
  %x = placeholder[x]()
  %div = call_function[aten::mul.Scalar](%x, 0.125) meta{out=[tensor([5, 7], float32, "cpu")]}
  %_tensor_constant0 = get_attr[_tensor_constant0]()
  %_tensor_constant0_reciprocal = get_attr[_tensor_constant0_reciprocal]()
  %div_1 = call_function[aten::mul.Tensor](%div, %_tensor_constant0_reciprocal)
  %div_2 = call_function[aten::div.Scalar](%div_1, 3.0)
  %_tensor_constant1 = get_attr[_tensor_constant1]()
  %div_3 = call_function[aten::div.Tensor](%div_2, %_tensor_constant1)
  %div_4 = call_function[aten::div.Tensor_mode](%div_3, %_tensor_constant0, "floor")
  %output = output[output]((%div_1, %div_3, %div_4))
})";

// Every true division by a constant.
constexpr char kInexact[] = R"(graph {
  %x = placeholder[x]()
  %div = call_function[aten::mul.Scalar](%x, 0.125) meta{out=[tensor([5, 7], float32, "cpu")]}
  %_tensor_constant0 = get_attr[_tensor_constant0]()
  %_tensor_constant0_reciprocal = get_attr[_tensor_constant0_reciprocal]()
  %div_1 = call_function[aten::mul.Tensor](%div, %_tensor_constant0_reciprocal)
  %div_2 = call_function[aten::mul.Scalar](%div_1, 0.3333333333333333)
  %_tensor_constant1 = get_attr[_tensor_constant1]()
  %_tensor_constant1_reciprocal = get_attr[_tensor_constant1_reciprocal]()
  %div_3 = call_function[aten::mul.Tensor](%div_2, %_tensor_constant1_reciprocal)
  %div_4 = call_function[aten::div.Tensor_mode](%div_3, %_tensor_constant0, "floor")
  %output = output[output]((%div_1, %div_3, %div_4))
})";

TEST(ChangeTrueDivTest, RewritesPowersOfTwoExactly) {
  EXPECT_TRUE(ChangeTrueDivToMulByInverse().preserves_computation());
  std::optional<runtime::GraphModule> out;
  ASSERT_TRUE(ExpectRewrite(DivsRoot(), kDivs, ChangeTrueDivToMulByInverse(),
                            kExact, &out));
  EXPECT_EQ(out->GetTensor("_tensor_constant0_reciprocal")->item<double>(),
            0.25);

  runtime::GraphModule original = MakeGraphModule(DivsRoot(), kDivs);
  for (uint64_t seed : {1, 2, 3}) {
    std::vector<c10::IValue> in = {Rand({5, 7}, seed) * 1000};
    ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> before,
                         RunGraph(original, in));
    ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> after, RunGraph(*out, in));
    ASSERT_EQ(after.size(), before.size());
    // Bit for bit.
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(fusion_math::BitwiseEqual(after[i], before[i])) << i;
    }
  }
  ASSERT_THAT(ChangeTrueDivToMulByInverse().Reverse(*out), IsOkAndHolds(true));
  EXPECT_EQ(DiffGraphModules(*out, original), "");
}

TEST(ChangeTrueDivTest, InexactModeIsFlaggedAndCloseToOneUlp) {
  ChangeTrueDivToMulByInverse pass(/*allow_inexact=*/true);
  EXPECT_FALSE(pass.preserves_computation());
  std::optional<runtime::GraphModule> out;
  ASSERT_TRUE(ExpectRewrite(DivsRoot(), kDivs, pass, kInexact, &out));

  runtime::GraphModule original = MakeGraphModule(DivsRoot(), kDivs);
  std::vector<c10::IValue> in = {Rand({5, 7}, 4) * 1000};
  ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> before,
                       RunGraph(original, in));
  ASSERT_OK_AND_ASSIGN(std::vector<torch::Tensor> after, RunGraph(*out, in));
  // x / 3 versus x * fl(1/3): within a couple of fp32 ulps.
  EXPECT_LT(testing::MaxRelError({after[1]}, {before[1]}), 3e-7);
  ASSERT_THAT(pass.Reverse(*out), IsOkAndHolds(true));
  EXPECT_EQ(DiffGraphModules(*out, original), "");
}

TEST(ChangeTrueDivTest, DoesNotFireOnNonConstantDivisors) {
  EXPECT_TRUE(ExpectNoRewrite(MakeRoot(), R"(graph {
  %x = placeholder[x]()
  %y = placeholder[y]()
  %div = call_function[aten::div.Tensor](%x, %y)
  %div_1 = call_function[aten::div.Scalar](%x, 0.0)
  %output = output[output]((%div, %div_1))
})",
                              ChangeTrueDivToMulByInverse(true)));
}

}  // namespace
}  // namespace tracecut::transforms
