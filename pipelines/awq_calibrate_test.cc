// The AWQ modifier in calibration runs: the model's output unchanged by the
// smoothing it applies, and the recipe wiring. Its formulas are
// modifiers/awq_modifier_test.cc; parity with llm-compressor is
// tests/cli/awq_parity_test.py.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "modifiers/awq_modifier.h"
#include "pipelines/calibrate.h"
#include "pipelines/recipe.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::AwqModifier;
using ::tracecut::modifiers::AwqOptions;
using ::tracecut::modifiers::ModuleRecord;
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::Runfile;
using ::tracecut::util::testing::StatusIs;
using ::tracecut::util::testing::TempDir;

std::string Llama() { return Runfile("tests/fixtures/llama.pt"); }

quantization::QuantizationArgs Int4Group32Asym() {
  quantization::QuantizationArgs a;
  a.num_bits = 4;
  a.symmetric = false;
  a.strategy = quantization::Strategy::kGroup;
  a.group_size = 32;
  EXPECT_OK(a.Resolve("weights"));
  return a;
}

// A calibration of the Llama fixture on 8 synthetic samples in batches of
// 4, into a fresh directory; the caller adds the recipe or modifiers.
CalibrateOptions LlamaRun(const std::string& name) {
  CalibrateOptions o;
  o.model_path = Llama();
  o.synthetic_samples = 8;
  o.batch_size = 4;
  o.output_path = absl::StrCat(TempDir(name), "/model.pt");
  return o;
}

at::Tensor Logits(const torch::jit::Module& m, const at::Tensor& ids) {
  std::vector<c10::IValue> inputs = {ids, at::ones_like(ids)};
  return const_cast<torch::jit::Module&>(m)
      .forward(inputs)
      .toTupleRef()
      .elements()[0]
      .toTensor();
}

TEST(AwqModifierTest, SmoothingKeepsWhatTheModelComputes) {
  AwqOptions options;
  options.weights = Int4Group32Asym();
  options.quantized.targets = {"Linear"};
  options.quantized.ignore = {"lm_head"};
  options.n_grid = 6;
  AwqModifier awq(options);
  CalibrateOptions o = LlamaRun("awq");
  o.recipe.add_sequential_targets("LlamaDecoderLayer");
  o.extra_modifiers = {&awq};
  ASSERT_OK_AND_ASSIGN(CalibrateOutcome out, Calibrate(o));
  ASSERT_TRUE(out.model.has_value());

  // All four mappings of both layers, each with its parent.
  ASSERT_EQ(awq.resolved().size(), 8u);
  EXPECT_EQ(awq.resolved()[0].smooth, "model.layers.0.input_layernorm");
  EXPECT_EQ(awq.resolved()[0].parent, "model.layers.0.self_attn");
  EXPECT_EQ(awq.resolved()[0].loss_leaf, "model.layers.0.self_attn.o_proj");
  const AwqModifier::Resolved* v_o = nullptr;
  for (const AwqModifier::Resolved& r : awq.resolved()) {
    if (r.smooth == "model.layers.1.self_attn.v_proj") v_o = &r;
  }
  ASSERT_NE(v_o, nullptr);
  EXPECT_EQ(v_o->parent, "model.layers.1.self_attn.o_proj");
  EXPECT_EQ(v_o->loss_leaf, "model.layers.1.self_attn.o_proj");
  // Each smooth layer got its search recorded.
  const ModuleRecord* norm =
      out.results.FindModule("model.layers.1.post_attention_layernorm");
  ASSERT_NE(norm, nullptr);
  ASSERT_EQ(norm->notes.size(), 1u);
  EXPECT_THAT(norm->notes[0], HasSubstr("awq: scales for "));

  // Some weights moved, and the model computes the same.
  torch::jit::Module original = torch::jit::load(Llama());
  ASSERT_OK_AND_ASSIGN(
      at::Tensor q,
      out.model->GetTensor("model.layers.0.self_attn.q_proj.weight"));
  at::Tensor q0 = original.attr("model")
                      .toModule()
                      .attr("layers")
                      .toModule()
                      .attr("0")
                      .toModule()
                      .attr("self_attn")
                      .toModule()
                      .attr("q_proj")
                      .toModule()
                      .attr("weight")
                      .toTensor();
  EXPECT_FALSE(at::equal(q, q0));
  at::manual_seed(5);
  at::Tensor ids = at::randint(0, 256, {2, 16}, at::kLong);
  at::Tensor want = Logits(original, ids);
  at::Tensor got = Logits(out.model->module(), ids);
  const double err = ((got - want).norm() / want.norm()).item<double>();
  EXPECT_LT(err, 1e-5) << "logits relative error " << err;
}

