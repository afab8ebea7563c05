#ifndef TRACECUT_MODIFIERS_WEIGHT_QUANT_RECIPE_H_
#define TRACECUT_MODIFIERS_WEIGHT_QUANT_RECIPE_H_

// What the recipe entries of the weight quantizers (rtn, gptq) share: their
// modules, scheme, KV-cache scheme and the run's context as
// WeightQuantOptions.

#include "absl/status/statusor.h"
#include "modifiers/recipe_config.h"
#include "modifiers/registry.h"
#include "modifiers/weight_quant_modifier.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

template <typename Entry>
absl::StatusOr<WeightQuantOptions> WeightQuantOptionsOf(
    const Entry& m, const RecipeContext& context) {
  WeightQuantOptions o;
  o.modules = Selector(m.targets(), m.ignore());
  if (IsTypedScheme(m.scheme())) {
    ASSIGN_OR_RETURN(o.typed, ToTypedScheme(m.scheme(), o.modules.targets));
  } else {
    o.scheme = ToQuantScheme(m.scheme());
  }
  if (m.has_kv_cache_scheme()) {
    ASSIGN_OR_RETURN(o.kv_cache, ToKvCacheArgs(m.kv_cache_scheme()));
  }
  o.collective = context.collective;
  o.all_expert_tokens = context.all_expert_tokens;
  o.whole_groups = context.whole_groups;
  return o;
}

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_WEIGHT_QUANT_RECIPE_H_
