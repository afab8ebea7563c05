// The weight quantizers driven hook by hook on the traced Llama fixture,
// against quantization/'s functions on the same tensors.
// Their runs inside pipelines are pipelines/pipeline_test.cc.

#include "modifiers/weight_quant_modifier.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "modifiers/testing/traced_llama.h"
#include "quantization/quantize.h"
#include "util/progress.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::tracecut::modifiers::testing::CallOf;
using ::tracecut::modifiers::testing::TraceLlamaFixture;
using ::tracecut::modifiers::testing::WholeModel;

constexpr char kDown[] = "model.layers.0.mlp.down_proj";

at::Tensor Weight(runtime::GraphModule& gm, const std::string& path) {
  absl::StatusOr<at::Tensor> w = gm.GetTensor(path + ".weight");
  EXPECT_OK(w);
  return w->clone();
}

TEST(RtnModifierTest, QuantizesTargetsAsQuantizeRtnAndLeavesTheIgnored) {
  runtime::GraphModule gm = TraceLlamaFixture();
  util::Progress progress = util::Progress::Silent();
  CalibrationResults results;
  RunContext ctx(&gm, &results, /*num_batches=*/1, &progress);
  const at::Tensor down = Weight(gm, kDown);
  const at::Tensor head = Weight(gm, "lm_head");

  WeightQuantOptions o;
  o.modules.targets = {"Linear"};
  o.modules.ignore = {"lm_head"};
  o.scheme.bits = 4;
  o.scheme.symmetric = false;
  o.scheme.group_size = 16;
  RtnModifier rtn(o);
  const SubgraphInfo info = WholeModel(ctx);
  ASSERT_OK(rtn.OnRunStart(ctx));
  ASSERT_OK(rtn.OnSubgraphStart(ctx, info));
  ASSERT_OK(rtn.OnSubgraphEnd(ctx, info));
  ASSERT_OK(rtn.OnRunEnd(ctx));

  ASSERT_OK_AND_ASSIGN(quantization::RtnResult want,
                       quantization::QuantizeRtn(down, o.scheme));
  EXPECT_TRUE(at::equal(Weight(gm, kDown), want.weight));
  EXPECT_TRUE(at::equal(Weight(gm, "lm_head"), head));
  const ModuleRecord& r = results.modules.at(kDown);
  EXPECT_EQ(r.weight_method, "rtn");
  EXPECT_TRUE(at::equal(r.weight_scale, want.params.scale));
  EXPECT_FALSE(results.modules.contains("lm_head") &&
               !results.modules.at("lm_head").weight_method.empty());
}

}  // namespace
}  // namespace tracecut::modifiers
