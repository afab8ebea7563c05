// The SmoothQuant modifier in calibration runs: the model's output
// unchanged by smoothing, a quantizer in the same run seeing the smoothed
// model, mappings that match nothing refused. Its formula is
// modifiers/smoothquant_modifier_test.cc.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "modifiers/smoothquant_modifier.h"
#include "pipelines/calibrate.h"
#include "pipelines/recipe.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::pipelines {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::Runfile;
using ::tracecut::util::testing::StatusIs;
using ::tracecut::util::testing::TempDir;

std::string Llama() { return Runfile("tests/fixtures/llama.pt"); }

CalibrateOptions Options(const std::string& dir, const std::string& recipe) {
  CalibrateOptions o;
  o.model_path = Llama();
  absl::StatusOr<recipe::Recipe> r = ParseRecipe(recipe, "test.textproto");
  EXPECT_OK(r);
  o.recipe = *r;
  o.synthetic_samples = 8;
  o.batch_size = 4;
  o.output_path = absl::StrCat(dir, "/model.pt");
  return o;
}

at::Tensor Tensor(const runtime::GraphModule& gm, const std::string& path) {
  absl::StatusOr<at::Tensor> t = gm.GetTensor(path);
  EXPECT_OK(t);
  return t->clone();
}

at::Tensor Logits(const torch::jit::Module& m, const at::Tensor& ids) {
  std::vector<c10::IValue> inputs = {ids, at::ones_like(ids)};
  return const_cast<torch::jit::Module&>(m)
      .forward(inputs)
      .toTupleRef()
      .elements()[0]
      .toTensor();
}

