// Quantization schemes in llm-compressor's recipe.yaml: presets by name and
// compressed-tensors' QuantizationScheme under config_groups.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "pipelines/recipe.h"
#include "pipelines/recipe.pb.h"
#include "pipelines/recipe_yaml_internal.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::recipe_yaml_internal {
namespace {

// Note [llm-compressor presets]
// Presets come from quantization/quant_args.h (compressed-tensors'
// PRESET_SCHEMES). Every scheme a recipe.yaml names, integer ones included,
// becomes a compressed-tensors scheme (`preset` or `json`), so that
// `scheme: W4A16` quantizes on compressed-tensors' grid (absmax/7.5, codes
// in [-8, 7]) as llm-compressor does, not on tracecut's legacy integer
// fields (absmax/7). Those fields are still how a recipe.yaml is written
// back from a textproto that uses them: the preset of the same shape.
// A config group compressed-tensors' own validation refuses is read field
// by field (ParseWeights) for an error that names the field.

// The recipe scheme for `scheme`, or nullopt when it is not integer
// weight-only with a strategy recipes express.
std::optional<recipe::QuantizationScheme> RecipeScheme(
    const quantization::QuantizationScheme& scheme) {
  if (!scheme.weights.has_value() || scheme.input_activations.has_value() ||
      scheme.output_activations.has_value()) {
    return std::nullopt;
  }
  const quantization::QuantizationArgs& w = *scheme.weights;
  if (w.type != quantization::QuantType::kInt ||
      w.dynamic != quantization::Dynamic::kStatic || w.num_bits < 2 ||
      w.num_bits > 8) {
    return std::nullopt;
  }
  recipe::QuantizationScheme s;
  s.set_bits(w.num_bits);
  s.set_symmetric(w.symmetric);
  switch (w.resolved_strategy()) {
    case quantization::Strategy::kGroup:
      if (!w.group_size.has_value()) return std::nullopt;
      s.set_group_size(*w.group_size);
      break;
    case quantization::Strategy::kChannel:
      s.set_group_size(-1);
      break;
    case quantization::Strategy::kTensor:
      s.set_group_size(-1);
      s.set_per_tensor(true);
      break;
    default:
      return std::nullopt;
  }
  return s;
}

// The presets recipes can run, by name, in compressed-tensors' order.
const std::vector<std::pair<std::string, recipe::QuantizationScheme>>&
SupportedPresets() {
  static const auto* presets = [] {
    auto* out =
        new std::vector<std::pair<std::string, recipe::QuantizationScheme>>();
    for (const std::string& name : quantization::PresetNames()) {
      absl::StatusOr<quantization::QuantizationScheme> s =
          quantization::PresetScheme(name, {"Linear"});
      if (!s.ok()) continue;
      if (std::optional<recipe::QuantizationScheme> r = RecipeScheme(*s)) {
        out->emplace_back(name, *r);
      }
    }
    return out;
  }();
  return *presets;
}

// A config group as a compressed-tensors scheme (recipe `json`); nullopt
// for an integer one compressed-tensors refuses, which ParseConfigGroup
// reads field by field to name what is wrong.
absl::StatusOr<std::optional<Group>> TypedConfigGroup(const Reader& r,
                                                      const YAML::Node& node,
                                                      const std::string& path) {
  util::Json j = YamlToJson(node);
  if (!j.is_object()) return r.Error(node, path, "must be a mapping");
  const util::Json* targets = util::FindMember(j, "targets");
  if (targets == nullptr || !targets->is_array() || targets->empty()) {
    return std::optional<Group>();  // ParseConfigGroup names the error.
  }
  absl::StatusOr<quantization::QuantizationScheme> typed =
      quantization::QuantizationScheme::FromJson(j, path);
  if (!typed.ok()) {
    // A float grid, block strategy or activations: compressed-tensors'
    // rules decide, and their error names the field.
    const util::Json* w = util::FindMember(j, "weights");
    const bool beyond_int =
        (w != nullptr && w->is_object() && w->contains("type") &&
         (*w)["type"] == "float") ||
        (util::FindMember(j, "input_activations") != nullptr &&
         !j["input_activations"].is_null()) ||
        (util::FindMember(j, "output_activations") != nullptr &&
         !j["output_activations"].is_null());
    if (beyond_int) {
      return r.Error(
          node, path,
          absl::StripPrefix(typed.status().message(), absl::StrCat(path, ".")));
    }
    return std::optional<Group>();
  }
  if (!typed->weights.has_value()) {
    return r.Error(node, path,
                   "quantizes no weights (tracecut quantizes weights and "
                   "their input activations, not activations alone)");
  }
  if (absl::Status runs = quantization::CheckTypedSchemeRuns(*typed);
      !runs.ok()) {
    return r.Error(node, path, runs.message());
  }
  Group g;
  g.targets = typed->targets;
  if (typed->weights->actorder != quantization::ActOrder::kNone) {
    g.actorder = true;  // Checked against the GPTQ modifier's own.
  }
  util::Json scheme = typed->ToJson();
  scheme.erase("targets");
  g.scheme.set_json(util::DumpJson(scheme));
  return std::optional<Group>(std::move(g));
}

// QuantizationArgs of a config group's weights.
absl::StatusOr<Group> ParseWeights(const Reader& r, const YAML::Node& node,
                                   const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries, r.Entries(node, path));
  Group g;
  int64_t bits = 8;
  bool symmetric = true;
  std::optional<int64_t> group_size;
  // Marks, not Nodes: assigning to a bound YAML::Node rebinds what it
  // refers to.
  YAML::Mark group_size_at = node.Mark();
  std::string strategy;
  for (const Reader::Entry& e : entries) {
    const std::string p = Reader::Join(path, e.key);
    const YAML::Node& v = e.value;
    if (e.key == "num_bits") {
      ASSIGN_OR_RETURN(bits, r.Int(v, p));
      if (bits < 2 || bits > 8) {
        return r.Error(v, p, absl::StrCat("must be in [2, 8], got ", bits));
      }
    } else if (e.key == "type") {
      ASSIGN_OR_RETURN(std::string type, r.String(v, p));
      if (type != "int") {
        return r.Error(v, p,
                       absl::StrCat("type ", type,
                                    " not supported yet (only int weights)"));
      }
    } else if (e.key == "symmetric") {
      ASSIGN_OR_RETURN(symmetric, r.Bool(v, p));
    } else if (e.key == "group_size") {
      group_size_at = v.Mark();
      if (!v.IsNull()) {
        ASSIGN_OR_RETURN(int64_t gs, r.Int(v, p));
        if (gs == 0 || gs < -1) {
          return r.Error(v, p, absl::StrCat("must be > 0 or -1, got ", gs));
        }
        group_size = gs;
      }
    } else if (e.key == "strategy") {
      if (!v.IsNull()) {
        ASSIGN_OR_RETURN(strategy, r.String(v, p));
        strategy = absl::AsciiStrToLower(strategy);
        if (strategy != "tensor" && strategy != "channel" &&
            strategy != "group") {
          return r.Error(v, p,
                         absl::StrCat("strategy ", strategy,
                                      " not supported yet (tensor, channel "
                                      "and group are)"));
        }
      }
    } else if (e.key == "dynamic") {
      ASSIGN_OR_RETURN(bool dynamic, r.Bool(v, p));
      if (dynamic) {
        return r.Error(v, p, "dynamic weights are not supported");
      }
    } else if (e.key == "actorder") {
      ASSIGN_OR_RETURN(std::optional<bool> a, ParseActOrderValue(r, v, p));
      if (!v.IsNull()) g.actorder = a;
    } else if (e.key == "observer") {
      if (!v.IsNull()) {
        ASSIGN_OR_RETURN(std::string obs, r.String(v, p));
        if (!IsMinMaxObserver(obs)) {
          return r.Error(
              v, p,
              absl::StrCat("observer ", obs, " not supported yet (minmax is)"));
        }
      }
    } else if (e.key == "observer_kwargs") {
      if (!v.IsNull() && !(v.IsMap() && v.size() == 0)) {
        return r.Error(v, p, "unsupported value (only {} or null)");
      }
    } else if (e.key == "zp_dtype") {
      // What compressed-tensors stores the zero point as; tracecut's output
      // uses the preset's (int8 for asymmetric int schemes).
      if (!v.IsNull()) {
        ASSIGN_OR_RETURN(std::string dt, r.String(v, p));
        if (dt != "torch.int8" && dt != "int8") {
          return r.Error(v, p,
                         absl::StrCat("zp_dtype ", dt,
                                      " not supported (null or "
                                      "torch.int8)"));
        }
      }
    } else if (e.key == "block_structure" || e.key == "scale_dtype") {
      RETURN_IF_ERROR(r.NullOr(v, p, "only null"));
    } else {
      return r.Error(e.key_node, p, "unsupported field");
    }
  }
  // compressed-tensors' inference of the strategy (QuantizationArgs'
  // validate_model_after).
  if (strategy.empty()) {
    strategy = !group_size.has_value() ? "tensor"
               : *group_size > 0       ? "group"
                                       : "channel";
  }
  recipe::QuantizationScheme& s = g.scheme;
  s.set_bits(static_cast<int>(bits));
  s.set_symmetric(symmetric);
  if (strategy == "group") {
    if (!group_size.has_value() || *group_size <= 0) {
      return r.Error(group_size_at, Reader::Join(path, "group_size"),
                     "strategy group needs a group_size > 0");
    }
    s.set_group_size(*group_size);
  } else {
    if (group_size.has_value() && *group_size != -1) {
      return r.Error(group_size_at, Reader::Join(path, "group_size"),
                     absl::StrCat("strategy ", strategy,
                                  " takes no group_size, got ", *group_size));
    }
    s.set_group_size(-1);
    s.set_per_tensor(strategy == "tensor");
  }
  return g;
}

