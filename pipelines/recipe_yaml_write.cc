// Writing a recipe as llm-compressor's recipe.yaml (RecipeToYaml in
// recipe_yaml.h); reading it is recipe_yaml.cc's.

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pipelines/recipe.h"
#include "pipelines/recipe.pb.h"
#include "pipelines/recipe_yaml.h"
#include "pipelines/recipe_yaml_internal.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::IsTypedScheme;
namespace {

using recipe_yaml_internal::PresetOf;

// The shortest text that reads back as `d`, with a '.' so that YAML 1.1
// readers (PyYAML) take an exponent form as a float.
std::string DoubleText(double d) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, end);
  if (s.find_first_of(".eEn") == std::string::npos) {
    s += ".0";
  } else if (s.find('.') == std::string::npos) {
    size_t e = s.find_first_of("eE");
    if (e != std::string::npos) s.insert(e, ".0");
  }
  return s;
}

template <typename Strings>
void EmitList(YAML::Emitter& out, const Strings& items) {
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto& s : items) out << std::string(s);
  out << YAML::EndSeq;
}

void EmitWeights(YAML::Emitter& out, const recipe::QuantizationScheme& s) {
  out << YAML::BeginMap;
  out << YAML::Key << "num_bits" << YAML::Value << s.bits();
  out << YAML::Key << "type" << YAML::Value << "int";
  out << YAML::Key << "symmetric" << YAML::Value << s.symmetric();
  if (s.per_tensor()) {
    out << YAML::Key << "strategy" << YAML::Value << "tensor";
  } else if (s.group_size() > 0) {
    out << YAML::Key << "strategy" << YAML::Value << "group";
    out << YAML::Key << "group_size" << YAML::Value << s.group_size();
  } else {
    out << YAML::Key << "strategy" << YAML::Value << "channel";
  }
  out << YAML::EndMap;
}

// A JSON value as YAML (compressed-tensors' scheme fields).
void EmitJson(YAML::Emitter& out, const util::Json& j) {
  if (j.is_null()) {
    out << YAML::Null;
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else if (j.is_number()) {
    out << DoubleText(j.get<double>());
  } else if (j.is_string()) {
    out << j.get<std::string>();
  } else if (j.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const util::Json& e : j) EmitJson(out, e);
    out << YAML::EndSeq;
  } else {
    out << YAML::BeginMap;
    for (const auto& [key, value] : j.items()) {
      out << YAML::Key << key << YAML::Value;
      EmitJson(out, value);
    }
    out << YAML::EndMap;
  }
}

// targets and ignore, then `scheme: PRESET` or config_groups.
template <typename M>
void EmitQuantFields(YAML::Emitter& out, const M& m) {
  const std::optional<std::string> preset = PresetOf(m.scheme());
  out << YAML::Key << "targets" << YAML::Value;
  EmitList(out, m.targets());
  out << YAML::Key << "ignore" << YAML::Value;
  EmitList(out, m.ignore());
  if (m.has_kv_cache_scheme()) {
    // Validated (ValidateRecipe), so it parses.
    absl::StatusOr<util::Json> kv =
        util::ParseJson(m.kv_cache_scheme(), "kv_cache_scheme");
    if (kv.ok()) {
      out << YAML::Key << "kv_cache_scheme" << YAML::Value;
      EmitJson(out, *kv);
    }
  }
  if (preset.has_value()) {
    out << YAML::Key << "scheme" << YAML::Value << *preset;
    return;
  }
  out << YAML::Key << "config_groups" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "group_0" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "targets" << YAML::Value;
  EmitList(out, m.targets());
  if (m.scheme().has_json()) {
    // Validated (ValidateRecipe), so it parses.
    absl::StatusOr<util::Json> j = util::ParseJson(m.scheme().json(), "json");
    if (j.ok()) {
      for (const auto& [key, value] : j->items()) {
        if (key == "targets") continue;
        out << YAML::Key << key << YAML::Value;
        EmitJson(out, value);
      }
    }
  } else {
    out << YAML::Key << "weights" << YAML::Value;
    EmitWeights(out, m.scheme());
  }
  out << YAML::EndMap << YAML::EndMap;
}

const char* PipelineName(recipe::Recipe::Pipeline p) {
  switch (p) {
    case recipe::Recipe::LAYER_SEQUENTIAL:
      return "layer_sequential";
    case recipe::Recipe::BASIC:
      return "basic";
    default:
      return "sequential";
  }
}

}  // namespace