TEST(AwqModifierTest, SmoothingThatChangesTheModelIsRefused) {
  // gate/up do not read input_layernorm's output: dividing that norm by the
  // scales found for them changes what the layer computes.
  AwqOptions options;
  options.weights = Int4Group32Asym();
  options.quantized.targets = {"Linear"};
  options.mappings = {
      {"re:.*input_layernorm$", {"re:.*gate_proj$", "re:.*up_proj$"}}};
  options.n_grid = 4;
  AwqModifier awq(options);
  CalibrateOptions o = LlamaRun("awq_wrong");
  o.recipe.add_sequential_targets("LlamaDecoderLayer");
  o.extra_modifiers = {&awq};
  EXPECT_THAT(Calibrate(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("_layernorm: smoothing changed what "
                                 "model.layers.")));
}

TEST(AwqModifierTest, RecipeNeedsAQuantizerAfterIt) {
  EXPECT_THAT(ParseRecipe("modifiers { awq {} }", "r.textproto").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not followed by a gptq or rtn modifier")));
  EXPECT_THAT(ParseRecipe(R"pb(
                            modifiers { awq { n_grid: 2 } }
                            modifiers {
                              rtn {
                                scheme { bits: 4 group_size: 32 }
                                targets: "Linear"
                              }
                            })pb",
                          "r.textproto")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("n_grid: must be in [3, 1000]")));
  EXPECT_OK(ParseRecipe(R"pb(
                          modifiers {
                            awq {
                              scheme { bits: 4 group_size: 32 }
                              ignore: "lm_head"
                            }
                          })pb",
                        "r.textproto"));
  EXPECT_THAT(
      ParseRecipe(R"pb(
                    modifiers { awq { ignore: "lm_head" } }
                    modifiers {
                      rtn {
                        scheme { bits: 4 group_size: 32 }
                        targets: "Linear"
                      }
                    })pb",
                  "r.textproto")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("scheme: is required with targets or ignore")));
  EXPECT_OK(ParseRecipe(R"pb(
                          modifiers { awq { duo_scaling: BOTH } }
                          modifiers {
                            rtn {
                              scheme { bits: 4 group_size: 32 symmetric: false }
                              targets: "Linear"
                              ignore: "lm_head"
                            }
                          })pb",
                        "r.textproto"));
}

TEST(AwqModifierTest, RunsBeforeItsQuantizerFromARecipe) {
  CalibrateOptions o = LlamaRun("awq_rtn");
  ASSERT_OK_AND_ASSIGN(
      o.recipe,
      ParseRecipe(R"pb(
                    modifiers { awq { n_grid: 4 } }
                    modifiers {
                      rtn {
                        scheme { bits: 4 group_size: 32 symmetric: false }
                        targets: "Linear"
                        ignore: "lm_head"
                      }
                    }
                    sequential_targets: "LlamaDecoderLayer"
                  )pb",
                  "r.textproto"));
  ASSERT_OK_AND_ASSIGN(CalibrateOutcome out, Calibrate(o));
  const ModuleRecord* q =
      out.results.FindModule("model.layers.0.self_attn.q_proj");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->weight_method, "rtn");
  const ModuleRecord* norm =
      out.results.FindModule("model.layers.0.input_layernorm");
  ASSERT_NE(norm, nullptr);
  EXPECT_THAT(norm->notes.front(), HasSubstr("awq: scales for "));
}

}  // namespace
}  // namespace tracecut::pipelines