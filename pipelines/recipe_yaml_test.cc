#include "pipelines/recipe_yaml.h"

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/message_differencer.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "modifiers/gptq_modifier.h"
#include "modifiers/recipe_config.h"
#include "pipelines/recipe.h"
#include "quantization/quant_args.h"
#include "util/json.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::IsTypedScheme;
using ::tracecut::modifiers::ResolveActOrder;
using ::tracecut::modifiers::ToKvCacheArgs;
using ::tracecut::modifiers::ToTypedScheme;
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

constexpr char kSource[] = "recipe.yaml";

// The error message of parsing `text`, or "OK".
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<recipe::Recipe> r = ParseRecipeYaml(text, kSource);
  if (r.ok()) return "OK";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

// One GPTQModifier with `fields` (indented 6).
std::string Gptq(const std::string& fields) {
  return absl::StrCat("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n",
                      fields);
}

// A scheme's weights as QuantizationArgs::ToString ("int4 sym group128"):
// recipe.yaml schemes are compressed-tensors ones.
std::string WeightsOf(const recipe::QuantizationScheme& s) {
  if (!IsTypedScheme(s)) return "tracecut's integer fields";
  absl::StatusOr<quantization::QuantizationScheme> t =
      ToTypedScheme(s, {"Linear"});
  if (!t.ok()) return std::string(t.status().message());
  return t->weights->ToString();
}

// The activation order a GPTQ modifier runs with: "none", "weight" or
// "static".
std::string ActOrderOf(const recipe::GptqModifier& g) {
  absl::StatusOr<quantization::QuantizationScheme> t =
      ToTypedScheme(g.scheme(), {"Linear"});
  if (!t.ok()) return std::string(t.status().message());
  const quantization::ActOrder a = ResolveActOrder(g, t->weights->actorder);
  return a == quantization::ActOrder::kNone
             ? "none"
             : std::string(quantization::ActOrderName(a));
}

recipe::Recipe Textproto(const std::string& text) {
  recipe::Recipe r;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &r)) << text;
  return r;
}

TEST(RecipeYamlTest, LlmCompressorsWrittenRecipeLoads) {
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      LoadRecipeFile("pipelines/testdata/llmcompressor_w4a16.yaml"));
  ASSERT_EQ(r.modifiers_size(), 2);
  const recipe::GptqModifier& g = r.modifiers(0).gptq();
  // Presets are compressed-tensors' (absmax/7.5 grids), as llm-compressor
  // runs them.
  EXPECT_EQ(g.scheme().preset(), "W4A16");
  EXPECT_EQ(WeightsOf(g.scheme()), "int4 sym group128");
  EXPECT_EQ(g.targets_size(), 1);
  EXPECT_EQ(g.targets(0), "Linear");
  EXPECT_EQ(g.ignore(0), "lm_head");
  EXPECT_DOUBLE_EQ(g.dampening_frac(), 0.01);
  EXPECT_EQ(g.block_size(), 128);
  // actorder: static is act order with groups fixed up front.
  EXPECT_NE(ActOrderOf(g), "none");
  const recipe::RtnModifier& q = r.modifiers(1).rtn();
  EXPECT_EQ(q.scheme().preset(), "W4A16_ASYM");
  EXPECT_EQ(WeightsOf(q.scheme()), "int4 asym group128");
  EXPECT_EQ(q.ignore(0), "lm_head");
  // Pipeline settings are oneshot's defaults.
  EXPECT_EQ(r.pipeline(), recipe::Recipe::SEQUENTIAL);
  EXPECT_TRUE(r.propagate_error());
  EXPECT_TRUE(r.sequential_targets().empty());
}

TEST(RecipeYamlTest, GptqDocstringExampleLoads) {
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      LoadRecipeFile("pipelines/testdata/llmcompressor_gptq_docstring.yaml"));
  ASSERT_EQ(r.modifiers_size(), 1);
  const recipe::GptqModifier& g = r.modifiers(0).gptq();
  EXPECT_TRUE(g.scheme().has_json());
  EXPECT_EQ(WeightsOf(g.scheme()), "int8 sym group128");
  EXPECT_DOUBLE_EQ(g.dampening_frac(), 0.001);
  EXPECT_NE(ActOrderOf(g), "none");
  EXPECT_EQ(g.targets(0), "Linear");
  // GPTQModifier's default ignore is empty.
  EXPECT_EQ(g.ignore_size(), 0);
}