// A QuantizationScheme under config_groups.
absl::StatusOr<Group> ParseConfigGroup(const Reader& r, const YAML::Node& node,
                                       const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries, r.Entries(node, path));
  ASSIGN_OR_RETURN(std::optional<Group> typed, TypedConfigGroup(r, node, path));
  if (typed.has_value()) return *std::move(typed);
  std::optional<Group> g;
  std::optional<std::vector<std::string>> targets;
  for (const Reader::Entry& e : entries) {
    const std::string p = Reader::Join(path, e.key);
    if (e.key == "targets") {
      ASSIGN_OR_RETURN(targets, r.Strings(e.value, p));
    } else if (e.key == "weights") {
      if (e.value.IsNull()) continue;
      ASSIGN_OR_RETURN(g, ParseWeights(r, e.value, p));
    } else if (e.key == "input_activations" || e.key == "output_activations") {
      RETURN_IF_ERROR(
          r.NullOr(e.value, p, "activation quantization not supported yet"));
    } else if (e.key == "format") {
      RETURN_IF_ERROR(r.NullOr(
          e.value, p, "tracecut picks the format the scheme calls for; null"));
    } else {
      return r.Error(e.key_node, p, "unsupported field");
    }
  }
  if (!targets.has_value() || targets->empty()) {
    return r.Error(node, path, "names no targets");
  }
  if (!g.has_value()) {
    return r.Error(node, path,
                   "quantizes no weights (tracecut quantizes weights only)");
  }
  g->targets = std::move(*targets);
  return *g;
}

