// AWQ's recipe entry (awq_modifier.proto): its checks, the modifier it
// builds (with the scheme of the weight quantizer after it, unless it has
// one of its own), and its registration.

#include <google/protobuf/message.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "modifiers/awq_modifier.h"
#include "modifiers/awq_modifier.pb.h"
#include "modifiers/recipe_config.h"
#include "modifiers/registry.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

using ::google::protobuf::Message;

// The first entry after this one that quantizes weights, or -1.
int NextQuantizer(const RecipeContext& context) {
  for (size_t i = context.index + 1; i < context.entries.size(); ++i) {
    const ModifierType* t =
        FindModifierType(context.entries[i]->GetDescriptor());
    if (t != nullptr && t->weight_scheme != nullptr) return i;
  }
  return -1;
}

absl::Status CheckAwq(const Message& entry, const RecipeChecker& c,
                      const RecipeContext& context) {
  const auto& m = static_cast<const recipe::AwqModifier&>(entry);
  const int least = m.duo_scaling() == recipe::AwqModifier::BOTH  ? 4
                    : m.duo_scaling() == recipe::AwqModifier::OFF ? 2
                                                                  : 3;
  if (m.duo_scaling() == recipe::AwqModifier::DUO_SCALING_UNSPECIFIED) {
    return c.Error("duo_scaling", "must be ON, OFF or BOTH");
  }
  if (m.n_grid() < least || m.n_grid() > 1000) {
    return c.Error("n_grid", absl::StrCat("must be in [", least,
                                          ", 1000] here, got ", m.n_grid()));
  }
  RETURN_IF_ERROR(CheckMappings(c, m.mappings()));
  if (m.has_scheme()) {
    RETURN_IF_ERROR(CheckScheme(c, true, m.scheme(), /*required=*/true));
    for (int i = 0; i < m.targets_size(); ++i) {
      if (m.targets(i).empty()) return c.Error("targets", "is empty", i);
    }
    return CheckIgnore(c, m);
  }
  if (!m.targets().empty() || !m.ignore().empty()) {
    return c.Error("scheme", "is required with targets or ignore");
  }
  if (NextQuantizer(context) >= 0) return absl::OkStatus();
  return c.MessageError(
      "is not followed by a gptq or rtn modifier, whose scheme it searches "
      "scales for (or give it a scheme of its own)");
}

// AWQ's options: its own, and the scheme and modules of the weight
// quantizer after it (CheckAwq made sure there is one).
absl::StatusOr<std::unique_ptr<Modifier>> BuildAwq(
    const Message& entry, const RecipeContext& context) {
  const auto& a = static_cast<const recipe::AwqModifier&>(entry);
  AwqOptions o;
  for (const recipe::AwqModifier::Mapping& mapping : a.mappings()) {
    o.mappings.push_back(
        {mapping.smooth_layer(),
         {mapping.balance_layers().begin(), mapping.balance_layers().end()}});
  }
  o.duo_scaling =
      a.duo_scaling() == recipe::AwqModifier::OFF    ? AwqDuoScaling::kOff
      : a.duo_scaling() == recipe::AwqModifier::BOTH ? AwqDuoScaling::kBoth
                                                     : AwqDuoScaling::kOn;
  o.n_grid = a.n_grid();
  o.collective = context.collective;
  o.all_expert_tokens = context.all_expert_tokens;
  // The grid AWQ's search quantizes on (llm-compressor's): its own scheme,
  // or the next quantizer's.
  if (a.has_scheme()) {
    o.quantized = Selector(a.targets(), a.ignore());
    if (o.quantized.targets.empty()) o.quantized.targets = {"Linear"};
    ASSIGN_OR_RETURN(o.weights, WeightArgs(a.scheme(), o.quantized.targets,
                                           absl::StrCat("recipe: modifiers[",
                                                        context.index, "]")));
  } else {
    const int next = NextQuantizer(context);
    if (next < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("recipe: modifiers[", context.index,
                       "].awq is not followed by a gptq or rtn modifier"));
    }
    const Message& q = *context.entries[next];
    ASSIGN_OR_RETURN(
        o.weights,
        FindModifierType(q.GetDescriptor())
            ->weight_scheme(q, absl::StrCat("recipe: modifiers[", next, "]"),
                            o.quantized));
    if (o.quantized.targets.empty()) o.quantized.targets = {"Linear"};
  }
  return std::make_unique<AwqModifier>(std::move(o));
}

ModifierType AwqType() {
  ModifierType t;
  t.validate = CheckAwq;
  t.build = BuildAwq;
  return t;
}

}  // namespace

TRACECUT_REGISTER_MODIFIER(awq, recipe::AwqModifier, AwqType());

}  // namespace tracecut::modifiers
