#include "quantization/observers.h"

#include <ATen/ATen.h>

#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantization/fake_quant.h"
#include "quantization/quant_args.h"
#include "util/testing/status_matchers.h"

// Bit-exactness against llm-compressor's observers is
// //tests/quantization:ct_conformance_test.

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

double Error(const at::Tensor& w, const QuantizationArgs& args) {
  absl::StatusOr<QParams> q = WeightQParams(w, args);
  EXPECT_THAT(q, IsOk());
  absl::StatusOr<at::Tensor> fake = FakeQuantize(w, *q, args);
  EXPECT_THAT(fake, IsOk());
  return (*fake - w).abs().pow(2.4).sum().item<double>();  // The search's norm.
}

TEST(Observers, ParametersInTheModuleDtypes) {
  at::manual_seed(0);
  at::Tensor w = at::randn({64, 128}).to(at::kBFloat16);
  absl::StatusOr<QParams> int4 = WeightQParams(w, Weights("W4A16"));
  ASSERT_THAT(int4, IsOk());
  EXPECT_EQ(int4->scale.scalar_type(), at::kBFloat16);
  EXPECT_EQ(int4->scale.sizes(), (std::vector<int64_t>{64, 1}));
  EXPECT_EQ(int4->zero_point.scalar_type(), at::kChar);
  EXPECT_FALSE(int4->global_scale.defined());
  absl::StatusOr<QParams> nvfp4 = WeightQParams(w, Weights("NVFP4A16"));
  ASSERT_THAT(nvfp4, IsOk());
  EXPECT_EQ(nvfp4->scale.sizes(), (std::vector<int64_t>{64, 8}));
  EXPECT_EQ(nvfp4->zero_point.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(nvfp4->global_scale.scalar_type(), at::kFloat);
  EXPECT_EQ(nvfp4->global_scale.sizes(), (std::vector<int64_t>{1}));
  absl::StatusOr<QParams> block =
      WeightQParams(at::randn({200, 256}), Weights("FP8_BLOCK"));
  ASSERT_THAT(block, IsOk());
  EXPECT_EQ(block->scale.sizes(), (std::vector<int64_t>{2, 2}));
}

TEST(Observers, MseShrinksTheRangeAndNeverLosesToMinMax) {
  at::manual_seed(1);
  at::Tensor w = at::randn({32, 256}) * 0.02;
  w[3][7] = 0.5;  // An outlier the search may clip.
  for (const char* preset :
       {"W4A16", "W4A16_ASYM", "FP8_DYNAMIC", "MXFP4A16"}) {
    SCOPED_TRACE(preset);
    QuantizationArgs minmax = Weights(preset);
    QuantizationArgs mse = minmax;
    mse.observer = "mse";
    absl::StatusOr<MinMax> a = WeightMinMax(w, minmax);
    absl::StatusOr<MinMax> b = WeightMinMax(w, mse);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    // Shrunk by a factor in (0.8, 1].
    EXPECT_TRUE(at::all(b->max_vals.le(a->max_vals)).item<bool>());
    EXPECT_TRUE(at::all(b->max_vals.ge(a->max_vals * 0.8 - 1e-7)).item<bool>());
    EXPECT_LE(Error(w, mse), Error(w, minmax) * (1 + 1e-6));
  }
}

TEST(Observers, MseOptionsFromObserverKwargs) {
  QuantizationArgs args = Weights("W4A16");
  args.observer_kwargs["grid"] = 50;
  args.observer_kwargs["maxshrink"] = 0.5;
  absl::StatusOr<MseOptions> o = MseOptions::FromArgs(args);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->grid, 50);
  EXPECT_EQ(o->maxshrink, 0.5);
  args.observer_kwargs["expand"] = 0.5;
  EXPECT_THAT(MseOptions::FromArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("observer_kwargs.expand")));
}

TEST(Observers, FusedGlobalScaleCoversEveryMember) {
  at::manual_seed(2);
  const QuantizationArgs args = Weights("NVFP4A16");
  at::Tensor q = at::randn({16, 64}), k = at::randn({16, 64}) * 3;
  absl::StatusOr<MinMax> sq = WeightMinMax(q, args);
  absl::StatusOr<MinMax> sk = WeightMinMax(k, args);
  ASSERT_THAT(sq, IsOk());
  ASSERT_THAT(sk, IsOk());
  absl::StatusOr<at::Tensor> fused = FusedGlobalScale({*sq, *sk});
  ASSERT_THAT(fused, IsOk());
  at::Tensor both = at::cat({q, k});
  absl::StatusOr<at::Tensor> direct =
      GenerateGlobalScale(both.amin().reshape({1}), both.amax().reshape({1}));
  ASSERT_THAT(direct, IsOk());
  EXPECT_TRUE(at::equal(*fused, *direct));
}

TEST(Observers, WeightsWithNanOrWrongShapesAreRefused) {
  at::Tensor w = at::randn({8, 128});
  w[0][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(WeightQParams(w, Weights("W4A16")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weight: contains NaN")));
  EXPECT_THAT(WeightQParams(at::randn({8, 100}), Weights("W4A16")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("100 columns are not divisible")));
  EXPECT_THAT(WeightQParams(at::randn({8}), Weights("W8A8")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected a 2-D [out, in] weight")));
}

TEST(Observers, StaticActivationsTrackTheRunningRange) {
  absl::StatusOr<QuantizationScheme> fp8 = PresetScheme("FP8", {"Linear"});
  ASSERT_THAT(fp8, IsOk());
  absl::StatusOr<ActivationObserver> obs =
      ActivationObserver::Create(*fp8->input_activations);
  ASSERT_THAT(obs, IsOk());
  EXPECT_THAT(obs->Finish(at::kFloat),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(obs->Observe(at::full({1, 2, 8}, 2.0)), IsOk());
  ASSERT_THAT(obs->Observe(at::full({1, 3, 8}, -5.0)), IsOk());
  absl::StatusOr<QParams> q = obs->Finish(at::kBFloat16);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->scale.scalar_type(), at::kBFloat16);
  EXPECT_FLOAT_EQ(q->scale.item<float>(),
                  static_cast<float>(c10::BFloat16(5.0f / 448.0f)));
  absl::StatusOr<QuantizationScheme> dyn =
      PresetScheme("FP8_DYNAMIC", {"Linear"});
  ASSERT_THAT(dyn, IsOk());
  EXPECT_THAT(ActivationObserver::Create(*dyn->input_activations),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not calibrated")));
}

}  // namespace
}  // namespace tracecut::quantization