absl::StatusOr<Group> PresetGroup(const Reader& r, const YAML::Node& at,
                                  const std::string& path,
                                  const std::string& name,
                                  std::vector<std::string> targets) {
  absl::StatusOr<quantization::QuantizationScheme> preset =
      quantization::PresetScheme(name, targets);
  if (!preset.ok()) {
    return r.Error(
        at, path,
        absl::StrCat("scheme ", name,
                     " is not a compressed-tensors preset "
                     "(known: ",
                     absl::StrJoin(quantization::PresetNames(), ", "), ")"));
  }
  Group g;
  g.targets = std::move(targets);
  if (preset->weights.has_value()) {
    if (absl::Status runs = quantization::CheckTypedSchemeRuns(*preset);
        !runs.ok()) {
      return r.Error(at, path,
                     absl::StrCat("scheme ", name, ": ", runs.message()));
    }
    g.scheme.set_preset(absl::AsciiStrToUpper(name));
  } else {
    return r.Error(at, path,
                   absl::StrCat("scheme ", name,
                                " quantizes no weights (tracecut quantizes "
                                "weights and their input activations, not "
                                "activations alone)"));
  }
  return g;
}

}  // namespace

// A YAML value as JSON: scalars typed as YAML 1.1 readers type them (null,
// booleans, integers, floats, else strings).
util::Json YamlToJson(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return nullptr;
  if (n.IsSequence()) {
    util::Json a = util::Json::array();
    for (const YAML::Node& e : n) a.push_back(YamlToJson(e));
    return a;
  }
  if (n.IsMap()) {
    util::Json o = util::Json::object();
    for (const auto& e : n) o[e.first.Scalar()] = YamlToJson(e.second);
    return o;
  }
  const std::string& v = n.Scalar();
  if (n.Tag() == "!") return v;  // Quoted: a string whatever it reads as.
  const std::string lower = absl::AsciiStrToLower(v);
  if (lower == "null" || lower == "~") return nullptr;
  if (lower == "true") return true;
  if (lower == "false") return false;
  int64_t i;
  if (absl::SimpleAtoi(v, &i)) return i;
  double d;
  if (v.find_first_of(".eE") != std::string::npos && absl::SimpleAtod(v, &d)) {
    return d;
  }
  return v;
}

