#ifndef TRACECUT_PIPELINES_RECIPE_YAML_H_
#define TRACECUT_PIPELINES_RECIPE_YAML_H_

// llm-compressor's recipe.yaml, read into and written from the recipe proto
// (pipelines/recipe.proto): the file `oneshot` saves next to every
// checkpoint, so a user's existing recipe runs here unchanged, and every
// compressed-tensors output of tracecut carries one llm-compressor reads.
//
//   ASSIGN_OR_RETURN(recipe::Recipe r, LoadRecipeFile("recipe.yaml"));
//   ASSIGN_OR_RETURN(std::string yaml, RecipeToYaml(r));
//
// The grammar is llm-compressor 0.14's (llmcompressor/recipe/recipe.py):
//
//   quant_stage:                  # stages: keys ending in _stage, in order
//     quant_modifiers:            # groups: keys ending in _modifiers
//       GPTQModifier:             # modifiers, in order, with their fields
//         targets: [Linear]
//         ignore: [lm_head]
//         scheme: W4A16           # a preset, {PRESET: targets}, or
//                                 # config_groups
//
// GPTQModifier maps to `gptq`, QuantizationModifier to `rtn` (weight-only:
// its weight observer is min-max, i.e. round-to-nearest). Integer
// weight-only schemes are supported: presets W2A16..W8A16 and W4A16_ASYM
// (compressed-tensors' definitions: group 128), or config_groups with int
// weights of strategy tensor, channel or group. A top-level `args` mapping
// may carry the oneshot arguments that shape the pipeline (pipeline,
// sequential_targets, propagate_error, moe_calibrate_all_experts); the
// legacy per-modifier `sequential_targets` is read too.
//
// Anything else — an unknown key, a modifier or scheme tracecut does not
// run (AWQModifier, FP8, activation quantization, ...), a field value that
// changes what llm-compressor computes in a way tracecut does not — is an
// error naming the file, line, column and key path:
//
//   recipe.yaml:4:7: quant_stage.quant_modifiers.GPTQModifier.offload_hessians:
//   unsupported field
//
// Fields that only describe or schedule the run (requires_calibration_data,
// index, group, batched_quantization, start/end of -1) are accepted.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipelines/recipe.pb.h"

namespace tracecut::pipelines {

// Parses llm-compressor YAML into a validated recipe. `source` names it in
// errors.
absl::StatusOr<recipe::Recipe> ParseRecipeYaml(
    absl::string_view text, absl::string_view source = "<recipe.yaml>");

// A recipe file: llm-compressor YAML when `path` ends in .yaml or .yml,
// else protobuf text format (LoadRecipe).
absl::StatusOr<recipe::Recipe> LoadRecipeFile(const std::string& path);

bool IsYamlRecipePath(absl::string_view path);

// The recipe in llm-compressor's format, one stage (default_stage) with its
// modifiers in order and the pipeline settings under `args`; ParseRecipeYaml
// reads it back to an equal recipe, llm-compressor's Recipe parses it.
// InvalidArgument for a recipe llm-compressor cannot express (observer
// modifiers, act order with dynamic groups).
absl::StatusOr<std::string> RecipeToYaml(const recipe::Recipe& recipe);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_RECIPE_YAML_H_