TEST(RecipeYamlTest, TextprotoStillLoadsByExtension) {
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      LoadRecipeFile("pipelines/testdata/gptq_w4g128.textproto"));
  EXPECT_TRUE(r.modifiers(0).has_gptq());
  EXPECT_FALSE(IsYamlRecipePath("a.textproto"));
  EXPECT_TRUE(IsYamlRecipePath("dir/recipe.YAML"));
  EXPECT_TRUE(IsYamlRecipePath("recipe.yml"));
}

TEST(RecipeYamlTest, SchemeForms) {
  // Preset by name with the modifier's targets (default ["Linear"]).
  ASSERT_OK_AND_ASSIGN(recipe::Recipe r,
                       ParseRecipeYaml(Gptq("      scheme: W8A16\n")));
  EXPECT_EQ(r.modifiers(0).gptq().scheme().preset(), "W8A16");
  EXPECT_EQ(WeightsOf(r.modifiers(0).gptq().scheme()), "int8 sym group128");
  EXPECT_EQ(r.modifiers(0).gptq().targets(0), "Linear");

  // {PRESET: targets}: one modifier per preset, in order.
  ASSERT_OK_AND_ASSIGN(
      r, ParseRecipeYaml(Gptq("      scheme:\n        W4A16: [re:.*mlp.*]\n"
                              "        W8A16: re:.*self_attn.*\n")));
  ASSERT_EQ(r.modifiers_size(), 2);
  EXPECT_EQ(r.modifiers(0).gptq().scheme().preset(), "W4A16");
  EXPECT_EQ(r.modifiers(0).gptq().targets(0), "re:.*mlp.*");
  EXPECT_EQ(r.modifiers(1).gptq().scheme().preset(), "W8A16");
  EXPECT_EQ(r.modifiers(1).gptq().targets(0), "re:.*self_attn.*");

  // config_groups: compressed-tensors infers the strategy from group_size.
  ASSERT_OK_AND_ASSIGN(
      r, ParseRecipeYaml(Gptq("      actorder: null\n"
                              "      config_groups:\n"
                              "        g:\n"
                              "          targets: [Linear]\n"
                              "          weights: {num_bits: 4, symmetric: "
                              "false, group_size: -1}\n"
                              "        t:\n"
                              "          targets: [lm_head]\n"
                              "          weights: {num_bits: 8}\n")));
  ASSERT_EQ(r.modifiers_size(), 2);
  EXPECT_EQ(WeightsOf(r.modifiers(0).gptq().scheme()), "int4 asym channel");
  EXPECT_EQ(ActOrderOf(r.modifiers(0).gptq()), "none");
  EXPECT_EQ(WeightsOf(r.modifiers(1).gptq().scheme()), "int8 sym tensor");
}

TEST(RecipeYamlTest, KvCacheSchemeIsReadAndWrittenBack) {
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      ParseRecipeYaml(
          "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
          "      scheme: {FP8_DYNAMIC: [re:.*mlp.*], W8A16: [re:.*attn.*]}\n"
          "      kv_cache_scheme: {num_bits: 8, type: float, strategy: "
          "tensor, dynamic: false, symmetric: true}\n"));
  ASSERT_EQ(r.modifiers_size(), 2);
  // Calibrated once: by the first group's modifier.
  ASSERT_TRUE(r.modifiers(0).rtn().has_kv_cache_scheme());
  EXPECT_FALSE(r.modifiers(1).rtn().has_kv_cache_scheme());
  ASSERT_OK_AND_ASSIGN(quantization::QuantizationArgs kv,
                       ToKvCacheArgs(r.modifiers(0).rtn().kv_cache_scheme()));
  EXPECT_EQ(kv.ToString(), "float8 sym tensor");
  ASSERT_OK_AND_ASSIGN(std::string yaml, RecipeToYaml(r));
  EXPECT_THAT(yaml, HasSubstr("kv_cache_scheme:"));
  ASSERT_OK_AND_ASSIGN(recipe::Recipe back, ParseRecipeYaml(yaml));
  EXPECT_EQ(back.modifiers(0).rtn().kv_cache_scheme(),
            r.modifiers(0).rtn().kv_cache_scheme());
}

