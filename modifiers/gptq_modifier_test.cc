// The GPTQ modifier driven hook by hook on the traced Llama fixture: what it
// writes is quantization::GptqQuantize on the Hessian of the inputs it saw.

#include "modifiers/gptq_modifier.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "modifiers/testing/traced_llama.h"
#include "quantization/fake_quant.h"
#include "quantization/gptq.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
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

// Note [Output error from the errors]: GPTQ's reported output error comes
// from its own errors, not a product, and equals the product's
// (pipeline_test checks that Linears solved together report what each
// solved alone does).
TEST(GptqModifierTest, ReportsTheProductsOutputErrorWithoutTheProduct) {
  runtime::GraphModule gm = TraceLlamaFixture();
  util::Progress progress = util::Progress::Silent();
  CalibrationResults results;
  RunContext ctx(&gm, &results, /*num_batches=*/3, &progress);
  const std::vector<std::string> paths = {
      "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
      "model.layers.0.self_attn.v_proj", kDown};
  std::vector<at::Tensor> originals;
  for (const std::string& path : paths) {
    ASSERT_OK_AND_ASSIGN(at::Tensor w,
                         gm.GetTensor(absl::StrCat(path, ".weight")));
    originals.push_back(w.clone());
  }
  GptqModifierOptions o;
  ASSERT_OK_AND_ASSIGN(quantization::QuantizationScheme w4a16,
                       quantization::PresetScheme("W4A16", paths));
  w4a16.weights->group_size = 16;
  o.weights.typed = w4a16;
  o.weights.modules.targets = paths;
  GptqModifier gptq(o);
  const SubgraphInfo info = WholeModel(ctx);
  ASSERT_OK(gptq.OnRunStart(ctx));
  ASSERT_OK(gptq.OnSubgraphStart(ctx, info));
  std::vector<quantization::HessianAccumulator> want_h;
  for (const at::Tensor& w : originals) want_h.emplace_back(w.size(1));
  at::manual_seed(4);
  // With their modules and outputs, as the pipeline calls it: the weights'
  // traces come from the outputs (Note [Output energy]).
  std::vector<torch::jit::Module> modules;
  for (const std::string& path : paths) {
    ASSERT_OK_AND_ASSIGN(torch::jit::Module m, gm.GetSubmodule(path));
    modules.push_back(m);
  }
  for (int64_t b = 0; b < 3; ++b) {
    const at::Tensor x = at::randn({2, 5, originals[0].size(1)});
    const at::Tensor y = at::randn({2, 5, originals[3].size(1)});
    for (size_t i = 0; i < paths.size(); ++i) {
      const LeafModule* leaf = ctx.FindLeaf(paths[i]);
      ASSERT_NE(leaf, nullptr);
      const at::Tensor& in = i < 3 ? x : y;
      ASSERT_OK(want_h[i].Add(in));
      std::vector<c10::IValue> inputs = {in};
      const c10::IValue out = at::linear(in, originals[i]);
      ModuleCall call = CallOf(*leaf, inputs, b);
      call.module = &modules[i];
      call.output = &out;
      ASSERT_OK(gptq.OnModuleCall(ctx, call));
    }
  }
  // A weight changed in place after its calls (as a smoothing modifier
  // would): its outputs' energy no longer applies, the product is used.
  {
    ASSERT_OK_AND_ASSIGN(at::Tensor w,
                         gm.GetTensor(absl::StrCat(kDown, ".weight")));
    at::NoGradGuard no_grad;
    w.add_(at::randn_like(w) * 0.02);
    originals[3] = w.clone();
  }
  ASSERT_OK(gptq.OnSubgraphEnd(ctx, info));
  ASSERT_OK(gptq.OnRunEnd(ctx));
  for (size_t i = 0; i < paths.size(); ++i) {
    SCOPED_TRACE(paths[i]);
    ASSERT_OK_AND_ASSIGN(at::Tensor got,
                         gm.GetTensor(absl::StrCat(paths[i], ".weight")));
    ASSERT_OK_AND_ASSIGN(
        quantization::QParams q,
        quantization::WeightQParams(originals[i], *w4a16.weights));
    ASSERT_OK_AND_ASSIGN(at::Tensor rtn, quantization::FakeQuantize(
                                             originals[i], q, *w4a16.weights));
    ASSERT_OK_AND_ASSIGN(
        std::vector<double> want,
        RelativeOutputErrors(originals[i], {got, rtn}, want_h[i].hessian()));
    const ModuleRecord& r = results.modules.at(paths[i]);
    EXPECT_GT(want[0], 0);
    EXPECT_LT(want[0], want[1]);
    EXPECT_NEAR(r.weight_error, want[0], 1e-5 * want[0]);
    EXPECT_NEAR(r.rtn_error, want[1], 1e-5 * want[1]);
  }
}

}  // namespace
}  // namespace tracecut::modifiers
