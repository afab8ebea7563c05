#include "modifiers/recipe_config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "quantization/quantize.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::TextFormat;

RecipeChecker::RecipeChecker(absl::string_view source, const Message& message,
                             const TextFormat::ParseInfoTree* tree,
                             std::string path, std::string location)
    : source_(source),
      message_(message),
      tree_(tree),
      path_(std::move(path)),
      location_(std::move(location)) {}

RecipeChecker RecipeChecker::Nested(absl::string_view name,
                                    const Message& nested) const {
  const FieldDescriptor* f = Field(name);
  const TextFormat::ParseInfoTree* tree =
      tree_ != nullptr && f != nullptr &&
              message_.GetReflection()->HasField(message_, f)
          ? tree_->GetTreeForNested(f, -1)
          : nullptr;
  std::string location = Location(f, -1);
  return RecipeChecker(source_, nested, tree, Join(name),
                       location.empty() ? location_ : location);
}

RecipeChecker RecipeChecker::Element(absl::string_view name, int index,
                                     const Message& nested) const {
  const FieldDescriptor* f = Field(name);
  const TextFormat::ParseInfoTree* tree =
      tree_ != nullptr && f != nullptr ? tree_->GetTreeForNested(f, index)
                                       : nullptr;
  std::string location = Location(f, index);
  return RecipeChecker(source_, nested, tree,
                       absl::StrCat(Join(name), "[", index, "]"),
                       location.empty() ? location_ : location);
}

absl::Status RecipeChecker::Error(absl::string_view name,
                                  absl::string_view what, int index) const {
  std::string location = Location(Field(name), index);
  if (location.empty()) location = location_;
  std::string field = Join(name);
  if (index >= 0) absl::StrAppend(&field, "[", index, "]");
  return absl::InvalidArgumentError(absl::StrCat(
      location.empty() ? source_ : location, ": ", field, ": ", what));
}

absl::Status RecipeChecker::MessageError(absl::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(location_.empty() ? source_ : location_, ": ",
                   path_.empty() ? "recipe" : path_, ": ", what));
}

const FieldDescriptor* RecipeChecker::Field(absl::string_view name) const {
  // Null for a name the message does not have (a modifier's mistake):
  // its errors are then located at the message.
  return message_.GetDescriptor()->FindFieldByName(std::string(name));
}

std::string RecipeChecker::Location(const FieldDescriptor* f, int index) const {
  if (tree_ == nullptr || f == nullptr) return "";
  if (f->is_repeated() != (index >= 0)) return "";
  TextFormat::ParseLocation loc = tree_->GetLocation(f, index);
  if (loc.line < 0) return "";
  return absl::StrCat(source_, ":", loc.line + 1, ":", loc.column + 1);
}

std::string RecipeChecker::Join(absl::string_view name) const {
  return path_.empty() ? std::string(name) : absl::StrCat(path_, ".", name);
}

absl::Status CheckScheme(const RecipeChecker& parent, bool has_scheme,
                         const recipe::QuantizationScheme& scheme,
                         bool required) {
  if (!has_scheme) {
    if (required) return parent.Error("scheme", "is required");
    return absl::OkStatus();
  }
  RecipeChecker c = parent.Nested("scheme", scheme);
  if (IsTypedScheme(scheme)) {
    for (const char* field :
         {"bits", "symmetric", "group_size", "per_tensor"}) {
      const FieldDescriptor* f = scheme.GetDescriptor()->FindFieldByName(field);
      if (scheme.GetReflection()->HasField(scheme, f)) {
        return c.Error(field,
                       "cannot be combined with a compressed-tensors preset "
                       "or json scheme");
      }
    }
    const char* which = scheme.has_preset() ? "preset" : "json";
    if (scheme.has_preset() && scheme.has_json()) {
      return c.Error("json", "give either preset or json, not both");
    }
    absl::StatusOr<quantization::QuantizationScheme> typed =
        ToTypedScheme(scheme, {"Linear"});
    if (!typed.ok()) return c.Error(which, typed.status().message());
    if (!typed->weights.has_value()) {
      return c.Error(which, "quantizes no weight");
    }
    if (absl::Status runs = quantization::CheckTypedSchemeRuns(*typed);
        !runs.ok()) {
      return c.Error(which, runs.message());
    }
    return absl::OkStatus();
  }
  if (scheme.bits() < 2 || scheme.bits() > 8) {
    return c.Error("bits",
                   absl::StrCat("must be in [2, 8], got ", scheme.bits()));
  }
  if (scheme.group_size() != -1 && scheme.group_size() <= 0) {
    return c.Error("group_size",
                   absl::StrCat("must be > 0 or -1 (per-channel), got ",
                                scheme.group_size()));
  }
  if (scheme.per_tensor() && scheme.group_size() != -1) {
    return c.Error("per_tensor", absl::StrCat("needs group_size -1, got ",
                                              scheme.group_size()));
  }
  return absl::OkStatus();
}

