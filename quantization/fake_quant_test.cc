#include "quantization/fake_quant.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantization/quant_args.h"
#include "util/testing/status_matchers.h"

// Bit-exactness against compressed-tensors itself is
// //tests/quantization:ct_conformance_test; these check the conventions
// from their definitions.

namespace tracecut::quantization {
namespace {

using ::testing::HasSubstr;
using util::testing::IsOk;
using util::testing::StatusIs;

QuantizationArgs Weights(const char* preset) {
  absl::StatusOr<QuantizationScheme> s = PresetScheme(preset, {"Linear"});
  EXPECT_THAT(s, IsOk());
  return *s->weights;
}

// Per-group min/max of a [rows, cols] weight, as the minmax observer takes
// them (observers.h has the real one; this keeps the test independent).
std::pair<at::Tensor, at::Tensor> GroupMinMax(const at::Tensor& w, int64_t g) {
  at::Tensor grouped = w.unflatten(-1, {-1, g});
  return {grouped.amin(-1), grouped.amax(-1)};
}

TEST(FakeQuant, SymmetricInt4UsesAbsmaxOver7_5AndTheFullRange) {
  at::manual_seed(0);
  const QuantizationArgs args = Weights("W4A16");
  at::Tensor w = at::randn({4, 256});
  w[0][5] = -10.0;  // row 0, group 0: the most negative value is the absmax
  auto [lo, hi] = GroupMinMax(w, 128);
  absl::StatusOr<QParams> q = CalculateQParams(lo, hi, args);
  ASSERT_THAT(q, IsOk());
  at::Tensor absmax = at::max(lo.abs(), hi.abs());
  EXPECT_TRUE(at::equal(q->scale, absmax / 7.5f));
  absl::StatusOr<at::Tensor> codes = Quantize(w, *q, args, at::kChar);
  ASSERT_THAT(codes, IsOk());
  EXPECT_EQ((*codes)[0][5].item<int8_t>(), -8);  // -7.5 rounds to even: -8
  EXPECT_EQ(codes->min().item<int8_t>(), -8);
  EXPECT_LE(codes->max().item<int8_t>(), 7);
}

TEST(FakeQuant, DequantizeOfQuantizeIsFakeQuantize) {
  at::manual_seed(1);
  for (const char* preset : {"W4A16", "W4A16_ASYM", "W8A8", "FP8_DYNAMIC",
                             "FP8", "NVFP4A16", "MXFP4A16"}) {
    SCOPED_TRACE(preset);
    const QuantizationArgs args = Weights(preset);
    at::Tensor w = at::randn({32, 256}) * 0.1;
    at::Tensor lo, hi, gs;
    if (args.resolved_strategy() == Strategy::kTensor) {
      lo = w.amin().reshape({1});
      hi = w.amax().reshape({1});
    } else if (args.resolved_strategy() == Strategy::kChannel) {
      lo = w.amin(-1, true);
      hi = w.amax(-1, true);
    } else {
      std::tie(lo, hi) = GroupMinMax(w, *args.group_size);
    }
    if (args.resolved_strategy() == Strategy::kTensorGroup) {
      absl::StatusOr<at::Tensor> g =
          GenerateGlobalScale(lo.min().reshape({1}), hi.max().reshape({1}));
      ASSERT_THAT(g, IsOk());
      gs = *g;
    }
    absl::StatusOr<QParams> q = CalculateQParams(lo, hi, args, gs);
    ASSERT_THAT(q, IsOk());
    absl::StatusOr<at::Tensor> fake = FakeQuantize(w, *q, args);
    absl::StatusOr<at::Tensor> codes = Quantize(w, *q, args);
    ASSERT_THAT(fake, IsOk());
    ASSERT_THAT(codes, IsOk());
    absl::StatusOr<at::Tensor> back = Dequantize(*codes, *q, args, at::kFloat);
    ASSERT_THAT(back, IsOk());
    EXPECT_TRUE(at::equal(*back, *fake));
    // Fake-quantization is idempotent on its own grid.
    absl::StatusOr<at::Tensor> again = FakeQuantize(*fake, *q, args);
    ASSERT_THAT(again, IsOk());
    EXPECT_LE((*again - *fake).abs().max().item<float>(), 1e-6f);
  }
}

TEST(FakeQuant, Fp4RoundsToTheE2m1GridWithCompressedTensorsTies) {
  const std::vector<float> grid = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  std::vector<float> in, want;
  for (float v : grid) in.push_back(v), want.push_back(v);
  // compressed-tensors' thresholds: ties at 0.25 and 1.25 and 2.5 and 5 go
  // down, at 0.75, 1.75 and 3.5 go up.
  const std::vector<std::pair<float, float>> ties = {
      {0.25, 0}, {0.75, 1}, {1.25, 1}, {1.75, 2}, {2.5, 2},
      {3.5, 4},  {5.0, 4},  {5.01, 6}, {100, 6}};
  for (auto [v, r] : ties) in.push_back(v), want.push_back(r);
  at::Tensor x = at::tensor(in);
  EXPECT_TRUE(at::equal(CastToFp4(x), at::tensor(want)));
  EXPECT_TRUE(at::equal(CastToFp4(-x), -at::tensor(want)));
}

TEST(FakeQuant, MxScalesArePowersOfTwo) {
  at::manual_seed(2);
  const QuantizationArgs args = Weights("MXFP4A16");
  at::Tensor w = at::randn({8, 64});
  auto [lo, hi] = GroupMinMax(w, 32);
  absl::StatusOr<QParams> q = CalculateQParams(lo, hi, args);
  ASSERT_THAT(q, IsOk());
  at::Tensor l = at::log2(q->scale);
  EXPECT_TRUE(at::equal(l, at::round(l)));
}

TEST(FakeQuant, AllZeroGroupGetsTheEpsilonScaleAndStaysZero) {
  const QuantizationArgs args = Weights("NVFP4A16");
  at::Tensor w = at::randn({2, 32});
  w.slice(1, 0, 16).zero_();
  auto [lo, hi] = GroupMinMax(w, 16);
  absl::StatusOr<at::Tensor> gs =
      GenerateGlobalScale(lo.min().reshape({1}), hi.max().reshape({1}));
  ASSERT_THAT(gs, IsOk());
  absl::StatusOr<QParams> q = CalculateQParams(lo, hi, args, *gs);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->scale[0][0].item<float>(), 0.125f);  // fp8's eps
  absl::StatusOr<at::Tensor> fake = FakeQuantize(w, *q, args);
  ASSERT_THAT(fake, IsOk());
  EXPECT_TRUE(at::equal(fake->slice(1, 0, 16), at::zeros({2, 16})));
}

TEST(FakeQuant, BlocksPadAndKeepTheShape) {
  at::manual_seed(3);
  const QuantizationArgs args = Weights("FP8_BLOCK");
  at::Tensor w = at::randn({200, 256});
  at::Tensor padded = at::constant_pad_nd(w, {0, 0, 0, 56}, 0);
  at::Tensor blocks =
      padded.reshape({2, 128, 2, 128}).transpose(1, 2).flatten(-2);
  absl::StatusOr<QParams> q =
      CalculateQParams(blocks.amin(-1), blocks.amax(-1), args);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->scale.sizes(), (std::vector<int64_t>{2, 2}));
  absl::StatusOr<at::Tensor> codes = Quantize(w, *q, args, at::kFloat8_e4m3fn);
  ASSERT_THAT(codes, IsOk());
  EXPECT_EQ(codes->sizes(), w.sizes());
  EXPECT_EQ(codes->scalar_type(), at::kFloat8_e4m3fn);
}