TEST(SmoothQuantModifierTest, SmoothingKeepsWhatTheModelComputes) {
  std::string dir = TempDir("smooth");
  CalibrateOptions o = Options(dir, R"pb(
    modifiers { smoothquant { smoothing_strength: 0.8 } }
    sequential_targets: "LlamaDecoderLayer"
  )pb");
  ASSERT_OK_AND_ASSIGN(CalibrateOutcome out, Calibrate(o));
  ASSERT_TRUE(out.model.has_value());
  torch::jit::Module original = torch::jit::load(Llama());
  runtime::GraphModule& smoothed = *out.model;

  // Every layer's two norms were smoothed, and each balance weight is the
  // original times the factor its norm was divided by.
  for (int layer = 0; layer < 2; ++layer) {
    const std::string l = absl::StrCat("model.layers.", layer, ".");
    const std::pair<const char*, std::vector<const char*>> mappings[] = {
        {"input_layernorm",
         {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
        {"post_attention_layernorm", {"mlp.gate_proj", "mlp.up_proj"}}};
    for (const auto& [norm, balance] : mappings) {
      const std::string norm_path = absl::StrCat(l, norm, ".weight");
      at::Tensor before = original.attr("model")
                              .toModule()
                              .attr("layers")
                              .toModule()
                              .attr(std::to_string(layer))
                              .toModule()
                              .attr(norm)
                              .toModule()
                              .attr("weight")
                              .toTensor();
      at::Tensor after = Tensor(smoothed, norm_path);
      at::Tensor s = before / after;
      EXPECT_FALSE(at::allclose(s, at::ones_like(s))) << norm_path;
      for (const char* b : balance) {
        torch::jit::Module m = original;
        for (const std::string& part :
             {std::string("model"), std::string("layers"),
              std::to_string(layer)}) {
          m = m.attr(part).toModule();
        }
        const std::string name(b);
        const size_t dot = name.find('.');
        at::Tensor w = m.attr(name.substr(0, dot))
                           .toModule()
                           .attr(name.substr(dot + 1))
                           .toModule()
                           .attr("weight")
                           .toTensor();
        at::Tensor got = Tensor(smoothed, absl::StrCat(l, b, ".weight"));
        EXPECT_TRUE(at::allclose(got, w * s.view({1, -1}), 1e-5, 1e-7))
            << l << b;
      }
    }
  }
  // Not a balance layer: untouched.
  EXPECT_TRUE(
      at::equal(Tensor(smoothed, "model.layers.0.self_attn.o_proj.weight"),
                original.attr("model")
                    .toModule()
                    .attr("layers")
                    .toModule()
                    .attr("0")
                    .toModule()
                    .attr("self_attn")
                    .toModule()
                    .attr("o_proj")
                    .toModule()
                    .attr("weight")
                    .toTensor()));

  // What the model computes: unchanged within float tolerance.
  at::manual_seed(5);
  at::Tensor ids = at::randint(0, 256, {2, 16}, at::kLong);
  at::Tensor want = Logits(original, ids);
  at::Tensor got = Logits(smoothed.module(), ids);
  const double err = ((got - want).norm() / want.norm()).item<double>();
  EXPECT_LT(err, 1e-5) << "logits relative error " << err;
  EXPECT_TRUE(at::allclose(got, want, 1e-4, 1e-5));
}

TEST(SmoothQuantModifierTest, SmoothingThatChangesTheModelIsRefused) {
  // gate/up do not read input_layernorm's output (as a Gemma norm, which
  // multiplies by 1 + weight, would not scale it): refused, not applied.
  std::string dir = TempDir("wrong");
  CalibrateOptions o = Options(dir, R"pb(
    modifiers {
      smoothquant {
        mappings {
          balance_layers: "re:.*gate_proj"
          balance_layers: "re:.*up_proj"
          smooth_layer: "re:.*input_layernorm"
        }
      }
    }
    sequential_targets: "LlamaDecoderLayer"
  )pb");
  EXPECT_THAT(Calibrate(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("smoothquant: model.layers.0.input_layernorm: "
                                 "smoothing changed what")));
}

TEST(SmoothQuantModifierTest, QuantizerInTheSameRunSeesTheSmoothedModel) {
  // One run (SmoothQuant, then GPTQ) against two: SmoothQuant alone, then
  // GPTQ on its output. The first decoder layer gets the same inputs in
  // both, so its GPTQ weights are the same only if GPTQ's Hessian came from
  // the smoothed activations (Note [Transforms first]).
  constexpr char kGptq[] = R"pb(
    gptq {
      scheme { bits: 4 group_size: 64 }
      targets: "re:.*layers.*"
    })pb";
  std::string one_dir = TempDir("one");
  ASSERT_OK_AND_ASSIGN(
      CalibrateOutcome one,
      Calibrate(Options(one_dir, absl::StrCat("modifiers { smoothquant {} }\n"
                                              "modifiers {",
                                              kGptq,
                                              "}\nsequential_targets: "
                                              "\"LlamaDecoderLayer\""))));
  std::string first_dir = TempDir("first");
  CalibrateOptions first = Options(first_dir, R"pb(
    modifiers { smoothquant {} }
    sequential_targets: "LlamaDecoderLayer"
  )pb");
  ASSERT_OK(Calibrate(first));
  std::string second_dir = TempDir("second");
  CalibrateOptions second =
      Options(second_dir, absl::StrCat("modifiers {", kGptq,
                                       "}\nsequential_targets: "
                                       "\"LlamaDecoderLayer\""));
  second.model_path = first.output_path;
  ASSERT_OK_AND_ASSIGN(CalibrateOutcome two, Calibrate(second));

  for (const char* b : {"self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj",
                        "mlp.down_proj"}) {
    const std::string w = absl::StrCat("model.layers.0.", b, ".weight");
    EXPECT_TRUE(at::equal(Tensor(*one.model, w), Tensor(*two.model, w))) << w;
  }
  EXPECT_TRUE(
      at::equal(Tensor(*one.model, "model.layers.0.input_layernorm.weight"),
                Tensor(*two.model, "model.layers.0.input_layernorm.weight")));
}

TEST(SmoothQuantModifierTest, MappingsThatMatchNothingAreRefused) {
  std::string dir = TempDir("nomatch");
  CalibrateOptions o = Options(dir, R"pb(
    modifiers {
      smoothquant {
        mappings { balance_layers: "re:.*fc1" smooth_layer: "re:.*ln_2" }
      }
    }
    sequential_targets: "LlamaDecoderLayer"
  )pb");
  EXPECT_THAT(Calibrate(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("smoothquant: no mapping matched the model "
                                 "(smooth layers re:.*ln_2)")));

  // A balance layer that does not read the smooth layer's output.
  o = Options(dir, R"pb(
    modifiers {
      smoothquant {
        mappings {
          balance_layers: "re:.*q_proj"
          balance_layers: "re:.*o_proj"
          smooth_layer: "re:.*input_layernorm"
        }
      }
    }
    sequential_targets: "LlamaDecoderLayer"
  )pb");
  EXPECT_THAT(Calibrate(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("read different inputs")));
}

}  // namespace
}  // namespace tracecut::pipelines