TEST(RecipeYamlTest, FloatAndActivationSchemesAreCompressedTensors) {
  // Presets tracecut's integer fields cannot express keep their name.
  ASSERT_OK_AND_ASSIGN(recipe::Recipe r,
                       ParseRecipeYaml(Gptq("      scheme: fp8_dynamic\n")));
  EXPECT_EQ(r.modifiers(0).gptq().scheme().preset(), "FP8_DYNAMIC");
  EXPECT_FALSE(r.modifiers(0).gptq().has_actorder());  // "static" default.
  EXPECT_FALSE(r.modifiers(0).gptq().has_static_groups());
  // A config group with float weights and dynamic activations: its JSON.
  ASSERT_OK_AND_ASSIGN(
      r, ParseRecipeYaml(
             "quant_stage:\n  quant_modifiers:\n    QuantizationModifier:\n"
             "      ignore: [lm_head]\n      config_groups:\n        g:\n"
             "          targets: [Linear]\n"
             "          weights: {num_bits: 8, type: float, strategy: "
             "channel}\n"
             "          input_activations: {num_bits: 8, type: float, "
             "strategy: token, dynamic: true}\n"));
  const recipe::RtnModifier& rtn = r.modifiers(0).rtn();
  ASSERT_TRUE(rtn.scheme().has_json());
  ASSERT_OK_AND_ASSIGN(quantization::QuantizationScheme got,
                       ToTypedScheme(rtn.scheme(), {rtn.targets().begin(),
                                                    rtn.targets().end()}));
  ASSERT_OK_AND_ASSIGN(quantization::QuantizationScheme want,
                       quantization::PresetScheme("FP8_DYNAMIC", {"Linear"}));
  EXPECT_TRUE(got == want);
  // Both forms write back as llm-compressor's and read back equal.
  for (const recipe::Recipe& in :
       {r, *ParseRecipeYaml(Gptq("      scheme: NVFP4A16\n"))}) {
    ASSERT_OK_AND_ASSIGN(std::string yaml, RecipeToYaml(in));
    ASSERT_OK_AND_ASSIGN(recipe::Recipe back, ParseRecipeYaml(yaml));
    google::protobuf::util::MessageDifferencer diff;
    diff.set_message_field_comparison(
        google::protobuf::util::MessageDifferencer::EQUIVALENT);
    std::string report;
    diff.ReportDifferencesToString(&report);
    EXPECT_TRUE(diff.Compare(in, back)) << report << "\n" << yaml;
  }
}

TEST(RecipeYamlTest, ActOrderResolvesAsGptqModifierDoes) {
  auto actorder = [](const std::string& modifier, const std::string& weights) {
    absl::StatusOr<recipe::Recipe> r = ParseRecipeYaml(Gptq(absl::StrCat(
        modifier,
        "      config_groups:\n        g:\n          targets: "
        "[Linear]\n          weights: {num_bits: 4, group_size: 32",
        weights, "}\n")));
    if (!r.ok()) return std::string(r.status().message());
    return ActOrderOf(r->modifiers(0).gptq());
  };
  EXPECT_EQ(actorder("", ""), "static");  // The Sentinel("static") default.
  EXPECT_EQ(actorder("", ", actorder: null"), "static");
  EXPECT_EQ(actorder("", ", actorder: weight"), "weight");
  EXPECT_EQ(actorder("      actorder: null\n", ""), "none");
  EXPECT_EQ(actorder("      actorder: weight\n", ""), "weight");
  EXPECT_EQ(actorder("      actorder: weight\n", ", actorder: static"),
            "static");
  EXPECT_THAT(actorder("      actorder: null\n", ", actorder: weight"),
              HasSubstr("differs from the actorder of the scheme's weights"));
  EXPECT_THAT(actorder("      actorder: group\n", ""),
              HasSubstr("was removed from llm-compressor"));
}

TEST(RecipeYamlTest, PipelineArgsAndLegacySequentialTargets) {
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      ParseRecipeYaml(Gptq("      scheme: W4A16\n"
                           "      sequential_targets: [LlamaDecoderLayer]\n") +
                      "args:\n  pipeline: layer_sequential\n"
                      "  propagate_error: false\n"
                      "  moe_calibrate_all_experts: false\n"));
  EXPECT_EQ(r.pipeline(), recipe::Recipe::LAYER_SEQUENTIAL);
  EXPECT_FALSE(r.propagate_error());
  EXPECT_TRUE(r.has_calibrate_all_experts());
  EXPECT_FALSE(r.calibrate_all_experts());  // true when the yaml is silent.
  ASSERT_EQ(r.sequential_targets_size(), 1);
  EXPECT_EQ(r.sequential_targets(0), "LlamaDecoderLayer");
}

