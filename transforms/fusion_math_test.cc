#include "transforms/fusion_math.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms::fusion_math {
namespace {

// Reference BatchNorm in inference mode, float64.
at::Tensor RefBatchNorm(const at::Tensor& y, const BatchNormParams& bn) {
  auto d = [](const at::Tensor& t) { return t.to(at::kDouble); };
  std::optional<at::Tensor> w, b;
  if (bn.weight) w = d(*bn.weight);
  if (bn.bias) b = d(*bn.bias);
  return at::batch_norm(d(y), w, b, d(bn.running_mean), d(bn.running_var),
                        /*training=*/false, 0.1, bn.eps,
                        /*cudnn_enabled=*/false);
}

BatchNormParams RandomBatchNorm(int64_t c, bool affine, at::ScalarType dtype) {
  BatchNormParams bn;
  bn.running_mean = at::randn({c}).to(dtype);
  bn.running_var = (at::rand({c}) + 0.5).to(dtype);
  if (affine) {
    bn.weight = at::randn({c}).to(dtype);
    bn.bias = at::randn({c}).to(dtype);
  }
  bn.eps = 1e-3;
  return bn;
}

class FoldConvTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// Conv2d (+/- bias) then BatchNorm2d (+/- affine), fp32: the fused conv
// matches within 1e-5 relative to the largest output.
TEST_P(FoldConvTest, MatchesConvThenBatchNorm) {
  const auto [conv_bias, affine] = GetParam();
  at::manual_seed(0);
  at::Tensor w = at::randn({8, 3, 3, 3});
  std::optional<at::Tensor> b;
  if (conv_bias) b = at::randn({8});
  BatchNormParams bn = RandomBatchNorm(8, affine, at::kFloat);
  auto fused = FoldBatchNormIntoPreceding(w, b, bn);
  ASSERT_OK(fused);
  EXPECT_EQ(fused->weight.scalar_type(), at::kFloat);
  ASSERT_TRUE(fused->bias.has_value());
  EXPECT_EQ(fused->bias->scalar_type(), at::kFloat);

  at::Tensor x = at::randn({2, 3, 10, 10});
  at::Tensor expected = RefBatchNorm(at::conv2d(x, w, b, 1, 1), bn);
  at::Tensor actual = at::conv2d(x, fused->weight, fused->bias, 1, 1);
  ErrorStats err = CompareTensors(actual, expected);
  EXPECT_LT(err.max_rel, 1e-5) << "max_abs=" << err.max_abs;
}

INSTANTIATE_TEST_SUITE_P(BiasAndAffine, FoldConvTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Bool()));

// Regression for Optimum's formula b - mu*s + beta: with a non-zero conv
// bias the correct bias is (b - mu) * s + beta.
TEST(FoldBatchNormTest, BiasIsShiftedBeforeScaling) {
  at::Tensor w = at::ones({1, 1, 1, 1});
  at::Tensor b = at::full({1}, 3.0);
  BatchNormParams bn;
  bn.running_mean = at::full({1}, 1.0);
  bn.running_var = at::full({1}, 4.0);
  bn.weight = at::full({1}, 4.0);  // s = 4 / sqrt(4) = 2.
  bn.bias = at::full({1}, 0.5);
  bn.eps = 0;
  auto fused = FoldBatchNormIntoPreceding(w, b, bn);
  ASSERT_OK(fused);
  EXPECT_DOUBLE_EQ(fused->weight.item<double>(), 2.0);
  EXPECT_DOUBLE_EQ(fused->bias->item<double>(), (3.0 - 1.0) * 2.0 + 0.5);
  EXPECT_NE(fused->bias->item<double>(), 3.0 - 1.0 * 2.0 + 0.5);
}

// affine=False means gamma = 1, beta = 0 (Optimum uses beta = 1).
TEST(FoldBatchNormTest, NonAffineUsesZeroBeta) {
  at::Tensor w = at::ones({1, 1});
  BatchNormParams bn;
  bn.running_mean = at::zeros({1});
  bn.running_var = at::ones({1});
  bn.eps = 0;
  auto fused = FoldBatchNormIntoPreceding(w, std::nullopt, bn);
  ASSERT_OK(fused);
  EXPECT_EQ(fused->bias->item<float>(), 0.0f);
  EXPECT_EQ(fused->weight.item<float>(), 1.0f);
}