quantization::QuantScheme ToQuantScheme(
    const recipe::QuantizationScheme& scheme) {
  quantization::QuantScheme s;
  s.bits = scheme.bits();
  s.symmetric = scheme.symmetric();
  s.group_size = scheme.group_size();
  s.per_tensor = scheme.per_tensor();
  return s;
}

bool IsTypedScheme(const recipe::QuantizationScheme& scheme) {
  return scheme.has_preset() || scheme.has_json();
}

absl::StatusOr<quantization::QuantizationScheme> ToTypedScheme(
    const recipe::QuantizationScheme& scheme,
    std::vector<std::string> targets) {
  if (scheme.has_preset()) {
    return quantization::PresetScheme(scheme.preset(), std::move(targets));
  }
  ASSIGN_OR_RETURN(util::Json j, util::ParseJson(scheme.json(), "json"));
  if (j.is_object() && !j.contains("targets")) {
    j["targets"] = util::Json::array();
  }
  ASSIGN_OR_RETURN(quantization::QuantizationScheme s,
                   quantization::QuantizationScheme::FromJson(j, "json"));
  s.targets = std::move(targets);
  return s;
}

absl::StatusOr<quantization::QuantizationArgs> ToKvCacheArgs(
    absl::string_view json) {
  ASSIGN_OR_RETURN(util::Json j, util::ParseJson(json, "kv_cache_scheme"));
  ASSIGN_OR_RETURN(
      quantization::QuantizationArgs args,
      quantization::QuantizationArgs::FromJson(j, "kv_cache_scheme"));
  if (args.dynamic != quantization::Dynamic::kStatic) {
    return absl::InvalidArgumentError(
        "must be static (dynamic: false): its scales are calibrated");
  }
  RETURN_IF_ERROR(
      quantization::ActivationObserver::CreateForAttention(args).status());
  return args;
}

absl::StatusOr<quantization::QuantizationArgs> WeightArgs(
    const recipe::QuantizationScheme& scheme,
    const std::vector<std::string>& targets, absl::string_view where) {
  if (IsTypedScheme(scheme)) {
    ASSIGN_OR_RETURN(quantization::QuantizationScheme typed,
                     ToTypedScheme(scheme, targets));
    if (!typed.weights.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the scheme quantizes no weight"));
    }
    return *typed.weights;
  }
  quantization::QuantizationArgs w;
  w.num_bits = scheme.bits();
  w.type = quantization::QuantType::kInt;
  w.symmetric = scheme.symmetric();
  if (scheme.per_tensor()) {
    w.strategy = quantization::Strategy::kTensor;
  } else if (scheme.group_size() > 0) {
    w.strategy = quantization::Strategy::kGroup;
    w.group_size = scheme.group_size();
  } else {
    w.strategy = quantization::Strategy::kChannel;
  }
  RETURN_IF_ERROR(w.Resolve(where));
  return w;
}

}  // namespace tracecut::modifiers
