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
