#include "pipelines/recipe_yaml.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipelines/recipe.h"
#include "pipelines/recipe.pb.h"
#include "pipelines/recipe_yaml_internal.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::IsTypedScheme;
using ::tracecut::modifiers::ToKvCacheArgs;
namespace {

using recipe_yaml_internal::ActOrder;
using recipe_yaml_internal::Group;
using recipe_yaml_internal::IsMinMaxObserver;
using recipe_yaml_internal::MixinFields;
using recipe_yaml_internal::ParseActOrderValue;
using recipe_yaml_internal::Reader;
using recipe_yaml_internal::ResolveGroups;

constexpr absl::string_view kRuns =
    "(tracecut runs AWQModifier, GPTQModifier, QuantizationModifier and "
    "SmoothQuantModifier)";

// Stages, modifier groups and modifiers, in order, into one recipe.
class RecipeReader {
 public:
  explicit RecipeReader(absl::string_view source) : r_(source) {}

  absl::StatusOr<recipe::Recipe> Read(const YAML::Node& root) {
    if (root.IsNull()) return r_.Error(root, "", "is empty");
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> top, r_.Entries(root, ""));
    for (const Reader::Entry& e : top) {
      if (e.key == "args") {
        RETURN_IF_ERROR(ReadArgs(e.value));
      } else if (absl::EndsWith(e.key, "_stage")) {
        RETURN_IF_ERROR(ReadStage(e.value, e.key));
      } else {
        return r_.Error(e.key_node, e.key,
                        "unsupported key (stages end in _stage; args)");
      }
    }
    if (out_.modifiers().empty()) {
      return r_.Error(root, "", "has no modifiers");
    }
    return out_;
  }

 private:
  absl::Status ReadStage(const YAML::Node& node, const std::string& path) {
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                     r_.Entries(node, path));
    for (const Reader::Entry& e : entries) {
      const std::string p = Reader::Join(path, e.key);
      if (!absl::EndsWith(e.key, "_modifiers")) {
        return r_.Error(e.key_node, p,
                        "unsupported key (modifier groups end in _modifiers)");
      }
      ASSIGN_OR_RETURN(std::vector<Reader::Entry> mods, r_.Entries(e.value, p));
      for (const Reader::Entry& m : mods) {
        RETURN_IF_ERROR(ReadModifier(m, Reader::Join(p, m.key)));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadArgs(const YAML::Node& node) {
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                     r_.Entries(node, "args"));
    for (const Reader::Entry& e : entries) {
      const std::string p = Reader::Join("args", e.key);
      const YAML::Node& v = e.value;
      if (e.key == "pipeline") {
        ASSIGN_OR_RETURN(std::string name, r_.String(v, p));
        if (name == "sequential") {
          out_.set_pipeline(recipe::Recipe::SEQUENTIAL);
        } else if (name == "layer_sequential") {
          out_.set_pipeline(recipe::Recipe::LAYER_SEQUENTIAL);
        } else if (name == "basic") {
          out_.set_pipeline(recipe::Recipe::BASIC);
        } else {
          return r_.Error(v, p,
                          absl::StrCat("pipeline ", name,
                                       " not supported (sequential, "
                                       "layer_sequential, basic)"));
        }
      } else if (e.key == "sequential_targets") {
        RETURN_IF_ERROR(SetSequentialTargets(v, p));
      } else if (e.key == "propagate_error") {
        ASSIGN_OR_RETURN(bool b, r_.Bool(v, p));
        out_.set_propagate_error(b);
      } else if (e.key == "moe_calibrate_all_experts") {
        ASSIGN_OR_RETURN(bool b, r_.Bool(v, p));
        out_.set_calibrate_all_experts(b);
      } else if (e.key == "expert_modules") {
        ASSIGN_OR_RETURN(std::string s, r_.String(v, p));
        out_.set_expert_modules(s);
      } else {
        return r_.Error(e.key_node, p, "unsupported argument");
      }
    }
    return absl::OkStatus();
  }

  absl::Status SetSequentialTargets(const YAML::Node& v,
                                    const std::string& path) {
    if (v.IsNull()) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<std::string> targets, r_.Strings(v, path));
    std::vector<std::string> have(out_.sequential_targets().begin(),
                                  out_.sequential_targets().end());
    if (!have.empty() && have != targets) {
      return r_.Error(v, path,
                      absl::StrCat("differs from the sequential_targets given "
                                   "before (",
                                   absl::StrJoin(have, ", "), ")"));
    }
    out_.clear_sequential_targets();
    for (std::string& t : targets) out_.add_sequential_targets(std::move(t));
    return absl::OkStatus();
  }

