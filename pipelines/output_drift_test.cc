#include "pipelines/output_drift.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {
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

}  // namespace
}  // namespace tracecut::pipelines
