// The observer modifier's recipe entry (observer_modifier.proto): its
// checks, the modifier it builds, and its registration.

#include <google/protobuf/message.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "modifiers/observer_modifier.h"
#include "modifiers/observer_modifier.pb.h"
#include "modifiers/recipe_config.h"
#include "modifiers/registry.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

using ::google::protobuf::Message;

absl::Status CheckObserver(const Message& entry, const RecipeChecker& c,
                           const RecipeContext&) {
  const auto& m = static_cast<const recipe::ObserverModifier&>(entry);
  if (m.kind() == recipe::ObserverModifier::KIND_UNSPECIFIED) {
    return c.Error("kind", "must be MINMAX or MOVING_AVERAGE");
  }
  if (m.observe() == recipe::ObserverModifier::OBSERVE_UNSPECIFIED) {
    return c.Error("observe",
                   "must be WEIGHT, INPUT_ACTIVATIONS or OUTPUT_ACTIVATIONS");
  }
  RETURN_IF_ERROR(
      CheckScheme(c, m.has_scheme(), m.scheme(), /*required=*/false));
  if (m.has_scheme() && IsTypedScheme(m.scheme())) {
    return c.Nested("scheme", m.scheme())
        .Error(m.scheme().has_preset() ? "preset" : "json",
               "the observer modifier takes tracecut's integer scheme "
               "fields; compressed-tensors schemes go to the rtn or gptq "
               "modifier");
  }
  RETURN_IF_ERROR(CheckTargets(c, m));
  if (m.has_averaging_constant() &&
      m.kind() != recipe::ObserverModifier::MOVING_AVERAGE) {
    return c.Error("averaging_constant", "applies to MOVING_AVERAGE only");
  }
  const double a = m.averaging_constant();
  if (!(a > 0 && a <= 1)) {
    return c.Error("averaging_constant",
                   absl::StrCat("must be in (0, 1], got ", a));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Modifier>> BuildObserver(
    const Message& entry, const RecipeContext& context) {
  const auto& r = static_cast<const recipe::ObserverModifier&>(entry);
  ObserverOptions o;
  o.modules = Selector(r.targets(), r.ignore());
  o.scheme = ToQuantScheme(r.scheme());
  o.averaging_constant = r.averaging_constant();
  o.collective = context.collective;
  o.kind = r.kind() == recipe::ObserverModifier::MOVING_AVERAGE
               ? ObserverKind::kMovingAverageMinMax
               : ObserverKind::kMinMax;
  switch (r.observe()) {
    case recipe::ObserverModifier::WEIGHT:
      o.observe = ObservedTensor::kWeight;
      break;
    case recipe::ObserverModifier::OUTPUT_ACTIVATIONS:
      o.observe = ObservedTensor::kOutput;
      break;
    default:
      o.observe = ObservedTensor::kInput;
      break;
  }
  return std::make_unique<Observer>(std::move(o));
}

ModifierType ObserverType() {
  ModifierType t;
  t.validate = CheckObserver;
  t.build = BuildObserver;
  return t;
}

}  // namespace

TRACECUT_REGISTER_MODIFIER(observer, recipe::ObserverModifier, ObserverType());

}  // namespace tracecut::modifiers
