#ifndef TRACECUT_PIPELINES_RECIPE_H_
#define TRACECUT_PIPELINES_RECIPE_H_

// Loading and validating calibration recipes (pipelines/recipe.proto,
// protobuf text format; the format is documented in docs/recipes.md).
//
//   ASSIGN_OR_RETURN(recipe::Recipe r, LoadRecipe("recipe.textproto"));
//   for (const recipe::Modifier& m : r.modifiers()) {
//     if (m.has_gptq()) { GptqOptions o = ToGptqOptions(m.gptq()); ... }
//   }
//
// Every error names the source and, for parse errors and for validation
// errors on fields present in the text, the 1-based line and column:
//
//   recipe.textproto:3:27: modifiers[0].gptq.scheme.bits: must be in [2, 8],
//   got 9

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipelines/gptq.h"
#include "pipelines/quantize.h"
#include "pipelines/recipe.pb.h"
#include "quantization/quant_args.h"

namespace tracecut::pipelines {

// Parses and validates a recipe in text format. `source` names it in errors.
absl::StatusOr<recipe::Recipe> ParseRecipe(
    absl::string_view text, absl::string_view source = "<recipe>");

// Reads, parses and validates the recipe file at `path`.
absl::StatusOr<recipe::Recipe> LoadRecipe(const std::string& path);

// Checks what the schema cannot: value ranges, required fields, non-empty
// target lists. Without parse locations, errors name only the field path.
absl::Status ValidateRecipe(const recipe::Recipe& recipe,
                            absl::string_view source = "<recipe>");

// Conversions for validated recipes.
QuantScheme ToQuantScheme(const recipe::QuantizationScheme& scheme);
GptqOptions ToGptqOptions(const recipe::GptqModifier& gptq);

// Whether `scheme` names a compressed-tensors scheme (preset or json)
// rather than tracecut's integer fields.
bool IsTypedScheme(const recipe::QuantizationScheme& scheme);
// That scheme with the modifier's `targets`, resolved; InvalidArgument
// naming the bad field (an unknown preset, a json field compressed-tensors
// or tracecut refuses).
absl::StatusOr<quantization::QuantizationScheme> ToTypedScheme(
    const recipe::QuantizationScheme& scheme, std::vector<std::string> targets);
// The activation order a GPTQ modifier runs a compressed-tensors scheme
// with, as GPTQModifier.resolve_actorder: the modifier's actorder when set
// (true is "weight", false none), else the scheme's own, else "static".
quantization::ActOrder ResolveActOrder(const recipe::GptqModifier& gptq,
                                       quantization::ActOrder from_scheme);
// An error for a resolved compressed-tensors scheme tracecut cannot run:
// output activations (Unimplemented), static input activations no observer
// calibrates (InvalidArgument; per tensor and NVFP4's "local" global scale
// are calibrated). Dynamic activations (W8A8, FP8_DYNAMIC, FP8_BLOCK,
// MXFP4) are recorded, not calibrated.
absl::Status CheckTypedSchemeRuns(const quantization::QuantizationScheme& s);
// A modifier's kv_cache_scheme (QuantizationArgs JSON), resolved; an error
// for one tracecut cannot calibrate (dynamic; neither per tensor nor per
// head).
absl::StatusOr<quantization::QuantizationArgs> ToKvCacheArgs(
    absl::string_view json);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_RECIPE_H_
