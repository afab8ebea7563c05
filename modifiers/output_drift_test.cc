#include "modifiers/output_drift.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "util/status_macros.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

TEST(OutputDriftTest, RelativeOverEverythingAdded) {
  OutputDrift drift;
  ASSERT_OK(drift.Add(at::tensor({3.0f, 0.0f}), at::tensor({3.0f, 0.0f})));
  ASSERT_OK(drift.Add(at::tensor({0.0f, 4.0f}), at::tensor({0.0f, 4.5f})));
  // ||(0, 0, 0, 0.5)|| / ||(3, 0, 0, 4)||.
  EXPECT_DOUBLE_EQ(drift.relative(), 0.5 / 5.0);
}

TEST(OutputDriftTest, BoundDependsOnTheWeightsDtype) {
  OutputDrift small;
  ASSERT_OK(small.Add(at::ones({100}), at::ones({100}) * 1.01));  // 1e-2.
  EXPECT_THAT(small.Check(at::kFloat, "awq: a.norm", "a.mlp"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("awq: a.norm: smoothing changed what a.mlp "
                                 "compute (relative error 0.01)")));
  EXPECT_OK(small.Check(at::kBFloat16, "awq: a.norm", "a.mlp"));
  OutputDrift rounding;
  ASSERT_OK(rounding.Add(at::ones({100}), at::ones({100}) * (1 + 1e-6)));
  EXPECT_OK(rounding.Check(at::kFloat, "awq: a.norm", "a.mlp"));
}

// A toy norm x * g with g either w (plain) or 1 + w (Gemma's): whichever it
// is, SmoothNormWeight leaves the weight that keeps x * g / s's product with
// s equal to the original output.
TEST(SmoothNormWeightTest, KeepsTheUpdateThatPreservesTheOutput) {
  const at::Tensor w = at::tensor({0.5f, -0.25f, 2.0f});
  const at::Tensor s = at::tensor({2.0f, 0.5f, 4.0f});
  for (const bool offset_norm : {false, true}) {
    SCOPED_TRACE(offset_norm);
    auto gain = [&](const at::Tensor& weight) {
      return offset_norm ? weight + 1 : weight;
    };
    const at::Tensor want = gain(w);
    at::Tensor current = w;
    auto set = [&](const at::Tensor& t) {
      current = t;
      return absl::OkStatus();
    };
    auto drift = [&]() -> absl::StatusOr<OutputDrift> {
      OutputDrift d;  // The balance layers multiply by s again.
      RETURN_IF_ERROR(d.Add(want, gain(current) * s));
      return d;
    };
    ASSERT_OK_AND_ASSIGN(NormSmoothing n, SmoothNormWeight(w, s, set, drift));
    EXPECT_EQ(n.offset, offset_norm);
    EXPECT_LT(n.drift.relative(), 1e-6);
    EXPECT_TRUE(at::allclose(gain(current) * s, want));
  }
}

}  // namespace
}  // namespace tracecut::modifiers
