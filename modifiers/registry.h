#ifndef TRACECUT_MODIFIERS_REGISTRY_H_
#define TRACECUT_MODIFIERS_REGISTRY_H_

// Modifiers by their recipe entry. A modifier registers, in its own .cc, the
// message of its recipe entry (a modifiers/*.proto message, or one of
// another workspace's), how that entry is validated beyond its schema and
// how the modifier is built from it:
//
//   ModifierType RtnType() {
//     ModifierType t;
//     t.validate = CheckRtn;  // (entry, checker, context)
//     t.build = BuildRtn;     // (entry, context)
//     return t;
//   }
//   TRACECUT_REGISTER_MODIFIER(rtn, recipe::RtnModifier, RtnType());
//
// pipelines/recipe.cc validates each recipe entry and pipelines/calibrate.cc
// builds its modifier by looking the entry's message type up here; the
// recipe's `Modifier` (pipelines/recipe.proto) has one field per entry
// message. The library that registers must be linked whole (alwayslink).

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "modifiers/modifier.h"
#include "modifiers/recipe_config.h"
#include "runtime/collective.h"

namespace tracecut::modifiers {

// What validating or building one entry may look at besides the entry.
struct RecipeContext {
  // Every modifier entry of the recipe, in order, as its own message; this
  // one is entries[index]. (AWQ searches with the scheme of the quantizer
  // after it.)
  std::vector<const google::protobuf::Message*> entries;
  int index = 0;
  // Data-parallel calibration: the ranks' collective (null: one process).
  runtime::Collective* collective = nullptr;
  // The recipe's calibrate_all_experts.
  bool all_expert_tokens = false;
  // The output stores whole groups (compressed-tensors): quantizers keep a
  // group's columns together.
  bool whole_groups = false;
};

struct ModifierType {
  // Checks the entry beyond what its schema says; errors through `check`,
  // which names the field and its line. Null: nothing to check.
  std::function<absl::Status(const google::protobuf::Message& entry,
                             const RecipeChecker& check,
                             const RecipeContext& context)>
      validate;
  // The modifier a validated entry describes.
  std::function<absl::StatusOr<std::unique_ptr<Modifier>>(
      const google::protobuf::Message& entry, const RecipeContext& context)>
      build;
  // For a weight quantizer: the grid of its weights and the modules it
  // quantizes (AWQ searches its scales on that grid); `where` names the
  // entry in errors. Null for other modifiers.
  std::function<absl::StatusOr<quantization::QuantizationArgs>(
      const google::protobuf::Message& entry, absl::string_view where,
      ModuleSelector& modules)>
      weight_scheme;
};

// Registers `type` for recipe entries of message `config` (its full name,
// "tracecut.recipe.GptqModifier"). Returns true; a second registration of
// one message is a programming error and aborts at start-up.
bool RegisterModifierType(const google::protobuf::Descriptor* config,
                          ModifierType type);

// The type registered for entries of message `config`, or null.
const ModifierType* FindModifierType(
    const google::protobuf::Descriptor* config);

// Full names of the registered messages, sorted.
std::vector<std::string> RegisteredModifierMessages();

}  // namespace tracecut::modifiers

// Registers TYPE (a ModifierType) for entries of MESSAGE at static
// initialization, in a .cc file; NAME makes the variable's name unique.
#define TRACECUT_REGISTER_MODIFIER(NAME, MESSAGE, TYPE)                    \
  [[maybe_unused]] static const bool tracecut_registered_modifier_##NAME = \
      ::tracecut::modifiers::RegisterModifierType(MESSAGE::descriptor(), TYPE)

#endif  // TRACECUT_MODIFIERS_REGISTRY_H_
