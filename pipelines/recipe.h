#ifndef TRACECUT_PIPELINES_RECIPE_H_
#define TRACECUT_PIPELINES_RECIPE_H_

// Loading and validating calibration recipes (pipelines/recipe.proto,
// protobuf text format; the format is documented in docs/recipes.md).
//
//   ASSIGN_OR_RETURN(recipe::Recipe r, LoadRecipe("recipe.textproto"));
//
// Each modifier entry is checked by the modifier registered for its message
// (modifiers/registry.h).
//
// Every error names the source and, for parse errors and for validation
// errors on fields present in the text, the 1-based line and column:
//
//   recipe.textproto:3:27: modifiers[0].gptq.scheme.bits: must be in [2, 8],
//   got 9

#include <google/protobuf/descriptor.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "modifiers/registry.h"
#include "pipelines/recipe.pb.h"

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

// The field of `m`'s oneof that is set (its entry), or null.
const google::protobuf::FieldDescriptor* EntryField(const recipe::Modifier& m);

// The entry field names, for "names no modifier (awq, gptq, ...)".
std::string EntryNames();

// The recipe's entries and settings as the registry's validate and build
// functions see them (index 0, no collective, not whole groups).
modifiers::RecipeContext ContextOf(const recipe::Recipe& r);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_RECIPE_H_
