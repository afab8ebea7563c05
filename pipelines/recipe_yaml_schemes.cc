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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipelines/recipe.pb.h"
#include "pipelines/recipe_yaml_internal.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::recipe_yaml_internal {
namespace {

// Note [llm-compressor presets]
// compressed-tensors' weight-only integer presets (quant_scheme.py of the
// pinned version): symmetric int with groups of 128 columns, W4A16_ASYM
// asymmetric. The other presets quantize activations or use float grids,
// which tracecut's recipes cannot express yet.
constexpr Preset kPresets[] = {
    {"W2A16", 2, true},       {"W3A16", 3, true}, {"W4A16", 4, true},
    {"W4A16_ASYM", 4, false}, {"W5A16", 5, true}, {"W6A16", 6, true},
    {"W7A16", 7, true},       {"W8A16", 8, true},
};
constexpr int64_t kPresetGroupSize = 128;

// Every other preset name compressed-tensors knows, for a clearer refusal.
constexpr const char* kOtherPresets[] = {
    "UNQUANTIZED", "W2A4",      "W2A8",     "W3A4",        "W3A8",      "W4A4",
    "W4A8",        "W4AFP8",    "W5A8",     "W6A8",        "W7A8",      "W8A8",
    "INT8",        "INT8_W8A8", "FP8",      "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4",
    "NVFP4A16",    "MXFP4",     "MXFP4A16", "MXFP8",       "MXFP8A16",
};

const Preset* FindPreset(absl::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

std::string SupportedPresets() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return absl::StrJoin(names, ", ");
}

recipe::QuantizationScheme SchemeOf(const Preset& p) {
  recipe::QuantizationScheme s;
  s.set_bits(p.bits);
  s.set_symmetric(p.symmetric);
  s.set_group_size(kPresetGroupSize);
  return s;
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
  const Preset* p = FindPreset(name);
  if (p == nullptr) {
    bool known = false;
    for (const char* other : kOtherPresets) known |= name == other;
    return r.Error(
        at, path,
        known ? absl::StrCat("scheme ", name, " not supported yet (supported: ",
                             SupportedPresets(), ")")
              : absl::StrCat("scheme ", name,
                             " is not a compressed-tensors preset "
                             "(supported: ",
                             SupportedPresets(), ")"));
  }
  Group g;
  g.scheme = SchemeOf(*p);
  g.targets = std::move(targets);
  return g;
}

}  // namespace

const Preset* PresetOf(const recipe::QuantizationScheme& scheme) {
  for (const Preset& p : kPresets) {
    if (scheme.bits() == p.bits && scheme.symmetric() == p.symmetric &&
        scheme.group_size() == kPresetGroupSize && !scheme.per_tensor()) {
      return &p;
    }
  }
  return nullptr;
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