TEST(FakeQuant, RefusesNanAndShapesTheStrategyCannotTake) {
  const QuantizationArgs args = Weights("W4A16");
  at::Tensor w = at::randn({4, 256});
  auto [lo, hi] = GroupMinMax(w, 128);
  absl::StatusOr<QParams> q = CalculateQParams(lo, hi, args);
  ASSERT_THAT(q, IsOk());
  at::Tensor bad = w.clone();
  bad[1][2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(FakeQuantize(bad, *q, args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fake-quantize input: contains NaN")));
  bad[1][2] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(
      Quantize(bad, *q, args),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("contains Inf")));
  EXPECT_THAT(FakeQuantize(at::randn({4, 200}), *q, args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("200 columns are not divisible by "
                                 "group_size 128")));
  EXPECT_THAT(
      FakeQuantize(at::randn({4, 256}), QParams{}, args),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no scale")));
  // A scale of the wrong shape is a LibTorch error turned into a status.
  QParams wrong = *q;
  wrong.scale = at::ones({3, 5});
  EXPECT_THAT(FakeQuantize(w, wrong, args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fake-quantizing int4 sym group128")));
}

TEST(FakeQuant, DynamicTokenScalesAreOnePerToken) {
  at::manual_seed(4);
  absl::StatusOr<QuantizationScheme> s =
      PresetScheme("FP8_DYNAMIC", {"Linear"});
  ASSERT_THAT(s, IsOk());
  at::Tensor x = at::randn({2, 5, 64});
  absl::StatusOr<QParams> q = DynamicQParams(x, *s->input_activations);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->scale.sizes(), (std::vector<int64_t>{2, 5, 1}));
  EXPECT_TRUE(at::allclose(q->scale, x.abs().amax(-1, true) / 448.0));
}

}  // namespace
}  // namespace tracecut::quantization
