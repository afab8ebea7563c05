#include "pipelines/recipe.h"

#include <c10/core/Device.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "pipelines/gptq.h"
#include "pipelines/quantize.h"
#include "pipelines/recipe.pb.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::Message;
using ::google::protobuf::TextFormat;

// Keeps the first parse error, with 1-based line and column.
//
// The parser reports an unknown field name or enum value at the token after
// it (possibly on a later line); such errors are moved back to the start of
// the offending name, which is what a user needs to see.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  FirstErrorCollector(absl::string_view source, absl::string_view text)
      : source_(source), lines_(absl::StrSplit(text, '\n')) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!error_.empty()) return;
    if (line < 0) {
      error_ = absl::StrCat(source_, ": ", message);
      return;
    }
    BackUpToName(message, line, column);
    error_ =
        absl::StrCat(source_, ":", line + 1, ":", column + 1, ": ", message);
  }

  const std::string& error() const { return error_; }

 private:
  void BackUpToName(absl::string_view message, int& line, int& column) const {
    static constexpr absl::string_view kPrefixes[] = {
        "has no field named \"", "Unknown enumeration value of \""};
    for (absl::string_view prefix : kPrefixes) {
      size_t start = message.find(prefix);
      if (start == absl::string_view::npos) continue;
      start += prefix.size();
      size_t end = message.find('"', start);
      if (end == absl::string_view::npos) return;
      absl::string_view name = message.substr(start, end - start);
      // The last occurrence of `name` before the reported position.
      for (int l = std::min<int>(line, static_cast<int>(lines_.size()) - 1);
           l >= 0; --l) {
        absl::string_view text = lines_[l];
        if (l == line) text = text.substr(0, std::max(column, 0));
        size_t at = text.rfind(name);
        if (at != absl::string_view::npos) {
          line = l;
          column = static_cast<int>(at);
          return;
        }
      }
      return;
    }
  }

  std::string source_;
  std::vector<absl::string_view> lines_;
  std::string error_;
};

// Walks a recipe message by message, knowing each one's field path and, when
// the text was parsed here, where its fields are.
class Checker {
 public:
  Checker(absl::string_view source, const Message& message,
          const TextFormat::ParseInfoTree* tree, std::string path,
          std::string location)
      : source_(source),
        message_(message),
        tree_(tree),
        path_(std::move(path)),
        location_(std::move(location)) {}

  // The checker of singular message field `name` (which may be unset).
  Checker Nested(absl::string_view name, const Message& nested) const {
    const FieldDescriptor* f = Field(name);
    const TextFormat::ParseInfoTree* tree =
        tree_ != nullptr && message_.GetReflection()->HasField(message_, f)
            ? tree_->GetTreeForNested(f, -1)
            : nullptr;
    std::string location = Location(f, -1);
    return Checker(source_, nested, tree, Join(name),
                   location.empty() ? location_ : location);
  }

  // The checker of element `index` of repeated message field `name`.
  Checker Element(absl::string_view name, int index,
                  const Message& nested) const {
    const FieldDescriptor* f = Field(name);
    const TextFormat::ParseInfoTree* tree =
        tree_ != nullptr ? tree_->GetTreeForNested(f, index) : nullptr;
    std::string location = Location(f, index);
    return Checker(source_, nested, tree,
                   absl::StrCat(Join(name), "[", index, "]"),
                   location.empty() ? location_ : location);
  }

  // An error about field `name` (element `index` if repeated), located at
  // the field when it was parsed, else at this message.
  absl::Status Error(absl::string_view name, absl::string_view what,
                     int index = -1) const {
    std::string location = Location(Field(name), index);
    if (location.empty()) location = location_;
    std::string field = Join(name);
    if (index >= 0) absl::StrAppend(&field, "[", index, "]");
    return absl::InvalidArgumentError(absl::StrCat(
        location.empty() ? source_ : location, ": ", field, ": ", what));
  }

  // An error about this message as a whole.
  absl::Status MessageError(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(location_.empty() ? source_ : location_, ": ",
                     path_.empty() ? "recipe" : path_, ": ", what));
  }

 private:
  const FieldDescriptor* Field(absl::string_view name) const {
    const FieldDescriptor* f =
        message_.GetDescriptor()->FindFieldByName(std::string(name));
    // Field names here are compile-time constants of recipe.proto.
    if (f == nullptr) std::abort();
    return f;
  }

  std::string Location(const FieldDescriptor* f, int index) const {
    if (tree_ == nullptr) return "";
    if (f->is_repeated() != (index >= 0)) return "";
    TextFormat::ParseLocation loc = tree_->GetLocation(f, index);
    if (loc.line < 0) return "";
    return absl::StrCat(source_, ":", loc.line + 1, ":", loc.column + 1);
  }

  std::string Join(absl::string_view name) const {
    return path_.empty() ? std::string(name) : absl::StrCat(path_, ".", name);
  }

  std::string source_;
  const Message& message_;
  const TextFormat::ParseInfoTree* tree_;
  std::string path_;
  std::string location_;
};

