#ifndef TRACECUT_PIPELINES_RECIPE_YAML_INTERNAL_H_
#define TRACECUT_PIPELINES_RECIPE_YAML_INTERNAL_H_

// What recipe_yaml.cc (stages, modifiers), recipe_yaml_write.cc (writing)
// and recipe_yaml_schemes.cc (presets, config_groups) share. Not API.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "pipelines/recipe.pb.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::recipe_yaml_internal {

// Errors located in the YAML text, and checked reads of its nodes.
class Reader {
 public:
  explicit Reader(absl::string_view source) : source_(source) {}

  absl::Status Error(const YAML::Node& at, absl::string_view path,
                     absl::string_view what) const {
    return Error(at.Mark(), path, what);
  }

  absl::Status Error(const YAML::Mark& mark, absl::string_view path,
                     absl::string_view what) const {
    std::string where(source_);
    if (!mark.is_null()) {
      absl::StrAppend(&where, ":", mark.line + 1, ":", mark.column + 1);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", path.empty() ? "recipe" : path, ": ", what));
  }

  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };

  // The entries of mapping `node`, in order; a repeated key is an error
  // (PyYAML would keep the last silently).
  absl::StatusOr<std::vector<Entry>> Entries(const YAML::Node& node,
                                             absl::string_view path) const {
    if (!node.IsMap()) return Error(node, path, "must be a mapping");
    std::vector<Entry> out;
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) {
        return Error(it->first, path, "keys must be plain names");
      }
      std::string key = it->first.Scalar();
      if (!seen.insert(key).second) {
        return Error(it->first, Join(path, key), "appears twice");
      }
      out.push_back({std::move(key), it->first, it->second});
    }
    return out;
  }

  absl::StatusOr<std::string> String(const YAML::Node& n,
                                     absl::string_view path) const {
    if (!n.IsScalar() || n.Scalar().empty()) {
      return Error(n, path, "must be a non-empty string");
    }
    return n.Scalar();
  }

  // A string or a list of strings, as pydantic's validators accept targets.
  absl::StatusOr<std::vector<std::string>> Strings(
      const YAML::Node& n, absl::string_view path) const {
    if (n.IsScalar()) {
      ASSIGN_OR_RETURN(std::string s, String(n, path));
      return std::vector<std::string>{std::move(s)};
    }
    if (!n.IsSequence()) {
      return Error(n, path, "must be a string or a list of strings");
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < n.size(); ++i) {
      ASSIGN_OR_RETURN(std::string s,
                       String(n[i], absl::StrCat(path, "[", i, "]")));
      out.push_back(std::move(s));
    }
    return out;
  }

  absl::StatusOr<bool> Bool(const YAML::Node& n, absl::string_view path) const {
    bool b = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b)) {
      return Error(n, path, "must be true or false");
    }
    return b;
  }

  absl::StatusOr<double> Double(const YAML::Node& n,
                                absl::string_view path) const {
    double d = 0;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, d) ||
        !std::isfinite(d)) {
      return Error(n, path, "must be a finite number");
    }
    return d;
  }

  absl::StatusOr<int64_t> Int(const YAML::Node& n,
                              absl::string_view path) const {
    int64_t v = 0;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
      return Error(n, path, "must be an integer");
    }
    return v;
  }

  // Null, or the string `want`.
  absl::Status NullOr(const YAML::Node& n, absl::string_view path,
                      absl::string_view what) const {
    if (n.IsNull()) return absl::OkStatus();
    return Error(n, path, absl::StrCat("unsupported value (", what, ")"));
  }

  static std::string Join(absl::string_view path, absl::string_view key) {
    return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
  }

 private:
  std::string source_;
};

// One config group of a QuantizationMixin modifier, resolved.
struct Group {
  std::vector<std::string> targets;
  recipe::QuantizationScheme scheme;
  // The weights' own actorder: nullopt unset, else true for "weight".
  std::optional<bool> actorder;
};

// The fields QuantizationMixin (GPTQModifier, QuantizationModifier) shares.
struct MixinFields {
  std::vector<std::string> targets = {"Linear"};  // Its default.
  std::vector<std::string> ignore;
  YAML::Node scheme;
  YAML::Node config_groups;
  YAML::Node kv_cache_scheme;
  YAML::Mark at;  // The modifier, for errors about it as a whole.
};

// GPTQModifier's actorder: the Sentinel("static") default, None, or weight.
enum class ActOrder { kDefault, kNone, kWeight };

// The name of the compressed-tensors preset `scheme` is exactly, if any
// (Note [llm-compressor presets]).
std::optional<std::string> PresetOf(const recipe::QuantizationScheme& scheme);

// Weight observers that, on a weight (observed once), all compute its min
// and max: what round-to-nearest and GPTQ use.
bool IsMinMaxObserver(absl::string_view name);

// An actorder value: false for null, true for weight/static.
absl::StatusOr<std::optional<bool>> ParseActOrderValue(const Reader& r,
                                                       const YAML::Node& n,
                                                       const std::string& path);

// scheme or config_groups, as QuantizationMixin.resolve_quantization_config
// resolves them: one group per preset or config group, in order.
// A YAML value as JSON: scalars typed as YAML 1.1 readers type them (null,
// booleans, integers, floats, else strings).
util::Json YamlToJson(const YAML::Node& n);

absl::StatusOr<std::vector<Group>> ResolveGroups(const Reader& r,
                                                 const MixinFields& f,
                                                 const std::string& path);

}  // namespace tracecut::pipelines::recipe_yaml_internal

#endif  // TRACECUT_PIPELINES_RECIPE_YAML_INTERNAL_H_