TEST(RecipeYamlTest, StagesAndGroupsKeepTheirOrder) {
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      ParseRecipeYaml("first_stage:\n"
                      "  a_modifiers:\n"
                      "    QuantizationModifier:\n"
                      "      targets: lm_head\n"
                      "      scheme: W8A16\n"
                      "second_stage:\n"
                      "  b_modifiers:\n"
                      "    GPTQModifier: {scheme: W4A16}\n"
                      "  c_modifiers:\n"
                      "    QuantizationModifier: "
                      "{scheme: W2A16, targets: [Embedding]}\n"));
  ASSERT_EQ(r.modifiers_size(), 3);
  EXPECT_EQ(r.modifiers(0).rtn().targets(0), "lm_head");
  EXPECT_TRUE(r.modifiers(1).has_gptq());
  EXPECT_EQ(WeightsOf(r.modifiers(2).rtn().scheme()), "int2 sym group128");
}

TEST(RecipeYamlTest, SmoothQuantModifierAsLlmCompressorWritesIt) {
  // Recipe.from_modifiers([SmoothQuantModifier(smoothing_strength=0.8,
  // mappings=DEFAULT_SMOOTHQUANT_MAPPINGS), GPTQModifier(...)]).yaml(): its
  // LayerMap tuples come out as !!python/tuple.
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      ParseRecipeYaml(
          "default_stage:\n"
          "  default_modifiers:\n"
          "    SmoothQuantModifier:\n"
          "      requires_calibration_data: true\n"
          "      smoothing_strength: 0.8\n"
          "      mappings:\n"
          "      - !!python/tuple\n"
          "        - ['re:.*q_proj', 're:.*k_proj', 're:.*v_proj']\n"
          "        - re:.*input_layernorm\n"
          "      - - ['re:.*gate_proj', 're:.*up_proj']\n"
          "        - re:.*post_attention_layernorm\n"
          "      - {balance_layers: [re:.*fc1], smooth_layers: "
          "re:.*ln}\n"
          "      ignore: [lm_head]\n"
          "      algorithm: smoothquant\n"
          "    GPTQModifier: {scheme: W8A16, ignore: [lm_head]}\n"));
  ASSERT_EQ(r.modifiers_size(), 2);
  const recipe::SmoothQuantModifier& q = r.modifiers(0).smoothquant();
  EXPECT_DOUBLE_EQ(q.smoothing_strength(), 0.8);
  ASSERT_EQ(q.mappings_size(), 3);
  EXPECT_EQ(q.mappings(0).balance_layers_size(), 3);
  EXPECT_EQ(q.mappings(0).balance_layers(2), "re:.*v_proj");
  EXPECT_EQ(q.mappings(0).smooth_layer(), "re:.*input_layernorm");
  EXPECT_EQ(q.mappings(1).smooth_layer(), "re:.*post_attention_layernorm");
  EXPECT_EQ(q.mappings(2).balance_layers(0), "re:.*fc1");
  EXPECT_EQ(q.ignore(0), "lm_head");
  EXPECT_TRUE(r.modifiers(1).has_gptq());

  // The defaults: alpha 0.5, the architecture's mappings.
  ASSERT_OK_AND_ASSIGN(
      r, ParseRecipeYaml("s_stage:\n  m_modifiers:\n    SmoothQuantModifier: "
                         "{}\n"));
  EXPECT_DOUBLE_EQ(r.modifiers(0).smoothquant().smoothing_strength(), 0.5);
  EXPECT_EQ(r.modifiers(0).smoothquant().mappings_size(), 0);

  auto sq = [](const std::string& fields) {
    return ErrorOf("s_stage:\n  m_modifiers:\n    SmoothQuantModifier: {" +
                   fields + "}\n");
  };
  EXPECT_THAT(sq("algorithm: log_equalization"),
              HasSubstr("algorithm log_equalization not supported yet"));
  EXPECT_THAT(sq("smoothing_strength: 1.5"),
              HasSubstr("smoothing_strength: must be in [0, 1], got 1.5"));
  EXPECT_THAT(sq("num_calibration_steps: 4"),
              HasSubstr("num_calibration_steps: unsupported value"));
  EXPECT_THAT(sq("mappings: [[[], re:.*ln]]"),
              HasSubstr("mappings[0][0]: names no balance layers"));
  EXPECT_THAT(sq("mappings: [re:.*ln]"),
              HasSubstr("mappings[0]: must be [[balance layers...], smooth "
                        "layer]"));
  EXPECT_THAT(sq("targets: [Linear]"),
              HasSubstr("SmoothQuantModifier.targets: unsupported field"));
}

