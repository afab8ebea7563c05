// The round-to-nearest modifier's recipe entry (rtn_modifier.proto): its
// checks, the modifier it builds, and its registration.

#include <google/protobuf/message.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "modifiers/recipe_config.h"
#include "modifiers/registry.h"
#include "modifiers/rtn_modifier.pb.h"
#include "modifiers/weight_quant_modifier.h"
#include "modifiers/weight_quant_recipe.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

using ::google::protobuf::Message;

absl::Status CheckRtn(const Message& entry, const RecipeChecker& c,
                      const RecipeContext&) {
  const auto& m = static_cast<const recipe::RtnModifier&>(entry);
  RETURN_IF_ERROR(
      CheckScheme(c, m.has_scheme(), m.scheme(), /*required=*/true));
  RETURN_IF_ERROR(CheckKvCache(c, m));
  return CheckTargets(c, m);
}

absl::StatusOr<std::unique_ptr<Modifier>> BuildRtn(
    const Message& entry, const RecipeContext& context) {
  const auto& r = static_cast<const recipe::RtnModifier&>(entry);
  ASSIGN_OR_RETURN(WeightQuantOptions o, WeightQuantOptionsOf(r, context));
  return std::make_unique<RtnModifier>(std::move(o));
}

absl::StatusOr<quantization::QuantizationArgs> RtnWeightScheme(
    const Message& entry, absl::string_view where, ModuleSelector& modules) {
  const auto& r = static_cast<const recipe::RtnModifier&>(entry);
  modules = Selector(r.targets(), r.ignore());
  return WeightArgs(r.scheme(), modules.targets, where);
}

ModifierType RtnType() {
  ModifierType t;
  t.validate = CheckRtn;
  t.build = BuildRtn;
  t.weight_scheme = RtnWeightScheme;
  return t;
}

}  // namespace

TRACECUT_REGISTER_MODIFIER(rtn, recipe::RtnModifier, RtnType());

}  // namespace tracecut::modifiers
