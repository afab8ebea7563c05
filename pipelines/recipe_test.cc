#include "pipelines/recipe.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "modifiers/gptq_modifier.h"
#include "modifiers/recipe_config.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {
using ::tracecut::modifiers::ToGptqOptions;
using ::tracecut::modifiers::ToQuantScheme;

using ::tracecut::quantization::GptqOptions;
using ::tracecut::quantization::QuantScheme;
namespace {

using ::testing::HasSubstr;

constexpr char kSource[] = "recipe.textproto";

// The error message of parsing `text`, or "OK".
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<recipe::Recipe> r = ParseRecipe(text, kSource);
  if (r.ok()) return "OK";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(RecipeTest, DocumentedExampleLoads) {
  // The example of docs/recipes.md, kept verbatim in testdata.
  absl::StatusOr<recipe::Recipe> r =
      LoadRecipe("pipelines/testdata/gptq_w4g128.textproto");
  ASSERT_OK(r);
  ASSERT_EQ(r->modifiers_size(), 1);
  ASSERT_TRUE(r->modifiers(0).has_gptq());
  const recipe::GptqModifier& g = r->modifiers(0).gptq();
  EXPECT_EQ(g.targets_size(), 1);
  EXPECT_EQ(g.targets(0), "Linear");
  EXPECT_EQ(g.ignore(0), "lm_head");
  EXPECT_EQ(r->pipeline(), recipe::Recipe::SEQUENTIAL);
  EXPECT_EQ(r->sequential_targets(0), "LlamaDecoderLayer");
  EXPECT_TRUE(r->propagate_error());
  EXPECT_EQ(r->cache().memory_budget_bytes(), int64_t{8} << 30);

  GptqOptions o = ToGptqOptions(g);
  EXPECT_EQ(o.scheme.bits, 4);
  EXPECT_EQ(o.scheme.group_size, 128);
  EXPECT_TRUE(o.scheme.symmetric);
  EXPECT_FALSE(o.scheme.per_tensor);
  EXPECT_DOUBLE_EQ(o.dampening_frac, 0.01);
  EXPECT_EQ(o.block_size, 128);
  EXPECT_FALSE(o.act_order);
  EXPECT_OK(o.scheme.Validate());
}

TEST(RecipeTest, DocumentedMixedExampleLoads) {
  absl::StatusOr<recipe::Recipe> r =
      LoadRecipe("pipelines/testdata/mixed_modifiers.textproto");
  ASSERT_OK(r);
  ASSERT_EQ(r->modifiers_size(), 3);
  EXPECT_TRUE(r->modifiers(0).gptq().actorder());
  EXPECT_EQ(r->modifiers(0).gptq().scheme().bits(), 4);
  EXPECT_DOUBLE_EQ(r->modifiers(1).observer().averaging_constant(), 0.1);
  EXPECT_EQ(r->modifiers(2).rtn().targets(0), "lm_head");
}

TEST(RecipeTest, AllModifierKindsAndDefaults) {
  absl::StatusOr<recipe::Recipe> r = ParseRecipe(R"pb(
    modifiers {
      gptq {
        scheme { bits: 4 group_size: 128 symmetric: true }
        targets: "Linear"
        ignore: "lm_head"
        actorder: true
      }
    }
    modifiers {
      observer {
        kind: MOVING_AVERAGE
        averaging_constant: 0.1
        targets: "Linear"
      }
    }
    modifiers { observer { kind: MINMAX targets: "Linear" } }
    modifiers {
      rtn {
        scheme { bits: 8 }
        targets: "Linear"
      }
    }
    pipeline: SEQUENTIAL
    sequential_targets: "LlamaDecoderLayer"
    propagate_error: true
  )pb");
  ASSERT_OK(r);
  ASSERT_EQ(r->modifiers_size(), 4);
  EXPECT_EQ(r->modifiers(1).observer().kind(),
            recipe::ObserverModifier::MOVING_AVERAGE);
  EXPECT_EQ(r->modifiers(2).observer().observe(),
            recipe::ObserverModifier::INPUT_ACTIVATIONS);
  // Defaults: dampening 0.01, blocks of 128, int8 symmetric per-channel.
  GptqOptions o = ToGptqOptions(r->modifiers(0).gptq());
  EXPECT_DOUBLE_EQ(o.dampening_frac, 0.01);
  EXPECT_EQ(o.block_size, 128);
  EXPECT_TRUE(o.act_order);
  QuantScheme rtn = ToQuantScheme(r->modifiers(3).rtn().scheme());
  EXPECT_EQ(rtn.bits, 8);
  EXPECT_TRUE(rtn.symmetric);
  EXPECT_EQ(rtn.group_size, -1);
  EXPECT_EQ(
      ParseRecipe("modifiers { rtn { scheme {} targets: 'x' } }")->pipeline(),
      recipe::Recipe::SEQUENTIAL);
}

TEST(RecipeTest, TyposPointAtLineAndColumn) {
  EXPECT_EQ(ErrorOf("modifiers {\n"
                    "  gptq {\n"
                    "    dampning_frac: 0.01\n"
                    "  }\n"
                    "}\n"),
            "recipe.textproto:3:5: Message type "
            "\"tracecut.recipe.GptqModifier\" has no field named "
            "\"dampning_frac\".");
  std::string e = ErrorOf(
      "modifiers { rtn { scheme { bits: 8 } targets: 'L' } }\n"
      "pipeline: SEQUENTAL\n");
  EXPECT_EQ(e.rfind("recipe.textproto:2:11: ", 0), 0u) << e;
  EXPECT_NE(e.find("SEQUENTAL"), std::string::npos) << e;
  e = ErrorOf("modifiers { rtn { scheme { bits: eight } } }");
  EXPECT_EQ(e.rfind("recipe.textproto:1:34: ", 0), 0u) << e;
}

TEST(RecipeTest, ValidationErrorsNameFieldAndPlace) {
  EXPECT_EQ(ErrorOf("modifiers { rtn { scheme { bits: 8 } targets: 'L' } }\n"
                    "modifiers {\n"
                    "  gptq {\n"
                    "    scheme { group_size: 128 bits: 9 }\n"
                    "    targets: 'Linear'\n"
                    "  }\n"
                    "}\n"),
            "recipe.textproto:4:30: modifiers[1].gptq.scheme.bits: must be "
            "in [2, 8], got 9");
  EXPECT_EQ(ErrorOf("modifiers { gptq { scheme { bits: 4 group_size: 0 } "
                    "targets: 'Linear' } }"),
            "recipe.textproto:1:37: modifiers[0].gptq.scheme.group_size: "
            "must be > 0 or -1 (per-channel), got 0");
  EXPECT_EQ(ErrorOf("modifiers { gptq { scheme { bits: 4 } } }"),
            "recipe.textproto:1:13: modifiers[0].gptq: targets is empty: name "
            "at least one module type or path");
  EXPECT_EQ(ErrorOf("modifiers { gptq { scheme { bits: 4 } targets: 'a' "
                    "targets: '' } }"),
            "recipe.textproto:1:52: modifiers[0].gptq.targets[1]: is empty");
  EXPECT_EQ(ErrorOf("modifiers { rtn { targets: 'Linear' } }"),
            "recipe.textproto:1:13: modifiers[0].rtn.scheme: is required");
  EXPECT_EQ(ErrorOf("modifiers { gptq { scheme { bits: 4 } targets: 'L' "
                    "block_size: 0 } }"),
            "recipe.textproto:1:52: modifiers[0].gptq.block_size: must be > "
            "0, got 0");
  EXPECT_EQ(ErrorOf("modifiers { gptq { scheme { bits: 4 } targets: 'L' "
                    "dampening_frac: -0.5 } }"),
            "recipe.textproto:1:52: modifiers[0].gptq.dampening_frac: must "
            "be finite and >= 0, got -0.5");
  EXPECT_EQ(ErrorOf("modifiers { rtn { scheme { per_tensor: true group_size: "
                    "64 } targets: 'L' } }"),
            "recipe.textproto:1:28: modifiers[0].rtn.scheme.per_tensor: needs "
            "group_size -1, got 64");
  EXPECT_EQ(ErrorOf(""), "recipe.textproto: recipe: has no modifiers");
  EXPECT_EQ(ErrorOf("pipeline: BASIC\nmodifiers {}"),
            "recipe.textproto:2:1: modifiers[0]: names no modifier (awq, gptq, "
            "observer, rtn or smoothquant)");
  EXPECT_EQ(ErrorOf("modifiers { smoothquant { smoothing_strength: 2 } }"),
            "recipe.textproto:1:27: modifiers[0].smoothquant."
            "smoothing_strength: must be in [0, 1], got 2");
  EXPECT_EQ(ErrorOf("modifiers { smoothquant { mappings { balance_layers: "
                    "'q' } } }"),
            "recipe.textproto:1:27: modifiers[0].smoothquant.mappings[0]."
            "smooth_layer: is required");
  EXPECT_EQ(ErrorOf("modifiers { observer { kind: MOVING_AVERAGE "
                    "averaging_constant: 0 targets: 'L' } }"),
            "recipe.textproto:1:45: modifiers[0].observer.averaging_constant: "
            "must be in (0, 1], got 0");
  EXPECT_EQ(ErrorOf("modifiers { observer { kind: MINMAX averaging_constant: "
                    "0.5 targets: 'L' } }"),
            "recipe.textproto:1:37: modifiers[0].observer.averaging_constant: "
            "applies to MOVING_AVERAGE only");
  EXPECT_EQ(ErrorOf("modifiers { rtn { scheme {} targets: 'L' } }\n"
                    "cache { offload_device: 'gpu' }"),
            "recipe.textproto:2:9: cache.offload_device: is not a device "
            "(\"cpu\", \"cuda:0\", ...): \"gpu\"");
  EXPECT_EQ(ErrorOf("modifiers { rtn { scheme {} targets: 'L' } }\n"
                    "pipeline: PIPELINE_UNSPECIFIED"),
            "recipe.textproto:2:1: pipeline: must be SEQUENTIAL, "
            "LAYER_SEQUENTIAL or BASIC");
}

TEST(RecipeTest, CompressedTensorsSchemesByPresetOrJson) {
  ASSERT_OK_AND_ASSIGN(
      recipe::Recipe r,
      ParseRecipe("modifiers { rtn { scheme { preset: 'NVFP4A16' } "
                  "targets: 'Linear' ignore: 'lm_head' } }",
                  "recipe.textproto"));
  EXPECT_EQ(r.modifiers(0).rtn().scheme().preset(), "NVFP4A16");
  EXPECT_OK(ParseRecipe(
      "modifiers { rtn { scheme { json: '{\"weights\": {\"num_bits\": 8, "
      "\"type\": \"float\", \"strategy\": \"channel\"}}' } "
      "targets: 'Linear' } }"));
  EXPECT_OK(ParseRecipe(
      "modifiers { gptq { scheme { preset: 'FP8_BLOCK' } targets: 'Linear' } "
      "}"));
  EXPECT_THAT(ErrorOf("modifiers { rtn { scheme { preset: 'W4A17' } "
                      "targets: 'Linear' } }"),
              HasSubstr("recipe.textproto:1:28: "
                        "modifiers[0].rtn.scheme.preset: "));
  EXPECT_THAT(ErrorOf("modifiers { rtn { scheme { preset: 'W4A17' } "
                      "targets: 'Linear' } }"),
              HasSubstr("W4A17"));
  EXPECT_EQ(ErrorOf("modifiers { rtn { scheme { preset: 'W4A16' bits: 4 } "
                    "targets: 'Linear' } }"),
            "recipe.textproto:1:44: modifiers[0].rtn.scheme.bits: cannot be "
            "combined with a compressed-tensors preset or json scheme");
  // NVFP4 with group 128, asymmetric FP8: one line naming the field.
  EXPECT_THAT(ErrorOf("modifiers { rtn { scheme { json: '{\"weights\": "
                      "{\"num_bits\": 4, \"type\": \"float\", "
                      "\"strategy\": \"tensor_group\", \"group_size\": "
                      "128}}' } targets: 'Linear' } }"),
              HasSubstr("modifiers[0].rtn.scheme.json: "
                        "json.weights.group_size"));
  EXPECT_THAT(ErrorOf("modifiers { rtn { scheme { json: '{\"weights\": "
                      "{\"num_bits\": 8, \"type\": \"float\", "
                      "\"symmetric\": false}}' } targets: 'Linear' } }"),
              HasSubstr("modifiers[0].rtn.scheme.json: json.weights."));
  // Static input activations are calibrated per tensor (FP8) or as NVFP4's
  // global scale; other static ones, and output activations, are refused
  // up front.
  EXPECT_EQ(ErrorOf("modifiers { rtn { scheme { preset: 'FP8' } "
                    "targets: 'Linear' } }"),
            "OK");
  EXPECT_EQ(ErrorOf("modifiers { gptq { scheme { preset: 'NVFP4' } "
                    "targets: 'Linear' } }"),
            "OK");
  EXPECT_THAT(
      ErrorOf("modifiers { rtn { scheme { json: '{\"weights\": "
              "{\"num_bits\": 8}, \"input_activations\": {\"num_bits\": "
              "8, \"strategy\": \"group\", \"group_size\": 32}}' } "
              "targets: 'Linear' } }"),
      HasSubstr("modifiers[0].rtn.scheme.json: input_activations: int8 sym "
                "group32 is not calibrated"));
  EXPECT_THAT(ErrorOf("modifiers { rtn { scheme { json: '{\"weights\": "
                      "{\"num_bits\": 8}, \"output_activations\": "
                      "{\"num_bits\": 8, \"dynamic\": true, "
                      "\"strategy\": \"token\"}}' } targets: 'Linear' } }"),
              HasSubstr("output_activations (int8 sym token dynamic) are not "
                        "supported yet"));
  EXPECT_EQ(ErrorOf("modifiers { rtn { scheme { preset: 'FP8_DYNAMIC' } "
                    "targets: 'Linear' kv_cache_scheme: '{\"num_bits\": 8, "
                    "\"type\": \"float\"}' } }"),
            "OK");
  EXPECT_THAT(ErrorOf("modifiers { rtn { scheme { bits: 4 } targets: 'Linear' "
                      "kv_cache_scheme: '{\"num_bits\": 8, \"type\": "
                      "\"float\"}' } }"),
              HasSubstr("modifiers[0].rtn.kv_cache_scheme: needs a "
                        "compressed-tensors scheme"));
  EXPECT_THAT(ErrorOf("modifiers { gptq { scheme { preset: 'W4A16' } "
                      "targets: 'Linear' kv_cache_scheme: '{\"num_bits\": "
                      "8, \"type\": \"float\", \"dynamic\": true}' } }"),
              HasSubstr("modifiers[0].gptq.kv_cache_scheme: must be static"));
  EXPECT_THAT(ErrorOf("modifiers { gptq { scheme { preset: 'W4A16' } "
                      "static_groups: true targets: 'Linear' } }"),
              HasSubstr("modifiers[0].gptq.static_groups: compressed-tensors "
                        "schemes always use static groups"));
  EXPECT_THAT(ErrorOf("modifiers { observer { kind: MINMAX scheme { preset: "
                      "'W8A16' } targets: 'Linear' } }"),
              HasSubstr("the observer modifier takes tracecut's integer"));
}

TEST(RecipeTest, ValidateWithoutLocations) {
  recipe::Recipe r;
  recipe::GptqModifier* g = r.add_modifiers()->mutable_gptq();
  g->add_targets("Linear");
  g->mutable_scheme()->set_bits(1);
  absl::Status s = ValidateRecipe(r, "built in code");
  EXPECT_EQ(s, absl::InvalidArgumentError(
                   "built in code: modifiers[0].gptq.scheme.bits: must be in "
                   "[2, 8], got 1"));
  g->mutable_scheme()->set_bits(3);
  EXPECT_OK(ValidateRecipe(r));
}

TEST(RecipeTest, MissingFileIsNotFound) {
  absl::StatusOr<recipe::Recipe> r =
      LoadRecipe("pipelines/testdata/nope.textproto");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("nope.textproto"), std::string::npos);
}

}  // namespace
}  // namespace tracecut::pipelines