// Reduced precision: the fused parameters stay in the model dtype and are
// no worse than the unfused model computed in that dtype.
TEST(FoldBatchNormTest, KeepsReducedPrecisionDtypes) {
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16, at::kDouble}) {
    at::manual_seed(1);
    at::Tensor w = at::randn({4, 6}).to(dtype);
    at::Tensor b = at::randn({4}).to(dtype);
    BatchNormParams bn = RandomBatchNorm(4, true, dtype);
    auto fused = FoldBatchNormIntoPreceding(w, b, bn);
    ASSERT_OK(fused);
    EXPECT_EQ(fused->weight.scalar_type(), dtype);
    EXPECT_EQ(fused->bias->scalar_type(), dtype);
    at::Tensor x = at::randn({5, 6}).to(dtype);
    at::Tensor expected = RefBatchNorm(
        at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble)),
        bn);
    at::Tensor actual =
        at::linear(x.to(at::kDouble), fused->weight.to(at::kDouble),
                   fused->bias->to(at::kDouble));
    // Only the rounding of the fused parameters to `dtype` remains.
    const double tol = dtype == at::kDouble ? 1e-12
                       : dtype == at::kHalf ? 4e-3
                                            : 3e-2;
    EXPECT_LT(CompareTensors(actual, expected).max_rel, tol)
        << c10::toString(dtype);
  }
}

TEST(FoldBatchNormTest, RejectsMismatchedChannels) {
  BatchNormParams bn = RandomBatchNorm(5, true, at::kFloat);
  auto fused = FoldBatchNormIntoPreceding(at::ones({4, 2}), std::nullopt, bn);
  EXPECT_EQ(fused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fused.status().message().find("4 output channels"),
            std::string::npos)
      << fused.status();
  bn = RandomBatchNorm(4, true, at::kFloat);
  bn.running_var = at::full({4}, -1.0);
  bn.eps = 0;
  EXPECT_FALSE(FoldBatchNormIntoPreceding(at::ones({4, 2}), {}, bn).ok());
  EXPECT_FALSE(
      FoldBatchNormIntoPreceding(at::ones({4, 2}).to(at::kInt), {}, bn).ok());
}

TEST(FoldBatchNormTest, FollowingLinearMatches) {
  for (bool linear_bias : {false, true}) {
    for (bool affine : {false, true}) {
      at::manual_seed(2);
      at::Tensor w = at::randn({7, 5});
      std::optional<at::Tensor> b;
      if (linear_bias) b = at::randn({7});
      BatchNormParams bn = RandomBatchNorm(5, affine, at::kFloat);
      auto fused = FoldBatchNormIntoFollowingLinear(w, b, bn);
      ASSERT_OK(fused);
      at::Tensor x = at::randn({9, 5});
      at::Tensor expected = at::linear(
          RefBatchNorm(x, bn), w.to(at::kDouble),
          b ? std::optional<at::Tensor>(b->to(at::kDouble)) : std::nullopt);
      at::Tensor actual = at::linear(x, fused->weight, fused->bias);
      EXPECT_LT(CompareTensors(actual, expected).max_rel, 1e-5);
    }
  }
}

TEST(ConcatLinearsTest, MergesAnyOutFeaturesAndZeroFillsMissingBias) {
  at::manual_seed(3);
  std::vector<WeightAndBias> parts = {
      {at::randn({3, 4}), at::randn({3})},
      {at::randn({5, 4}), std::nullopt},
      {at::randn({2, 4}), at::randn({2})},
  };
  auto merged = ConcatLinears(parts);
  ASSERT_OK(merged);
  EXPECT_EQ(merged->weight.sizes(), (std::vector<int64_t>{10, 4}));
  ASSERT_TRUE(merged->bias.has_value());
  EXPECT_TRUE(at::equal(merged->bias->narrow(0, 3, 5), at::zeros({5})));
  EXPECT_EQ(OutFeatures(parts), (std::vector<int64_t>{3, 5, 2}));
  // Slicing gives back each part bit for bit.
  EXPECT_TRUE(BitwiseEqual(merged->weight.narrow(0, 3, 5), parts[1].weight));
  EXPECT_TRUE(BitwiseEqual(merged->bias->narrow(0, 8, 2), *parts[2].bias));
  at::Tensor x = at::randn({6, 4});
  at::Tensor y = at::linear(x, merged->weight, merged->bias);
  EXPECT_TRUE(at::allclose(y.narrow(1, 0, 3),
                           at::linear(x, parts[0].weight, parts[0].bias)));
  EXPECT_TRUE(
      at::allclose(y.narrow(1, 3, 5), at::linear(x, parts[1].weight, {})));
}

TEST(ConcatLinearsTest, NoBiasWhenNoneHasOne) {
  std::vector<WeightAndBias> parts = {{at::ones({3, 4}), std::nullopt},
                                      {at::ones({3, 4}), std::nullopt}};
  auto merged = ConcatLinears(parts);
  ASSERT_OK(merged);
  EXPECT_FALSE(merged->bias.has_value());
}