absl::Status CheckScheme(const Checker& parent, bool has_scheme,
                         const recipe::QuantizationScheme& scheme,
                         bool required) {
  if (!has_scheme) {
    if (required) return parent.Error("scheme", "is required");
    return absl::OkStatus();
  }
  Checker c = parent.Nested("scheme", scheme);
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
    if (absl::Status runs = CheckTypedSchemeRuns(*typed); !runs.ok()) {
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

template <typename M>
absl::Status CheckTargets(const Checker& c, const M& m) {
  if (m.targets().empty()) {
    return c.MessageError(
        "targets is empty: name at least one module type or path");
  }
  for (int i = 0; i < m.targets_size(); ++i) {
    if (m.targets(i).empty()) return c.Error("targets", "is empty", i);
  }
  for (int i = 0; i < m.ignore_size(); ++i) {
    if (m.ignore(i).empty()) return c.Error("ignore", "is empty", i);
  }
  return absl::OkStatus();
}

// A modifier's kv_cache_scheme (Note [KV cache] in rtn_modifier.h).
template <typename M>
absl::Status CheckKvCache(const Checker& c, const M& m) {
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

absl::Status CheckGptq(const Checker& c, const recipe::GptqModifier& m) {
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

absl::Status CheckObserver(const Checker& c,
                           const recipe::ObserverModifier& m) {
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

absl::Status CheckRtn(const Checker& c, const recipe::RtnModifier& m) {
  RETURN_IF_ERROR(
      CheckScheme(c, m.has_scheme(), m.scheme(), /*required=*/true));
  RETURN_IF_ERROR(CheckKvCache(c, m));
  return CheckTargets(c, m);
}

// A transform's mappings: a smooth layer and at least one balance layer
// each, no empty pattern.
template <typename Mapping>
absl::Status CheckMappings(
    const Checker& c, const google::protobuf::RepeatedPtrField<Mapping>& all) {
  for (int i = 0; i < all.size(); ++i) {
    const Mapping& mapping = all.Get(i);
    Checker mc = c.Element("mappings", i, mapping);
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

absl::Status CheckSmoothQuant(const Checker& c,
                              const recipe::SmoothQuantModifier& m) {
  const double a = m.smoothing_strength();
  if (!(a >= 0 && a <= 1)) {
    return c.Error("smoothing_strength",
                   absl::StrCat("must be in [0, 1], got ", a));
  }
  RETURN_IF_ERROR(CheckMappings(c, m.mappings()));
  for (int i = 0; i < m.ignore_size(); ++i) {
    if (m.ignore(i).empty()) return c.Error("ignore", "is empty", i);
  }
  return absl::OkStatus();
}

absl::Status CheckAwq(const Checker& c, const recipe::AwqModifier& m,
                      const recipe::Recipe& r, int index) {
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
    for (int i = 0; i < m.ignore_size(); ++i) {
      if (m.ignore(i).empty()) return c.Error("ignore", "is empty", i);
    }
    return absl::OkStatus();
  }
  if (!m.targets().empty() || !m.ignore().empty()) {
    return c.Error("scheme", "is required with targets or ignore");
  }
  for (int i = index + 1; i < r.modifiers_size(); ++i) {
    if (r.modifiers(i).has_gptq() || r.modifiers(i).has_rtn()) {
      return absl::OkStatus();
    }
  }
  return c.MessageError(
      "is not followed by a gptq or rtn modifier, whose scheme it searches "
      "scales for (or give it a scheme of its own)");
}

absl::Status CheckCache(const Checker& c,
                        const recipe::IntermediatesCacheConfig& m) {
  try {
    c10::Device device(m.offload_device());
    (void)device;
  } catch (const c10::Error&) {
    return c.Error(
        "offload_device",
        absl::StrCat("is not a device (\"cpu\", \"cuda:0\", ...): \"",
                     m.offload_device(), "\""));
  }
  if (m.memory_budget_bytes() < -1) {
    return c.Error("memory_budget_bytes",
                   absl::StrCat("must be >= 0 or -1 (unlimited), got ",
                                m.memory_budget_bytes()));
  }
  return absl::OkStatus();
}

absl::Status Check(const recipe::Recipe& r, const Checker& c) {
  if (r.modifiers().empty()) {
    return c.MessageError("has no modifiers");
  }
  for (int i = 0; i < r.modifiers_size(); ++i) {
    const recipe::Modifier& m = r.modifiers(i);
    Checker mc = c.Element("modifiers", i, m);
    switch (m.kind_case()) {
      case recipe::Modifier::kGptq:
        RETURN_IF_ERROR(CheckGptq(mc.Nested("gptq", m.gptq()), m.gptq()));
        break;
      case recipe::Modifier::kObserver:
        RETURN_IF_ERROR(
            CheckObserver(mc.Nested("observer", m.observer()), m.observer()));
        break;
      case recipe::Modifier::kRtn:
        RETURN_IF_ERROR(CheckRtn(mc.Nested("rtn", m.rtn()), m.rtn()));
        break;
      case recipe::Modifier::kSmoothquant:
        RETURN_IF_ERROR(CheckSmoothQuant(
            mc.Nested("smoothquant", m.smoothquant()), m.smoothquant()));
        break;
      case recipe::Modifier::kAwq:
        RETURN_IF_ERROR(CheckAwq(mc.Nested("awq", m.awq()), m.awq(), r, i));
        break;
      case recipe::Modifier::KIND_NOT_SET:
        return mc.MessageError(
            "names no modifier (awq, gptq, observer, rtn or smoothquant)");
    }
  }
  if (r.pipeline() == recipe::Recipe::PIPELINE_UNSPECIFIED) {
    return c.Error("pipeline", "must be SEQUENTIAL, LAYER_SEQUENTIAL or BASIC");
  }
  for (int i = 0; i < r.sequential_targets_size(); ++i) {
    if (r.sequential_targets(i).empty()) {
      return c.Error("sequential_targets", "is empty", i);
    }
  }
  if (r.has_cache()) {
    RETURN_IF_ERROR(CheckCache(c.Nested("cache", r.cache()), r.cache()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<recipe::Recipe> ParseRecipe(absl::string_view text,
                                           absl::string_view source) {
  recipe::Recipe r;
  FirstErrorCollector errors(source, text);
  TextFormat::ParseInfoTree tree;
  TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&tree);
  if (!parser.ParseFromString(std::string(text), &r)) {
    return absl::InvalidArgumentError(
        errors.error().empty() ? absl::StrCat(source, ": cannot parse recipe")
                               : errors.error());
  }
  RETURN_IF_ERROR(Check(r, Checker(source, r, &tree, "", "")));
  return r;
}

absl::StatusOr<recipe::Recipe> LoadRecipe(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read recipe ", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading recipe ", path));
  }
  return ParseRecipe(text.str(), path);
}

absl::Status ValidateRecipe(const recipe::Recipe& recipe,
                            absl::string_view source) {
  return Check(recipe, Checker(source, recipe, nullptr, "", ""));
}

QuantScheme ToQuantScheme(const recipe::QuantizationScheme& scheme) {
  QuantScheme s;
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

quantization::ActOrder ResolveActOrder(const recipe::GptqModifier& gptq,
                                       quantization::ActOrder from_scheme) {
  if (gptq.has_actorder() && !gptq.actorder()) {
    return quantization::ActOrder::kNone;
  }
  if (from_scheme != quantization::ActOrder::kNone) return from_scheme;
  return gptq.has_actorder() ? quantization::ActOrder::kWeight
                             : quantization::ActOrder::kStatic;
}

absl::Status CheckTypedSchemeRuns(const quantization::QuantizationScheme& s) {
  if (s.output_activations.has_value()) {
    return absl::UnimplementedError(absl::StrCat(
        "output_activations (", s.output_activations->ToString(),
        ") are not supported yet; quantize weights and input activations"));
  }
  const auto& in = s.input_activations;
  if (in.has_value() && in->dynamic != quantization::Dynamic::kDynamic) {
    // Static ones are calibrated (rtn_modifier.h Note [Static input
    // activations]) where an observer can: per tensor, or NVFP4's global
    // scale.
    RETURN_IF_ERROR(quantization::ActivationObserver::Create(*in).status());
  }
  return absl::OkStatus();
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

GptqOptions ToGptqOptions(const recipe::GptqModifier& gptq) {
  GptqOptions o;
  o.scheme = ToQuantScheme(gptq.scheme());
  o.dampening_frac = gptq.dampening_frac();
  o.block_size = gptq.block_size();
  o.act_order = gptq.actorder();
  o.static_groups = gptq.static_groups();
  return o;
}

}  // namespace tracecut::pipelines