absl::StatusOr<std::string> RecipeToYaml(const recipe::Recipe& recipe) {
  RETURN_IF_ERROR(ValidateRecipe(recipe, "recipe"));
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetNullFormat(YAML::LowerNull);
  out.SetBoolFormat(YAML::TrueFalseBool);
  out << YAML::BeginMap;
  out << YAML::Key << "default_stage" << YAML::Value << YAML::BeginMap;
  // A group holds one modifier of each type (a YAML mapping): a repeated
  // type opens the next group, which llm-compressor runs after it.
  std::set<std::string> in_group;
  int groups = 0;
  for (int i = 0; i < recipe.modifiers_size(); ++i) {
    const recipe::Modifier& m = recipe.modifiers(i);
    const char* type = m.has_gptq()          ? "GPTQModifier"
                       : m.has_rtn()         ? "QuantizationModifier"
                       : m.has_smoothquant() ? "SmoothQuantModifier"
                       : m.has_awq()         ? "AWQModifier"
                                             : nullptr;
    if (type == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("recipe: modifiers[", i,
                       "] (an observer) has no llm-compressor recipe form"));
    }
    if (m.has_awq() && m.awq().has_scheme()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recipe: modifiers[", i,
          "].awq has a scheme of its own, which has no llm-compressor form "
          "(its AWQModifier takes the scheme of a quantizer after it)"));
    }
    if (m.has_gptq() && m.gptq().actorder() && !m.gptq().static_groups() &&
        m.gptq().scheme().group_size() > 0 && !m.gptq().scheme().per_tensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recipe: modifiers[", i,
          "].gptq: act order with dynamic groups has no llm-compressor form "
          "(its actorder \"group\" was removed); set static_groups: true"));
    }
    if (groups == 0 || in_group.contains(type)) {
      if (groups > 0) out << YAML::EndMap;
      out << YAML::Key
          << (groups == 0 ? std::string("default_modifiers")
                          : absl::StrCat("default_", groups, "_modifiers"))
          << YAML::Value << YAML::BeginMap;
      in_group.clear();
      ++groups;
    }
    in_group.insert(type);
    out << YAML::Key << type << YAML::Value << YAML::BeginMap;
    if (m.has_gptq()) {
      const recipe::GptqModifier& g = m.gptq();
      EmitQuantFields(out, g);
      out << YAML::Key << "block_size" << YAML::Value << g.block_size();
      out << YAML::Key << "dampening_frac" << YAML::Value
          << DoubleText(g.dampening_frac());
      // Explicit either way: llm-compressor's default is "static" (which
      // a compressed-tensors scheme without the field keeps).
      if (!IsTypedScheme(g.scheme()) || g.has_actorder()) {
        out << YAML::Key << "actorder" << YAML::Value;
        if (g.actorder()) {
          out << "weight";
        } else {
          out << YAML::Null;
        }
      }
    } else if (m.has_rtn()) {
      EmitQuantFields(out, m.rtn());
    } else if (m.has_awq()) {
      const recipe::AwqModifier& a = m.awq();
      out << YAML::Key << "duo_scaling" << YAML::Value;
      if (a.duo_scaling() == recipe::AwqModifier::BOTH) {
        out << "both";
      } else {
        out << (a.duo_scaling() != recipe::AwqModifier::OFF);
      }
      out << YAML::Key << "n_grid" << YAML::Value << a.n_grid();
      if (!a.mappings().empty()) {
        out << YAML::Key << "mappings" << YAML::Value << YAML::BeginSeq;
        for (const recipe::AwqModifier::Mapping& mapping : a.mappings()) {
          out << YAML::Flow << YAML::BeginMap;
          out << YAML::Key << "smooth_layer" << YAML::Value
              << mapping.smooth_layer();
          out << YAML::Key << "balance_layers" << YAML::Value;
          EmitList(out, mapping.balance_layers());
          out << YAML::EndMap;
        }
        out << YAML::EndSeq;
      }
    } else {
      const recipe::SmoothQuantModifier& q = m.smoothquant();
      out << YAML::Key << "smoothing_strength" << YAML::Value
          << DoubleText(q.smoothing_strength());
      if (!q.mappings().empty()) {
        out << YAML::Key << "mappings" << YAML::Value << YAML::BeginSeq;
        for (const recipe::SmoothQuantModifier::Mapping& mapping :
             q.mappings()) {
          out << YAML::Flow << YAML::BeginSeq;
          EmitList(out, mapping.balance_layers());
          out << mapping.smooth_layer() << YAML::EndSeq;
        }
        out << YAML::EndSeq;
      }
      if (!q.ignore().empty()) {
        out << YAML::Key << "ignore" << YAML::Value;
        EmitList(out, q.ignore());
      }
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;  // The last group.
  out << YAML::EndMap;  // The stage.
  // oneshot's arguments for what tracecut's recipe says about the pipeline.
  out << YAML::Key << "args" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "pipeline" << YAML::Value
      << PipelineName(recipe.pipeline());
  if (!recipe.sequential_targets().empty()) {
    out << YAML::Key << "sequential_targets" << YAML::Value;
    EmitList(out, recipe.sequential_targets());
  }
  out << YAML::Key << "propagate_error" << YAML::Value
      << recipe.propagate_error();
  if (recipe.has_calibrate_all_experts()) {
    out << YAML::Key << "moe_calibrate_all_experts" << YAML::Value
        << recipe.calibrate_all_experts();
  }
  if (recipe.has_expert_modules()) {
    out << YAML::Key << "expert_modules" << YAML::Value
        << recipe.expert_modules();
  }
  out << YAML::EndMap;
  out << YAML::EndMap;
  if (!out.good()) {
    return absl::InternalError(
        absl::StrCat("writing recipe.yaml: ", out.GetLastError()));
  }
  return std::string(out.c_str()) + "\n";
}

}  // namespace tracecut::pipelines
