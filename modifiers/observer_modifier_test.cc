// The observer driven hook by hook on the traced Llama fixture: the range
// it records over batches, and its refusal of non-finite activations. Its
// runs inside pipelines (static activation scales) are
// pipelines/pipeline_test.cc and tests/hf/schemes_test.py.

#include "modifiers/observer_modifier.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "modifiers/testing/traced_llama.h"
#include "util/progress.h"
#include "util/status_macros.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::tracecut::modifiers::testing::CallOf;
using ::tracecut::modifiers::testing::TraceLlamaFixture;
using ::tracecut::modifiers::testing::WholeModel;
using ::tracecut::util::testing::StatusIs;

constexpr char kDown[] = "model.layers.0.mlp.down_proj";

// Feeds `xs` (one per batch) to the observer as kDown's input and returns
// the status of the first failing call.
absl::Status Observe(ObserverOptions o, const std::vector<at::Tensor>& xs,
                     CalibrationResults& results) {
  runtime::GraphModule gm = TraceLlamaFixture();
  util::Progress progress = util::Progress::Silent();
  RunContext ctx(&gm, &results, static_cast<int64_t>(xs.size()), &progress);
  o.modules.targets = {kDown};
  Observer observer(o);
  const SubgraphInfo info = WholeModel(ctx);
  RETURN_IF_ERROR(observer.OnRunStart(ctx));
  RETURN_IF_ERROR(observer.OnSubgraphStart(ctx, info));
  const LeafModule* leaf = ctx.FindLeaf(kDown);
  if (leaf == nullptr) return absl::NotFoundError(kDown);
  for (size_t b = 0; b < xs.size(); ++b) {
    std::vector<c10::IValue> inputs = {xs[b]};
    EXPECT_TRUE(observer.WantsModule(kDown, leaf->type));
    RETURN_IF_ERROR(observer.OnModuleCall(
        ctx, CallOf(*leaf, inputs, static_cast<int64_t>(b))));
  }
  RETURN_IF_ERROR(observer.OnSubgraphEnd(ctx, info));
  return observer.OnRunEnd(ctx);
}

// Two batches with ranges [-2, 3] and [-5, 1] (the observer reads values
// only, so their width need not be the module's).
std::vector<at::Tensor> TwoBatches() {
  const int64_t in = 16;
  return {at::linspace(-2, 3, 2 * in).view({2, in}),
          at::linspace(-5, 1, 2 * in).view({2, in})};
}

TEST(ObserverTest, RecordsTheInputRangeOverBatches) {
  CalibrationResults results;
  ObserverOptions o;
  o.kind = ObserverKind::kMinMax;
  o.observe = ObservedTensor::kInput;
  ASSERT_OK(Observe(o, TwoBatches(), results));
  const ActivationRange& range = results.modules.at(kDown).input;
  EXPECT_EQ(range.observer, "minmax");
  EXPECT_FLOAT_EQ(range.min, -5);
  EXPECT_FLOAT_EQ(range.max, 3);
  EXPECT_EQ(range.batches, 2);
}

TEST(ObserverTest, MovingAverageMovesTowardsEachLaterBatch) {
  CalibrationResults results;
  ObserverOptions o;
  o.kind = ObserverKind::kMovingAverageMinMax;
  o.averaging_constant = 0.25;
  ASSERT_OK(Observe(o, TwoBatches(), results));
  const ActivationRange& range = results.modules.at(kDown).input;
  EXPECT_EQ(range.observer, "moving-average-minmax");
  // The first batch sets [-2, 3]; the second moves a quarter of the way to
  // [-5, 1].
  EXPECT_FLOAT_EQ(range.min, -2 + 0.25 * (-5 - -2));
  EXPECT_FLOAT_EQ(range.max, 3 + 0.25 * (1 - 3));
}

TEST(ObserverTest, NonFiniteInputIsRefusedNamingModuleAndBatch) {
  CalibrationResults results;
  std::vector<at::Tensor> xs = TwoBatches();
  xs[1][0][3].fill_(NAN);
  EXPECT_THAT(Observe(ObserverOptions(), xs, results),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(kDown), HasSubstr("batch 1"),
                             HasSubstr("NaN"))));
}

TEST(ObserverTest, AveragingConstantOutOfRangeIsRefused) {
  CalibrationResults results;
  ObserverOptions o;
  o.kind = ObserverKind::kMovingAverageMinMax;
  o.averaging_constant = 0;
  EXPECT_THAT(Observe(o, TwoBatches(), results),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("averaging_constant")));
}

}  // namespace
}  // namespace tracecut::modifiers
