// The GPTQ modifier driven hook by hook on the traced Llama fixture: what it
// writes is quantization::GptqQuantize on the Hessian of the inputs it saw.

#include "modifiers/gptq_modifier.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "modifiers/testing/traced_llama.h"
#include "quantization/gptq.h"
#include "util/progress.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::tracecut::modifiers::testing::CallOf;
using ::tracecut::modifiers::testing::TraceLlamaFixture;
using ::tracecut::modifiers::testing::WholeModel;

constexpr char kDown[] = "model.layers.0.mlp.down_proj";

TEST(GptqModifierTest, WritesGptqOfTheHessianOfWhatItSaw) {
  runtime::GraphModule gm = TraceLlamaFixture();
  util::Progress progress = util::Progress::Silent();
  CalibrationResults results;
  RunContext ctx(&gm, &results, /*num_batches=*/3, &progress);
  ASSERT_OK_AND_ASSIGN(at::Tensor weight,
                       gm.GetTensor(absl::StrCat(kDown, ".weight")));
  const at::Tensor original = weight.clone();

  GptqModifierOptions o;
  o.weights.modules.targets = {kDown};
  o.weights.scheme.bits = 4;
  o.weights.scheme.symmetric = true;
  o.weights.scheme.group_size = 16;
  o.act_order = true;
  GptqModifier gptq(o);
  const SubgraphInfo info = WholeModel(ctx);
  ASSERT_OK(gptq.OnRunStart(ctx));
  ASSERT_OK(gptq.OnSubgraphStart(ctx, info));
  const LeafModule* leaf = ctx.FindLeaf(kDown);
  ASSERT_NE(leaf, nullptr);
  ASSERT_TRUE(gptq.WantsModule(kDown, leaf->type));
  quantization::HessianAccumulator want_h(original.size(1));
  at::manual_seed(3);
  for (int64_t b = 0; b < 3; ++b) {
    const at::Tensor x = at::randn({2, 5, original.size(1)});
    ASSERT_OK(want_h.Add(x));
    std::vector<c10::IValue> inputs = {x};
    ASSERT_OK(gptq.OnModuleCall(ctx, CallOf(*leaf, inputs, b)));
  }
  ASSERT_OK(gptq.OnSubgraphEnd(ctx, info));
  ASSERT_OK(gptq.OnRunEnd(ctx));

  quantization::GptqOptions g;
  g.scheme = o.weights.scheme;
  g.act_order = true;
  ASSERT_OK_AND_ASSIGN(
      quantization::GptqResult want,
      quantization::GptqQuantize(original, want_h.hessian(), g));
  ASSERT_OK_AND_ASSIGN(at::Tensor got,
                       gm.GetTensor(absl::StrCat(kDown, ".weight")));
  EXPECT_TRUE(at::equal(got, want.weight));
  const ModuleRecord& r = results.modules.at(kDown);
  EXPECT_EQ(r.weight_method, "gptq");
  EXPECT_EQ(r.calibration_tokens, 3 * 2 * 5);
  EXPECT_TRUE(at::equal(r.weight_g_idx, want.g_idx));
}

}  // namespace
}  // namespace tracecut::modifiers