TEST(ConcatLinearsTest, KeepsDtypeAndConv1DLayout) {
  std::vector<WeightAndBias> parts = {
      {at::randn({4, 3}).to(at::kBFloat16), std::nullopt},
      {at::randn({4, 2}).to(at::kBFloat16), at::randn({2}).to(at::kBFloat16)}};
  auto merged = ConcatLinears(parts, /*out_dim=*/1);
  ASSERT_OK(merged);
  EXPECT_EQ(merged->weight.sizes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(merged->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(merged->bias->scalar_type(), at::kBFloat16);
}

TEST(ConcatLinearsTest, RejectsMismatches) {
  EXPECT_FALSE(ConcatLinears({{at::ones({3, 4}), std::nullopt},
                              {at::ones({3, 5}), std::nullopt}})
                   .ok());
  EXPECT_FALSE(ConcatLinears({{at::ones({3, 4}), std::nullopt},
                              {at::ones({3, 4}).to(at::kDouble), std::nullopt}})
                   .ok());
  EXPECT_FALSE(ConcatLinears({{at::ones({3, 4}), std::nullopt}}).ok());
}

TEST(BiasColumnTest, RoundTripsExactly) {
  at::manual_seed(4);
  at::Tensor w = at::randn({6, 5});
  at::Tensor b = at::randn({6});
  auto fused = AppendBiasColumn(w, b);
  ASSERT_OK(fused);
  EXPECT_EQ(fused->sizes(), (std::vector<int64_t>{6, 6}));
  at::Tensor x = at::randn({3, 5});
  at::Tensor x1 = at::cat({x, at::ones({3, 1})}, 1);
  EXPECT_TRUE(
      at::allclose(at::linear(x1, *fused), at::linear(x, w, b), 1e-5, 1e-6));
  auto split = SplitBiasColumn(*fused);
  ASSERT_OK(split);
  EXPECT_TRUE(BitwiseEqual(split->weight, w));
  EXPECT_TRUE(BitwiseEqual(*split->bias, b));
  EXPECT_FALSE(AppendBiasColumn(w, at::ones({5})).ok());
}

TEST(ExactReciprocalTest, PowersOfTwoOnly) {
  EXPECT_EQ(ExactReciprocal(8.0), 0.125);
  EXPECT_EQ(ExactReciprocal(-0.25), -4.0);
  EXPECT_EQ(ExactReciprocal(1.0), 1.0);
  EXPECT_FALSE(ExactReciprocal(3.0).has_value());
  EXPECT_FALSE(ExactReciprocal(std::sqrt(128.0)).has_value());
  EXPECT_FALSE(ExactReciprocal(0.0).has_value());
  EXPECT_FALSE(
      ExactReciprocal(std::numeric_limits<double>::infinity()).has_value());
  EXPECT_FALSE(ExactReciprocal(std::ldexp(1.0, 20)).has_value());
  EXPECT_TRUE(ExactReciprocal(std::ldexp(1.0, 20), 126).has_value());
}

TEST(ExactReciprocalTest, DivisionEqualsMultiplicationBitForBit) {
  at::manual_seed(5);
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    at::Tensor x = (at::randn({1000}) * 100).to(dtype);
    for (double d : {8.0, 0.5, 1024.0, -2.0}) {
      auto r = ExactReciprocal(d);
      ASSERT_TRUE(r.has_value());
      EXPECT_TRUE(BitwiseEqual(x / d, x * *r)) << c10::toString(dtype) << d;
    }
  }
  at::Tensor div = at::tensor({2.0, 4.0, 0.5}, at::kFloat);
  auto r = ExactReciprocalTensor(div);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->scalar_type(), at::kFloat);
  at::Tensor x = at::randn({10, 3});
  EXPECT_TRUE(BitwiseEqual(x / div, x * *r));
  EXPECT_FALSE(ExactReciprocalTensor(at::tensor({2.0, 3.0})).has_value());
  EXPECT_FALSE(ExactReciprocalTensor(at::tensor({2}, at::kLong)).has_value());
}

TEST(CompareTensorsTest, AbsoluteAndRelative) {
  ErrorStats e =
      CompareTensors(at::tensor({1.0, 2.0, 4.5}), at::tensor({1.0, 2.0, 4.0}));
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.max_rel, 0.5 / 4.0);
  EXPECT_TRUE(
      std::isinf(CompareTensors(at::tensor({NAN}), at::tensor({1.0})).max_abs));
  EXPECT_EQ(CompareTensors(at::tensor({NAN}), at::tensor({NAN})).max_abs, 0);
  EXPECT_TRUE(std::isinf(CompareTensors(at::ones({2}), at::ones({3})).max_abs));
}

TEST(BitwiseEqualTest, DistinguishesSignedZeroAndDtype) {
  EXPECT_FALSE(BitwiseEqual(at::tensor({0.0}), at::tensor({-0.0})));
  EXPECT_FALSE(BitwiseEqual(at::ones({2}), at::ones({2}).to(at::kDouble)));
  EXPECT_TRUE(BitwiseEqual(at::ones({2, 2}).t(), at::ones({2, 2})));
}

}  // namespace
}  // namespace tracecut::transforms::fusion_math