TEST(RecipeYamlTest, AwqModifierAsLlmCompressorWritesIt) {
  // Recipe.from_modifiers([AWQModifier(), QuantizationModifier(
  // scheme="W4A16_ASYM", targets=["Linear"], ignore=["lm_head"])]).yaml()
  // of llm-compressor 0.14, offload_device's sentinel included.
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      ParseRecipeYaml(
          "default_stage:\n"
          "  default_modifiers:\n"
          "    AWQModifier:\n"
          "      requires_calibration_data: true\n"
          "      offload_device: !!python/object/apply:llmcompressor.sentinel."
          "Sentinel [not_provided,\n"
          "        /x/llmcompressor/sentinel.py]\n"
          "      duo_scaling: true\n"
          "      n_grid: 20\n"
          "    QuantizationModifier:\n"
          "      targets: [Linear]\n"
          "      ignore: [lm_head]\n"
          "      scheme: W4A16_ASYM\n"
          "      bypass_divisibility_checks: false\n"
          "      requires_calibration_data: false\n"));
  ASSERT_EQ(r.modifiers_size(), 2);
  EXPECT_EQ(r.modifiers(0).awq().duo_scaling(), recipe::AwqModifier::ON);
  EXPECT_EQ(r.modifiers(0).awq().n_grid(), 20);
  EXPECT_EQ(WeightsOf(r.modifiers(1).rtn().scheme()), "int4 asym group128");
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe mapped,
      ParseRecipeYaml(
          "s_stage:\n  m_modifiers:\n    AWQModifier:\n      duo_scaling: "
          "both\n"
          "      mappings:\n"
          "      - smooth_layer: re:.*input_layernorm$\n"
          "        balance_layers: ['re:.*q_proj$', 're:.*k_proj$']\n"
          "        activation_hook_target: null\n"
          "    GPTQModifier: {scheme: W4A16, targets: [Linear]}\n"));
  const recipe::AwqModifier& a = mapped.modifiers(0).awq();
  EXPECT_EQ(a.duo_scaling(), recipe::AwqModifier::BOTH);
  ASSERT_EQ(a.mappings_size(), 1);
  EXPECT_EQ(a.mappings(0).smooth_layer(), "re:.*input_layernorm$");
  EXPECT_EQ(a.mappings(0).balance_layers_size(), 2);
}

