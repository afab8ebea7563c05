#include "runtime/finite.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>

#include <limits>

namespace tracecut::runtime {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(CheckFiniteTest, FiniteAndNonFloatingTensorsPass) {
  EXPECT_TRUE(CheckFinite(at::randn({4, 5}), "w").ok());
  EXPECT_TRUE(CheckFinite(at::arange(10), "ids").ok());
  EXPECT_TRUE(CheckFinite(at::Tensor(), "undefined").ok());
  EXPECT_TRUE(CheckFinite(at::zeros({0, 3}), "empty").ok());
}

TEST(CheckFiniteTest, NamesTheFirstBadElement) {
  at::Tensor t = at::zeros({3, 4});
  t[2][1] = std::numeric_limits<double>::quiet_NaN();
  t[2][3] = kInf;
  absl::Status s = CheckFinite(t, "layer.weight_scale");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer.weight_scale has NaN at [2, 1] "
                                     "(element 9 of 12)"));
  t[0][0] = -kInf;
  EXPECT_THAT(CheckFinite(t, "w").message(), HasSubstr("-inf at [0, 0]"));
}

TEST(CheckFiniteTest, AllowInfiniteStillRejectsNaN) {
  at::Tensor mask = at::full({2, 2}, -kInf);
  EXPECT_TRUE(CheckFinite(mask, "mask", /*allow_infinite=*/true).ok());
  mask[1][1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(CheckFinite(mask, "mask", /*allow_infinite=*/true).message(),
              HasSubstr("NaN at [1, 1]"));
}

TEST(CheckFiniteTest, HalfPrecisionAndLargeTensors) {
  at::Tensor t = at::ones({5000, 4000}, at::kBFloat16);  // > one chunk.
  t[4999][3999] = kInf;
  EXPECT_THAT(CheckFinite(t, "emb").message(),
              HasSubstr("inf at [4999, 3999] (element 19999999 of 20000000)"));
}

// The in-place scan by bits finds what isnan/isfinite find, in every float
// dtype, at the start, the end and across block and thread boundaries; a
// transposed (non-contiguous) view takes the ATen path and agrees.
TEST(FirstNonFiniteTest, BitScanAgreesWithTheAtenPath) {
  const int64_t n = 3 * 4096 * 64 + 7;
  for (at::ScalarType dtype :
       {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    for (int64_t at_index :
         {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{300000}, n - 1}) {
      for (double bad :
           {std::numeric_limits<double>::quiet_NaN(), kInf, -kInf}) {
        for (bool allow_infinite : {false, true}) {
          at::Tensor t = at::randn({n}).to(dtype);
          t[at_index] = bad;
          t[n - 1 - (at_index == n - 1 ? 1 : 0)] =
              std::numeric_limits<double>::quiet_NaN();
          at::Tensor mask = allow_infinite ? at::isnan(t) : ~at::isfinite(t);
          const int64_t want = mask.nonzero().select(1, 0)[0].item<int64_t>();
          absl::StatusOr<int64_t> got = FirstNonFinite(t, allow_infinite);
          ASSERT_TRUE(got.ok());
          EXPECT_EQ(*got, want) << dtype << " at " << at_index;
          at::Tensor strided = t.reshape({1, n}).expand({2, n}).t();
          absl::StatusOr<int64_t> slow =
              FirstNonFinite(strided, allow_infinite);
          ASSERT_TRUE(slow.ok());
          EXPECT_EQ(*slow, 2 * want) << dtype << " at " << at_index;
        }
      }
    }
    EXPECT_EQ(*FirstNonFinite(at::randn({n}).to(dtype)), -1);
    // Subnormals and the largest finite values are finite.
    at::Tensor edge = at::full({5}, 1e-40).to(dtype);
    edge[2] = dtype == at::kHalf ? 65504.0 : 3.0e38;
    EXPECT_EQ(*FirstNonFinite(edge), -1) << dtype;
  }
}

TEST(CheckModuleFiniteTest, ParametersMustBeFiniteBuffersMustNotBeNaN) {
  torch::jit::Module m("M");
  torch::jit::Module child("Child");
  child.register_parameter("weight", at::ones({2, 2}), /*is_buffer=*/false);
  child.register_buffer("mask", at::full({2}, -kInf));
  m.register_module("block", child);
  EXPECT_TRUE(CheckModuleFinite(m, "m.pt").ok());

  child.attr("weight").toTensor()[0][1] = kInf;
  absl::Status s = CheckModuleFinite(m, "m.pt");
  EXPECT_THAT(s.message(),
              HasSubstr("m.pt: parameter block.weight has inf at [0, 1]"));
  child.attr("weight").toTensor()[0][1] = 0;
  child.attr("mask").toTensor()[1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(CheckModuleFinite(m, "m.pt").message(),
              HasSubstr("m.pt: buffer block.mask has NaN at [1]"));
}

}  // namespace
}  // namespace tracecut::runtime