  // Fields every llm-compressor Modifier has. True when `e` was one.
  absl::StatusOr<bool> CommonField(const Reader::Entry& e,
                                   const std::string& p) {
    const YAML::Node& v = e.value;
    if (e.key == "requires_calibration_data") {
      // A class property llm-compressor writes out with the fields.
      RETURN_IF_ERROR(r_.Bool(v, p).status());
      return true;
    }
    if (e.key == "index") {
      if (!v.IsNull()) RETURN_IF_ERROR(r_.Int(v, p).status());
      return true;
    }
    if (e.key == "group") {
      if (!v.IsNull()) RETURN_IF_ERROR(r_.String(v, p).status());
      return true;
    }
    if (e.key == "start" || e.key == "end" || e.key == "update") {
      if (v.IsNull()) return true;
      ASSIGN_OR_RETURN(double d, r_.Double(v, p));
      if (d != -1) {
        return r_.Error(v, p,
                        "training schedules are not supported (one-shot "
                        "only: null or -1)");
      }
      return true;
    }
    if (e.key == "sequential_targets") {  // Older llm-compressor recipes.
      RETURN_IF_ERROR(SetSequentialTargets(v, p));
      return true;
    }
    return false;
  }

  // QuantizationMixin's fields. True when `e` was one.
  absl::StatusOr<bool> MixinField(const Reader::Entry& e, const std::string& p,
                                  MixinFields& f) {
    const YAML::Node& v = e.value;
    if (e.key == "targets") {
      ASSIGN_OR_RETURN(f.targets, r_.Strings(v, p));
      if (f.targets.empty()) return r_.Error(v, p, "is empty");
    } else if (e.key == "ignore") {
      if (!v.IsNull()) {
        ASSIGN_OR_RETURN(f.ignore, r_.Strings(v, p));
      }
    } else if (e.key == "scheme") {
      f.scheme = v;
    } else if (e.key == "config_groups") {
      f.config_groups = v;
    } else if (e.key == "kv_cache_scheme") {
      if (!v.IsNull()) {
        absl::StatusOr<quantization::QuantizationArgs> args =
            ToKvCacheArgs(util::DumpJson(recipe_yaml_internal::YamlToJson(v)));
        if (!args.ok()) return r_.Error(v, p, args.status().message());
        f.kv_cache_scheme = v;
      }
    } else if (e.key == "input_observer" || e.key == "output_observer") {
      RETURN_IF_ERROR(
          r_.NullOr(v, p, "activation quantization not supported yet"));
    } else if (e.key == "weight_observer") {
      if (!v.IsNull()) {
        ASSIGN_OR_RETURN(std::string obs, r_.String(v, p));
        if (!IsMinMaxObserver(obs)) {
          return r_.Error(
              v, p,
              absl::StrCat("observer ", obs, " not supported yet (minmax is)"));
        }
      }
    } else if (e.key == "observer") {
      if (v.IsNull()) return true;
      ASSIGN_OR_RETURN(std::vector<Reader::Entry> obs, r_.Entries(v, p));
      for (const Reader::Entry& o : obs) {
        const std::string op = Reader::Join(p, o.key);
        ASSIGN_OR_RETURN(std::string name, r_.String(o.value, op));
        if (o.key != "weights" || !IsMinMaxObserver(name)) {
          return r_.Error(o.key_node, op,
                          "not supported yet (only weights: minmax)");
        }
      }
    } else if (e.key == "bypass_divisibility_checks") {
      ASSIGN_OR_RETURN(bool bypass, r_.Bool(v, p));
      if (bypass) {
        return r_.Error(v, p,
                        "true is not supported (group sizes must divide "
                        "every targeted weight's columns)");
      }
    } else {
      return false;
    }
    return true;
  }

  absl::Status ReadModifier(const Reader::Entry& m, const std::string& path) {
    if (m.key == "GPTQModifier" || m.key == "QuantizationModifier") {
      return ReadQuantization(m, path, m.key == "GPTQModifier");
    }
    if (m.key == "SmoothQuantModifier") return ReadSmoothQuant(m, path);
    if (m.key == "AWQModifier") return ReadAwq(m, path);
    return r_.Error(m.key_node, path,
                    absl::StrCat("unsupported modifier ", kRuns));
  }