TEST(RecipeYamlTest, UnsupportedFieldsAndModifiersAreNamed) {
  EXPECT_EQ(
      ErrorOf(Gptq("      scheme: W4A16\n      offload_hessians: true\n")),
      "recipe.yaml:5:7: quant_stage.quant_modifiers.GPTQModifier."
      "offload_hessians: unsupported field");
  EXPECT_THAT(
      ErrorOf("quant_stage:\n  quant_modifiers:\n    AWQModifier: {}\n"),
      HasSubstr("is not followed by a gptq or rtn modifier"));
  EXPECT_EQ(ErrorOf("quant_stage:\n  quant_modifiers:\n    AWQModifier:\n"
                    "      duo_scaling: maybe\n"),
            "recipe.yaml:4:20: quant_stage.quant_modifiers.AWQModifier."
            "duo_scaling: must be true, false or \"both\"");
  EXPECT_EQ(ErrorOf("s_stage:\n  m_modifiers:\n    WandaPruningModifier: {}\n"),
            "recipe.yaml:3:5: s_stage.m_modifiers.WandaPruningModifier: "
            "unsupported modifier (tracecut runs AWQModifier, GPTQModifier, "
            "QuantizationModifier and SmoothQuantModifier)");
  // Static input activations are calibrated (FP8, NVFP4); output
  // activations are refused.
  EXPECT_EQ(ErrorOf(Gptq("      scheme: FP8\n")), "OK");
  EXPECT_EQ(ErrorOf(Gptq("      scheme: NVFP4\n")), "OK");
  EXPECT_THAT(
      ErrorOf(Gptq("      config_groups:\n        g:\n          targets: "
                   "[Linear]\n          weights: {num_bits: 8}\n"
                   "          output_activations: {num_bits: 8, dynamic: "
                   "true, strategy: token}\n")),
      HasSubstr("output_activations (int8 sym token dynamic) are not "
                "supported yet"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A17\n")),
              HasSubstr("scheme W4A17 is not a compressed-tensors preset"));
  // INT8 static: int8 weights, static per-tensor int8 inputs.
  EXPECT_EQ(ErrorOf(Gptq("      config_groups:\n        g:\n          "
                         "targets: [Linear]\n          weights: {num_bits: "
                         "8}\n          input_activations: {num_bits: 8}\n")),
            "OK");
  EXPECT_THAT(
      ErrorOf(Gptq("      config_groups:\n        g:\n          targets: "
                   "[Linear]\n          weights: {num_bits: 8}\n"
                   "          input_activations: {num_bits: 8, strategy: "
                   "group, group_size: 32}\n")),
      HasSubstr("recipe.yaml:6:11: quant_stage.quant_modifiers.GPTQModifier."
                "config_groups.g: input_activations: int8 sym group32 is not "
                "calibrated"));
  EXPECT_THAT(ErrorOf(Gptq("      config_groups:\n        g:\n          "
                           "targets: [Linear]\n          weights: "
                           "{num_bits: 6, type: float}\n")),
              HasSubstr("config_groups.g: weights.num_bits: "));
  EXPECT_THAT(ErrorOf(Gptq("      config_groups:\n        g:\n          "
                           "targets: [Linear]\n          weights: "
                           "{num_bits: 8, strategy: block}\n")),
              HasSubstr("strategy block not supported yet"));
  // KV-cache schemes: static and per tensor; on a preset scheme.
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      kv_cache_scheme: "
                           "{num_bits: 8, type: float, dynamic: true}\n")),
              HasSubstr("GPTQModifier.kv_cache_scheme: must be static"));
  EXPECT_THAT(
      ErrorOf(Gptq("      scheme: FP8_DYNAMIC\n      kv_cache_scheme: "
                   "{num_bits: 8, type: float, strategy: channel}\n")),
      HasSubstr("float8 sym channel is not calibrated (a KV cache is static, "
                "per tensor or per head, attn_head)"));
  EXPECT_EQ(ErrorOf(Gptq("      scheme: FP8_DYNAMIC\n      kv_cache_scheme: "
                         "{num_bits: 8, type: float, strategy: attn_head}\n")),
            "OK");
  // Integer weights with an FP8 KV cache (a common recipe).
  EXPECT_EQ(ErrorOf(Gptq("      scheme: W4A16\n      kv_cache_scheme: "
                         "{num_bits: 8, type: float}\n")),
            "OK");
  EXPECT_THAT(
      ErrorOf(Gptq("      scheme: W4A16\n      weight_observer: mse\n")),
      HasSubstr("observer mse not supported yet"));
  EXPECT_THAT(
      ErrorOf(Gptq("      scheme: W4A16\n      bypass_divisibility_checks: "
                   "true\n")),
      HasSubstr("bypass_divisibility_checks: true is not supported"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      start: 0\n")),
              HasSubstr("start: training schedules are not supported"));
  EXPECT_THAT(ErrorOf("quant_stage:\n  quant_modifiers:\n"
                      "    QuantizationModifier: {scheme: W4A16, "
                      "block_size: 64}\n"),
              HasSubstr("QuantizationModifier.block_size: unsupported field"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n") + "args:\n  dataset: x\n"),
              HasSubstr("args.dataset: unsupported argument"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n") +
                      "args:\n  pipeline: independent\n"),
              HasSubstr("pipeline independent not supported"));
}

TEST(RecipeYamlTest, MalformedRecipesAreRefusedClearly) {
  EXPECT_EQ(ErrorOf(""), "recipe.yaml: recipe: is empty");
  EXPECT_THAT(ErrorOf("quant_stage: [\n"),
              HasSubstr("recipe.yaml:2:1: not YAML"));
  EXPECT_EQ(ErrorOf("version: 1\n"),
            "recipe.yaml:1:1: version: unsupported key (stages end in _stage; "
            "args)");
  EXPECT_EQ(ErrorOf("quant_stage:\n  run_type: oneshot\n"),
            "recipe.yaml:2:3: quant_stage.run_type: unsupported key (modifier "
            "groups end in _modifiers)");
  EXPECT_EQ(ErrorOf("quant_stage:\n  quant_modifiers: {}\n"),
            "recipe.yaml:1:1: recipe: has no modifiers");
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      scheme: W8A16\n")),
              HasSubstr("recipe.yaml:5:7: quant_stage.quant_modifiers."
                        "GPTQModifier.scheme: appears twice"));
  EXPECT_THAT(ErrorOf(Gptq("      targets: Linear\n")),
              HasSubstr("has no scheme or config_groups"));
  EXPECT_THAT(
      ErrorOf(Gptq("      scheme: W4A16\n      config_groups: {g: {targets: "
                   "[Linear], weights: {num_bits: 4}}}\n")),
      HasSubstr("give either scheme or config_groups, not both"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      block_size: 0\n")),
              HasSubstr("block_size: must be > 0, got 0"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      block_size: many\n")),
              HasSubstr("block_size: must be an integer"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      dampening_frac: -1\n")),
              HasSubstr("dampening_frac: must be >= 0"));
  EXPECT_THAT(ErrorOf(Gptq("      config_groups: {g: {targets: [Linear], "
                           "weights: {num_bits: 9}}}\n")),
              HasSubstr("num_bits: must be in [2, 8], got 9"));
  EXPECT_THAT(ErrorOf(Gptq("      config_groups: {g: {targets: [Linear], "
                           "weights: {num_bits: 4, strategy: group}}}\n")),
              HasSubstr("strategy group needs a group_size > 0"));
  EXPECT_THAT(ErrorOf(Gptq("      config_groups: {g: {weights: "
                           "{num_bits: 4}}}\n")),
              HasSubstr("config_groups.g: names no targets"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      targets: []\n")),
              HasSubstr("targets: is empty"));
  EXPECT_THAT(ErrorOf("quant_stage:\n  quant_modifiers:\n    GPTQModifier:\n"),
              HasSubstr("GPTQModifier: must be a mapping"));
  EXPECT_THAT(ErrorOf(Gptq("      scheme: W4A16\n      sequential_targets: "
                           "[A]\n") +
                      "args:\n  sequential_targets: [B]\n"),
              HasSubstr("differs from the sequential_targets given before"));
}

TEST(RecipeYamlTest, WrittenRecipesReadBackEqual) {
  const char* recipes[] = {
      // A preset, GPTQ with act order.
      R"pb(modifiers {
             gptq {
               scheme { preset: "W4A16" }
               targets: "Linear"
               ignore: "lm_head"
               actorder: true
             }
           })pb",
      // SmoothQuant before GPTQ, with and without its own mappings.
      R"pb(modifiers { smoothquant { smoothing_strength: 0.8 } }
           modifiers {
             smoothquant {
               mappings {
                 balance_layers: "re:.*fc1"
                 balance_layers: "re:.*fc2"
                 smooth_layer: "re:.*ln"
               }
               ignore: "lm_head"
             }
           }
           modifiers {
             gptq {
               scheme {
                 json: '{"weights": {"num_bits": 8, "strategy": "group", '
                       '"group_size": 128}}'
               }
               targets: "Linear"
             }
           })pb",
      // AWQ before its quantizer, with its own mappings.
      R"pb(modifiers {
             awq {
               duo_scaling: BOTH
               n_grid: 10
               mappings {
                 smooth_layer: "re:.*input_layernorm$"
                 balance_layers: "re:.*q_proj$"
                 balance_layers: "re:.*k_proj$"
               }
             }
           }
           modifiers {
             rtn {
               scheme { preset: "W4A16_ASYM" }
               targets: "Linear"
               ignore: "lm_head"
             }
           })pb",
      // config_groups forms, repeated modifier types, pipeline settings.
      R"pb(modifiers {
             gptq {
               scheme {
                 json: '{"weights": {"num_bits": 3, "symmetric": false, '
                       '"strategy": "channel"}}'
               }
               targets: "re:.*mlp.*"
               dampening_frac: 0.05
               block_size: 64
             }
           }
           modifiers {
             gptq {
               scheme {
                 json: '{"weights": {"num_bits": 8, "strategy": "tensor"}}'
               }
               targets: "re:.*self_attn.*"
               actorder: true
             }
           }
           modifiers {
             rtn {
               scheme {
                 json: '{"weights": {"num_bits": 6, "strategy": "group", '
                       '"group_size": 32}}'
               }
               targets: "lm_head"
             }
           }
           modifiers {
             rtn {
               scheme { preset: "W4A16_ASYM" }
               targets: "Embedding"
               ignore: "a"
               ignore: "b"
             }
           }
           pipeline: BASIC
           propagate_error: false
           sequential_targets: "LlamaDecoderLayer"
           calibrate_all_experts: false
           expert_modules: "re:.*experts\\.[0-9]+")pb",
  };
  for (const char* text : recipes) {
    recipe::Recipe want = Textproto(text);
    ASSERT_OK(ValidateRecipe(want));
    ASSERT_OK_AND_ASSIGN(std::string yaml, RecipeToYaml(want));
    ASSERT_OK_AND_ASSIGN(recipe::Recipe got, ParseRecipeYaml(yaml));
    // What the proto leaves unset reads back as set to its default; a
    // json scheme reads back with every field compressed-tensors fills in.
    recipe::Recipe want_explicit = want;
    for (recipe::Modifier& m : *want_explicit.mutable_modifiers()) {
      recipe::QuantizationScheme* s = nullptr;
      if (m.has_gptq()) {
        recipe::GptqModifier* g = m.mutable_gptq();
        g->set_dampening_frac(g->dampening_frac());
        g->set_block_size(g->block_size());
        s = g->mutable_scheme();
      } else if (m.has_rtn()) {
        s = m.mutable_rtn()->mutable_scheme();
      }
      if (s != nullptr && s->has_json()) {
        ASSERT_OK_AND_ASSIGN(quantization::QuantizationScheme t,
                             ToTypedScheme(*s, {}));
        util::Json j = t.ToJson();
        j.erase("targets");
        s->set_json(util::DumpJson(j));
      }
    }
    google::protobuf::util::MessageDifferencer diff;
    diff.set_message_field_comparison(
        google::protobuf::util::MessageDifferencer::EQUIVALENT);
    std::string report;
    diff.ReportDifferencesToString(&report);
    EXPECT_TRUE(diff.Compare(want_explicit, got)) << report << "\n" << yaml;
  }
}

