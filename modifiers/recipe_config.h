#ifndef TRACECUT_MODIFIERS_RECIPE_CONFIG_H_
#define TRACECUT_MODIFIERS_RECIPE_CONFIG_H_

// What the modifiers' recipe entries (modifiers/*.proto) share: a checker
// that names the field and, for parsed text, its line and column in every
// error; checks of schemes, targets and mappings; and the conversions of a
// validated entry's scheme into quantization/'s types.
//
//   absl::Status CheckMine(const google::protobuf::Message& entry,
//                          const RecipeChecker& c) {
//     const auto& m = static_cast<const recipe::RtnModifier&>(entry);
//     RETURN_IF_ERROR(CheckScheme(c, m.has_scheme(), m.scheme(), true));
//     return CheckTargets(c, m);
//   }
//
// Errors read "recipe.textproto:3:27: modifiers[0].gptq.scheme.bits: must
// be in [2, 8], got 9".

#include <google/protobuf/message.h>
#include <google/protobuf/repeated_ptr_field.h>
#include <google/protobuf/text_format.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "modifiers/modifier.h"
#include "modifiers/weight_scheme.pb.h"
#include "quantization/gptq.h"
#include "quantization/quant_args.h"
#include "quantization/quantize.h"

namespace tracecut::modifiers {

// Walks a recipe message by message, knowing each one's field path and, when
// the text was parsed, where its fields are.
class RecipeChecker {
 public:
  // `tree`: the parser's locations (null: the message was not parsed from
  // text); `path`: the message's field path ("modifiers[0].gptq"; empty for
  // the recipe); `location`: "file:line:column" of the message, or empty.
  RecipeChecker(absl::string_view source,
                const google::protobuf::Message& message,
                const google::protobuf::TextFormat::ParseInfoTree* tree,
                std::string path, std::string location);

  // The checker of singular message field `name` (which may be unset).
  RecipeChecker Nested(absl::string_view name,
                       const google::protobuf::Message& nested) const;
  // The checker of element `index` of repeated message field `name`.
  RecipeChecker Element(absl::string_view name, int index,
                        const google::protobuf::Message& nested) const;

  // An error about field `name` (element `index` if repeated), located at
  // the field when it was parsed, else at this message.
  absl::Status Error(absl::string_view name, absl::string_view what,
                     int index = -1) const;
  // An error about this message as a whole.
  absl::Status MessageError(absl::string_view what) const;

 private:
  const google::protobuf::FieldDescriptor* Field(absl::string_view name) const;
  std::string Location(const google::protobuf::FieldDescriptor* f,
                       int index) const;
  std::string Join(absl::string_view name) const;

  std::string source_;
  const google::protobuf::Message& message_;
  const google::protobuf::TextFormat::ParseInfoTree* tree_;
  std::string path_;
  std::string location_;
};

// A scheme field: required or not, tracecut's integer fields in range or a
// compressed-tensors preset / json tracecut runs.
absl::Status CheckScheme(const RecipeChecker& parent, bool has_scheme,
                         const recipe::QuantizationScheme& scheme,
                         bool required);

// No empty ignore pattern.
template <typename M>
absl::Status CheckIgnore(const RecipeChecker& c, const M& m) {
  for (int i = 0; i < m.ignore_size(); ++i) {
    if (m.ignore(i).empty()) return c.Error("ignore", "is empty", i);
  }
  return absl::OkStatus();
}

// At least one target; no empty target or ignore pattern.
template <typename M>
absl::Status CheckTargets(const RecipeChecker& c, const M& m) {
  if (m.targets().empty()) {
    return c.MessageError(
        "targets is empty: name at least one module type or path");
  }
  for (int i = 0; i < m.targets_size(); ++i) {
    if (m.targets(i).empty()) return c.Error("targets", "is empty", i);
  }
  return CheckIgnore(c, m);
}

// A transform's mappings: a smooth layer and at least one balance layer
// each, no empty pattern.
template <typename Mapping>
absl::Status CheckMappings(
    const RecipeChecker& c,
    const google::protobuf::RepeatedPtrField<Mapping>& all) {
  for (int i = 0; i < all.size(); ++i) {
    const Mapping& mapping = all.Get(i);
    RecipeChecker mc = c.Element("mappings", i, mapping);
    if (mapping.smooth_layer().empty()) {
      return mc.Error("smooth_layer", "is required");
    }
    if (mapping.balance_layers().empty()) {
      return mc.MessageError("names no balance_layers");
    }
    for (int k = 0; k < mapping.balance_layers_size(); ++k) {
      if (mapping.balance_layers(k).empty()) {
        return mc.Error("balance_layers", "is empty", k);
      }
    }
  }
  return absl::OkStatus();
}

// Whether `scheme` names a compressed-tensors scheme (preset or json)
// rather than tracecut's integer fields.
bool IsTypedScheme(const recipe::QuantizationScheme& scheme);

// Conversions for validated entries.
quantization::QuantScheme ToQuantScheme(
    const recipe::QuantizationScheme& scheme);

// That scheme with the modifier's `targets`, resolved; InvalidArgument
// naming the bad field (an unknown preset, a json field compressed-tensors
// or tracecut refuses).
absl::StatusOr<quantization::QuantizationScheme> ToTypedScheme(
    const recipe::QuantizationScheme& scheme, std::vector<std::string> targets);

// A modifier's kv_cache_scheme (QuantizationArgs JSON), resolved; an error
// for one tracecut cannot calibrate (dynamic; neither per tensor nor per
// head).
absl::StatusOr<quantization::QuantizationArgs> ToKvCacheArgs(
    absl::string_view json);

// A kv_cache_scheme field (Note [KV cache] in weight_quant_modifier.h): it
// needs a compressed-tensors weight scheme and must resolve.
template <typename M>
absl::Status CheckKvCache(const RecipeChecker& c, const M& m) {
  if (!m.has_kv_cache_scheme()) return absl::OkStatus();
  if (!IsTypedScheme(m.scheme())) {
    return c.Error("kv_cache_scheme",
                   "needs a compressed-tensors scheme (preset or json) for "
                   "the weights");
  }
  if (absl::Status args = ToKvCacheArgs(m.kv_cache_scheme()).status();
      !args.ok()) {
    return c.Error("kv_cache_scheme", args.message());
  }
  return absl::OkStatus();
}

// The weight grid of `scheme` as compressed-tensors' args: a typed scheme's
// weights, or tracecut's integer fields spelled as QuantizationArgs.
// `targets` resolves a typed scheme; `where` names the entry in errors.
absl::StatusOr<quantization::QuantizationArgs> WeightArgs(
    const recipe::QuantizationScheme& scheme,
    const std::vector<std::string>& targets, absl::string_view where);

// The modules an entry's targets and ignore lists select.
template <typename Strings>
ModuleSelector Selector(const Strings& targets, const Strings& ignore) {
  ModuleSelector s;
  s.targets.assign(targets.begin(), targets.end());
  s.ignore.assign(ignore.begin(), ignore.end());
  return s;
}

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_RECIPE_CONFIG_H_