  // A mapping: [balance layers, smooth layer] (a list, or llm-compressor's
  // !!python/tuple), or {balance_layers: ..., smooth_layers: ...} as its
  // LayerMap names them.
  absl::Status ReadMapping(const YAML::Node& node, const std::string& path,
                           recipe::SmoothQuantModifier::Mapping* out) {
    YAML::Node balance;
    YAML::Node smooth;
    if (node.IsSequence() && node.size() == 2) {
      balance = node[0];
      smooth = node[1];
    } else if (node.IsMap()) {
      ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                       r_.Entries(node, path));
      for (const Reader::Entry& e : entries) {
        if (e.key == "balance_layers") {
          balance = e.value;
        } else if (e.key == "smooth_layers") {
          smooth = e.value;
        } else {
          return r_.Error(e.key_node, Reader::Join(path, e.key),
                          "unsupported field");
        }
      }
      if (!balance.IsDefined() || balance.IsNull() || !smooth.IsDefined() ||
          smooth.IsNull()) {
        return r_.Error(node, path, "needs balance_layers and smooth_layers");
      }
    } else {
      return r_.Error(node, path,
                      "must be [[balance layers...], smooth layer]");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> b,
                     r_.Strings(balance, absl::StrCat(path, "[0]")));
    if (b.empty()) {
      return r_.Error(balance, absl::StrCat(path, "[0]"),
                      "names no balance layers");
    }
    ASSIGN_OR_RETURN(std::string s,
                     r_.String(smooth, absl::StrCat(path, "[1]")));
    for (std::string& layer : b) out->add_balance_layers(std::move(layer));
    out->set_smooth_layer(s);
    return absl::OkStatus();
  }

  absl::Status ReadSmoothQuant(const Reader::Entry& m,
                               const std::string& path) {
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                     r_.Entries(m.value, path));
    recipe::SmoothQuantModifier q;
    for (const Reader::Entry& e : entries) {
      const std::string p = Reader::Join(path, e.key);
      const YAML::Node& v = e.value;
      ASSIGN_OR_RETURN(bool common, CommonField(e, p));
      if (common) continue;
      if (e.key == "smoothing_strength") {
        ASSIGN_OR_RETURN(double a, r_.Double(v, p));
        if (a < 0 || a > 1) {
          return r_.Error(v, p, absl::StrCat("must be in [0, 1], got ", a));
        }
        q.set_smoothing_strength(a);
      } else if (e.key == "mappings") {
        if (v.IsNull()) continue;
        if (!v.IsSequence()) return r_.Error(v, p, "must be a list");
        for (size_t i = 0; i < v.size(); ++i) {
          RETURN_IF_ERROR(ReadMapping(v[i], absl::StrCat(p, "[", i, "]"),
                                      q.add_mappings()));
        }
      } else if (e.key == "ignore") {
        if (v.IsNull()) continue;
        ASSIGN_OR_RETURN(std::vector<std::string> ignore, r_.Strings(v, p));
        for (std::string& i : ignore) q.add_ignore(std::move(i));
      } else if (e.key == "algorithm") {
        ASSIGN_OR_RETURN(std::string algorithm, r_.String(v, p));
        if (algorithm != "smoothquant") {
          return r_.Error(v, p,
                          absl::StrCat("algorithm ", algorithm,
                                       " not supported yet (smoothquant is)"));
        }
      } else if (e.key == "num_calibration_steps") {
        RETURN_IF_ERROR(r_.NullOr(
            v, p, "tracecut smooths with all the calibration data; null"));
      } else if (e.key == "calibration_function") {
        RETURN_IF_ERROR(r_.NullOr(v, p, "only null"));
      } else {
        return r_.Error(e.key_node, p, "unsupported field");
      }
    }
    *out_.add_modifiers()->mutable_smoothquant() = std::move(q);
    return absl::OkStatus();
  }

  // AWQModifier (llmcompressor.modifiers.transform.awq): mappings as
  // AWQMapping fields, duo_scaling true / false / "both", n_grid.
  absl::Status ReadAwq(const Reader::Entry& m, const std::string& path) {
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                     r_.Entries(m.value, path));
    recipe::AwqModifier a;
    for (const Reader::Entry& e : entries) {
      const std::string p = Reader::Join(path, e.key);
      const YAML::Node& v = e.value;
      ASSIGN_OR_RETURN(bool common, CommonField(e, p));
      if (common) continue;
      if (e.key == "duo_scaling") {
        if (v.IsScalar() && v.Scalar() == "both") {
          a.set_duo_scaling(recipe::AwqModifier::BOTH);
        } else {
          absl::StatusOr<bool> duo = r_.Bool(v, p);
          if (!duo.ok()) {
            return r_.Error(v, p, "must be true, false or \"both\"");
          }
          a.set_duo_scaling(*duo ? recipe::AwqModifier::ON
                                 : recipe::AwqModifier::OFF);
        }
      } else if (e.key == "n_grid") {
        ASSIGN_OR_RETURN(int64_t n, r_.Int(v, p));
        if (n < 2 || n > 1000) {
          return r_.Error(v, p, absl::StrCat("must be in [2, 1000], got ", n));
        }
        a.set_n_grid(static_cast<int32_t>(n));
      } else if (e.key == "offload_device") {
        // Where llm-compressor keeps the parent modules' cached inputs;
        // tracecut replays the subgraph from its intermediates cache
        // (recipe `cache`) instead, so any value is accepted.
      } else if (e.key == "mappings") {
        if (v.IsNull()) continue;
        if (!v.IsSequence()) return r_.Error(v, p, "must be a list");
        for (size_t i = 0; i < v.size(); ++i) {
          RETURN_IF_ERROR(ReadAwqMapping(v[i], absl::StrCat(p, "[", i, "]"),
                                         a.add_mappings()));
        }
      } else {
        return r_.Error(e.key_node, p, "unsupported field");
      }
    }
    *out_.add_modifiers()->mutable_awq() = std::move(a);
    return absl::OkStatus();
  }

  absl::Status ReadAwqMapping(const YAML::Node& node, const std::string& path,
                              recipe::AwqModifier::Mapping* out) {
    if (!node.IsMap()) {
      return r_.Error(node, path, "must be {smooth_layer, balance_layers}");
    }
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                     r_.Entries(node, path));
    for (const Reader::Entry& e : entries) {
      const std::string p = Reader::Join(path, e.key);
      if (e.key == "smooth_layer") {
        ASSIGN_OR_RETURN(std::string smooth, r_.String(e.value, p));
        out->set_smooth_layer(smooth);
      } else if (e.key == "balance_layers") {
        ASSIGN_OR_RETURN(std::vector<std::string> b, r_.Strings(e.value, p));
        for (std::string& layer : b) out->add_balance_layers(std::move(layer));
      } else if (e.key == "activation_hook_target") {
        RETURN_IF_ERROR(
            r_.NullOr(e.value, p,
                      "only null (the first balance layer's input is what is "
                      "measured)"));
      } else {
        return r_.Error(e.key_node, p, "unsupported field");
      }
    }
    if (out->smooth_layer().empty() || out->balance_layers().empty()) {
      return r_.Error(node, path, "needs smooth_layer and balance_layers");
    }
    return absl::OkStatus();
  }

  absl::Status ReadQuantization(const Reader::Entry& m, const std::string& path,
                                bool gptq) {
    ASSIGN_OR_RETURN(std::vector<Reader::Entry> entries,
                     r_.Entries(m.value, path));
    MixinFields f;
    f.at = m.key_node.Mark();
    ActOrder actorder = ActOrder::kDefault;
    YAML::Mark actorder_at;
    recipe::GptqModifier defaults;
    double dampening_frac = defaults.dampening_frac();
    int64_t block_size = defaults.block_size();
    for (const Reader::Entry& e : entries) {
      const std::string p = Reader::Join(path, e.key);
      const YAML::Node& v = e.value;
      ASSIGN_OR_RETURN(bool common, CommonField(e, p));
      if (common) continue;
      ASSIGN_OR_RETURN(bool mixin, MixinField(e, p, f));
      if (mixin) continue;
      if (gptq && e.key == "block_size") {
        ASSIGN_OR_RETURN(block_size, r_.Int(v, p));
        if (block_size <= 0) {
          return r_.Error(v, p, absl::StrCat("must be > 0, got ", block_size));
        }
      } else if (gptq && e.key == "dampening_frac") {
        ASSIGN_OR_RETURN(dampening_frac, r_.Double(v, p));
        if (dampening_frac < 0) {
          return r_.Error(v, p,
                          absl::StrCat("must be >= 0, got ", dampening_frac));
        }
      } else if (gptq && e.key == "actorder") {
        ASSIGN_OR_RETURN(std::optional<bool> a, ParseActOrderValue(r_, v, p));
        actorder = *a ? ActOrder::kWeight : ActOrder::kNone;
        actorder_at = v.Mark();
      } else if (gptq && e.key == "batched_quantization") {
        // How many same-shape modules llm-compressor solves at once: a
        // question of speed, not of the result.
        if (!v.IsNull() && !(v.IsScalar() && v.Scalar() == "auto")) {
          ASSIGN_OR_RETURN(int64_t n, r_.Int(v, p));
          if (n <= 0) return r_.Error(v, p, "must be auto, null or > 0");
        }
      } else {
        return r_.Error(e.key_node, p, "unsupported field");
      }
    }
    ASSIGN_OR_RETURN(std::vector<Group> groups, ResolveGroups(r_, f, path));
    for (Group& g : groups) {
      recipe::Modifier* out = out_.add_modifiers();
      // The KV cache is calibrated once, by the first group's modifier.
      const std::string kv =
          !f.kv_cache_scheme.IsNull() && &g == &groups[0]
              ? util::DumpJson(
                    recipe_yaml_internal::YamlToJson(f.kv_cache_scheme))
              : "";
      if (!gptq) {
        // Round-to-nearest ignores column order, so a weights actorder
        // changes nothing here.
        recipe::RtnModifier* rtn = out->mutable_rtn();
        *rtn->mutable_scheme() = g.scheme;
        for (const std::string& t : g.targets) rtn->add_targets(t);
        for (const std::string& t : f.ignore) rtn->add_ignore(t);
        if (!kv.empty()) rtn->set_kv_cache_scheme(kv);
        continue;
      }
      // GPTQModifier.resolve_quantization_config's resolve_actorder.
      bool act = false;
      switch (actorder) {
        case ActOrder::kDefault:
          act = g.actorder.value_or(true);
          break;
        case ActOrder::kNone:
        case ActOrder::kWeight:
          act = actorder == ActOrder::kWeight;
          if (g.actorder.has_value() && *g.actorder != act) {
            return r_.Error(actorder_at, Reader::Join(path, "actorder"),
                            "differs from the actorder of the scheme's "
                            "weights; give it in one place");
          }
          break;
      }
      recipe::GptqModifier* q = out->mutable_gptq();
      *q->mutable_scheme() = g.scheme;
      for (const std::string& t : g.targets) q->add_targets(t);
      for (const std::string& t : f.ignore) q->add_ignore(t);
      q->set_dampening_frac(dampening_frac);
      q->set_block_size(block_size);
      if (!kv.empty()) q->set_kv_cache_scheme(kv);
      if (IsTypedScheme(g.scheme)) {
        // Groups are always static; unset keeps llm-compressor's default
        // ("static", or the scheme's own actorder).
        if (actorder != ActOrder::kDefault) q->set_actorder(act);
        continue;
      }
      q->set_actorder(act);
      // "weight": groups fixed from the original column order.
      q->set_static_groups(act && g.scheme.group_size() > 0);
    }
    return absl::OkStatus();
  }

  Reader r_;
  recipe::Recipe out_;
};

}  // namespace

absl::StatusOr<recipe::Recipe> ParseRecipeYaml(absl::string_view text,
                                               absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    std::string where(source);
    if (!e.mark.is_null()) {
      absl::StrAppend(&where, ":", e.mark.line + 1, ":", e.mark.column + 1);
    }
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not YAML: ", e.msg));
  }
  absl::StatusOr<recipe::Recipe> r;
  try {
    r = RecipeReader(source).Read(root);
  } catch (const YAML::Exception& e) {
    // Conversions are checked before they are made; this is a backstop.
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  if (!r.ok()) return r.status();
  RETURN_IF_ERROR(ValidateRecipe(*r, source));
  return r;
}

bool IsYamlRecipePath(absl::string_view path) {
  return absl::EndsWithIgnoreCase(path, ".yaml") ||
         absl::EndsWithIgnoreCase(path, ".yml");
}

absl::StatusOr<recipe::Recipe> LoadRecipeFile(const std::string& path) {
  if (!IsYamlRecipePath(path)) return LoadRecipe(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read recipe ", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading recipe ", path));
  }
  return ParseRecipeYaml(text.str(), path);
}

}  // namespace tracecut::pipelines