TEST(RecipeYamlTest, WrittenFormIsLlmCompressors) {
  ASSERT_OK_AND_ASSIGN(
      std::string yaml,
      RecipeToYaml(
          Textproto(R"pb(modifiers {
                           gptq {
                             scheme { bits: 4 symmetric: true group_size: 128 }
                             targets: "Linear"
                             ignore: "lm_head"
                             actorder: true
                             static_groups: true
                           }
                         }
                         modifiers {
                           gptq {
                             scheme { bits: 8 }
                             targets: "lm_head"
                           }
                         }
                         sequential_targets: "LlamaDecoderLayer")pb")));
  EXPECT_EQ(yaml,
            "default_stage:\n"
            "  default_modifiers:\n"
            "    GPTQModifier:\n"
            "      targets: [Linear]\n"
            "      ignore: [lm_head]\n"
            "      scheme: W4A16\n"
            "      block_size: 128\n"
            "      dampening_frac: 0.01\n"
            "      actorder: weight\n"
            "  default_1_modifiers:\n"
            "    GPTQModifier:\n"
            "      targets: [lm_head]\n"
            "      ignore: []\n"
            "      config_groups:\n"
            "        group_0:\n"
            "          targets: [lm_head]\n"
            "          weights:\n"
            "            num_bits: 8\n"
            "            type: int\n"
            "            symmetric: true\n"
            "            strategy: channel\n"
            "      block_size: 128\n"
            "      dampening_frac: 0.01\n"
            "      actorder: null\n"
            "args:\n"
            "  pipeline: sequential\n"
            "  sequential_targets: [LlamaDecoderLayer]\n"
            "  propagate_error: true\n");
  // tracecut's integer fields are written as the compressed-tensors scheme
  // of the same shape, which is what reading the recipe back runs.
  ASSERT_OK_AND_ASSIGN(recipe::Recipe back, ParseRecipeYaml(yaml));
  EXPECT_EQ(back.modifiers(0).gptq().scheme().preset(), "W4A16");
  EXPECT_EQ(ActOrderOf(back.modifiers(0).gptq()), "weight");
  EXPECT_EQ(WeightsOf(back.modifiers(1).gptq().scheme()), "int8 sym channel");
  EXPECT_EQ(ActOrderOf(back.modifiers(1).gptq()), "none");
}

TEST(RecipeYamlTest, RecipesWithoutAnLlmCompressorFormAreRefused) {
  EXPECT_THAT(RecipeToYaml(Textproto(R"pb(modifiers {
                                            observer { targets: "Linear" }
                                          })pb")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("modifiers[0] (an observer) has no "
                                 "llm-compressor recipe form")));
  EXPECT_THAT(RecipeToYaml(Textproto(R"pb(modifiers {
                                            gptq {
                                              scheme { bits: 4 group_size: 64 }
                                              targets: "Linear"
                                              actorder: true
                                            }
                                          })pb")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("act order with dynamic groups")));
}

}  // namespace
}  // namespace tracecut::pipelines
