// The GPTQ modifier's recipe entry (gptq_modifier.proto): its checks, the
// modifier it builds, and its registration.

#include <google/protobuf/message.h>

#include <cmath>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "modifiers/gptq_modifier.h"
#include "modifiers/gptq_modifier.pb.h"
#include "modifiers/recipe_config.h"
#include "modifiers/registry.h"
#include "modifiers/weight_quant_recipe.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

using ::google::protobuf::Message;

absl::Status CheckGptq(const Message& entry, const RecipeChecker& c,
                       const RecipeContext&) {
  const auto& m = static_cast<const recipe::GptqModifier&>(entry);
  RETURN_IF_ERROR(
      CheckScheme(c, m.has_scheme(), m.scheme(), /*required=*/true));
  if (IsTypedScheme(m.scheme()) && m.has_static_groups()) {
    return c.Error("static_groups",
                   "compressed-tensors schemes always use static groups "
                   "(llm-compressor's actorder \"weight\")");
  }
  RETURN_IF_ERROR(CheckKvCache(c, m));
  RETURN_IF_ERROR(CheckTargets(c, m));
  if (!std::isfinite(m.dampening_frac()) || m.dampening_frac() < 0) {
    return c.Error(
        "dampening_frac",
        absl::StrCat("must be finite and >= 0, got ", m.dampening_frac()));
  }
  if (m.block_size() <= 0) {
    return c.Error("block_size",
                   absl::StrCat("must be > 0, got ", m.block_size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Modifier>> BuildGptq(
    const Message& entry, const RecipeContext& context) {
  const auto& g = static_cast<const recipe::GptqModifier&>(entry);
  GptqModifierOptions o;
  ASSIGN_OR_RETURN(o.weights, WeightQuantOptionsOf(g, context));
  if (o.weights.typed.has_value()) {
    quantization::ActOrder& a = o.weights.typed->weights->actorder;
    a = ResolveActOrder(g, a);
  }
  o.dampening_frac = g.dampening_frac();
  o.block_size = g.block_size();
  o.act_order = g.actorder();
  o.static_groups = g.static_groups();
  return std::make_unique<GptqModifier>(std::move(o));
}

absl::StatusOr<quantization::QuantizationArgs> GptqWeightScheme(
    const Message& entry, absl::string_view where, ModuleSelector& modules) {
  const auto& g = static_cast<const recipe::GptqModifier&>(entry);
  modules = Selector(g.targets(), g.ignore());
  return WeightArgs(g.scheme(), modules.targets, where);
}

ModifierType GptqType() {
  ModifierType t;
  t.validate = CheckGptq;
  t.build = BuildGptq;
  t.weight_scheme = GptqWeightScheme;
  return t;
}

}  // namespace

quantization::ActOrder ResolveActOrder(const recipe::GptqModifier& gptq,
                                       quantization::ActOrder from_scheme) {
  if (gptq.has_actorder() && !gptq.actorder()) {
    return quantization::ActOrder::kNone;
  }
  if (from_scheme != quantization::ActOrder::kNone) return from_scheme;
  return gptq.has_actorder() ? quantization::ActOrder::kWeight
                             : quantization::ActOrder::kStatic;
}

quantization::GptqOptions ToGptqOptions(const recipe::GptqModifier& gptq) {
  quantization::GptqOptions o;
  o.scheme = ToQuantScheme(gptq.scheme());
  o.dampening_frac = gptq.dampening_frac();
  o.block_size = gptq.block_size();
  o.act_order = gptq.actorder();
  o.static_groups = gptq.static_groups();
  return o;
}

TRACECUT_REGISTER_MODIFIER(gptq, recipe::GptqModifier, GptqType());

}  // namespace tracecut::modifiers