std::optional<std::string> PresetOf(const recipe::QuantizationScheme& scheme) {
  if (scheme.has_preset()) return scheme.preset();
  if (scheme.has_json()) return std::nullopt;
  for (const auto& [name, preset] : SupportedPresets()) {
    if (scheme.bits() == preset.bits() &&
        scheme.symmetric() == preset.symmetric() &&
        scheme.group_size() == preset.group_size() &&
        scheme.per_tensor() == preset.per_tensor()) {
      return name;
    }
  }
  return std::nullopt;
}

bool IsMinMaxObserver(absl::string_view name) {
  return name == "minmax" || name == "memoryless_minmax" ||
         name == "static_minmax";
}

absl::StatusOr<std::optional<bool>> ParseActOrderValue(
    const Reader& r, const YAML::Node& n, const std::string& path) {
  if (n.IsNull()) return std::optional<bool>(false);
  if (n.IsScalar()) {
    const std::string v = absl::AsciiStrToLower(n.Scalar());
    if (v == "weight" || v == "static") return std::optional<bool>(true);
    if (v == "false") return std::optional<bool>(false);
    if (v == "group" || v == "dynamic" || v == "true") {
      // compressed-tensors of the pinned version refuses these too.
      return r.Error(n, path,
                     absl::StrCat("'", n.Scalar(),
                                  "' (dynamic groups) was removed from "
                                  "llm-compressor; use weight or null"));
    }
  }
  return r.Error(n, path, "must be weight, static or null");
}

absl::StatusOr<std::vector<Group>> ResolveGroups(const Reader& r,
                                                 const MixinFields& f,
                                                 const std::string& path) {
  const bool has_scheme = f.scheme.IsDefined() && !f.scheme.IsNull();
  const bool has_groups =
      f.config_groups.IsDefined() && !f.config_groups.IsNull();
  if (has_scheme && has_groups) {
    return r.Error(f.scheme, Reader::Join(path, "scheme"),
                   "give either scheme or config_groups, not both");
  }
  std::vector<Group> out;
  if (has_scheme) {
    const std::string p = Reader::Join(path, "scheme");
    if (f.scheme.IsScalar()) {
      ASSIGN_OR_RETURN(
          Group g, PresetGroup(r, f.scheme, p, f.scheme.Scalar(), f.targets));
      out.push_back(std::move(g));
    } else {
      ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                       r.Entries(f.scheme, p));
      for (const Reader::Entry& e : entries) {
        const std::string ep = Reader::Join(p, e.key);
        ASSIGN_OR_RETURN(std::vector<std::string> targets,
                         r.Strings(e.value, ep));
        ASSIGN_OR_RETURN(Group g,
                         PresetGroup(r, e.key_node, ep, e.key, targets));
        out.push_back(std::move(g));
      }
    }
  } else if (has_groups) {
    const std::string p = Reader::Join(path, "config_groups");
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                     r.Entries(f.config_groups, p));
    for (const Reader::Entry& e : entries) {
      ASSIGN_OR_RETURN(Group g,
                       ParseConfigGroup(r, e.value, Reader::Join(p, e.key)));
      out.push_back(std::move(g));
    }
  }
  if (out.empty()) {
    return r.Error(f.at, path,
                   "has no scheme or config_groups: it would quantize nothing");
  }
  return out;
}

}  // namespace tracecut::pipelines::recipe_yaml_internal
