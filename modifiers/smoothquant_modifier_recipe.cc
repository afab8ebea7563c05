// SmoothQuant's recipe entry (smoothquant_modifier.proto): its checks, the
// modifier it builds, and its registration.

#include <google/protobuf/message.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "modifiers/recipe_config.h"
#include "modifiers/registry.h"
#include "modifiers/smoothquant_modifier.h"
#include "modifiers/smoothquant_modifier.pb.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

using ::google::protobuf::Message;

absl::Status CheckSmoothQuant(const Message& entry, const RecipeChecker& c,
                              const RecipeContext&) {
  const auto& m = static_cast<const recipe::SmoothQuantModifier&>(entry);
  const double a = m.smoothing_strength();
  if (!(a >= 0 && a <= 1)) {
    return c.Error("smoothing_strength",
                   absl::StrCat("must be in [0, 1], got ", a));
  }
  RETURN_IF_ERROR(CheckMappings(c, m.mappings()));
  return CheckIgnore(c, m);
}

absl::StatusOr<std::unique_ptr<Modifier>> BuildSmoothQuant(
    const Message& entry, const RecipeContext& context) {
  const auto& q = static_cast<const recipe::SmoothQuantModifier&>(entry);
  SmoothQuantOptions o;
  o.smoothing_strength = q.smoothing_strength();
  for (const recipe::SmoothQuantModifier::Mapping& mapping : q.mappings()) {
    o.mappings.push_back(
        {{mapping.balance_layers().begin(), mapping.balance_layers().end()},
         mapping.smooth_layer()});
  }
  o.ignore.assign(q.ignore().begin(), q.ignore().end());
  o.collective = context.collective;
  return std::make_unique<SmoothQuantModifier>(std::move(o));
}

ModifierType SmoothQuantType() {
  ModifierType t;
  t.validate = CheckSmoothQuant;
  t.build = BuildSmoothQuant;
  return t;
}

}  // namespace

TRACECUT_REGISTER_MODIFIER(smoothquant, recipe::SmoothQuantModifier,
                           SmoothQuantType());

}  // namespace tracecut::modifiers
