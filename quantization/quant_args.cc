#include "quantization/quant_args.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

using util::Json;

absl::Status FieldError(absl::string_view field, absl::string_view sub,
                        absl::string_view message) {
  return absl::InvalidArgumentError(
      sub.empty() ? absl::StrCat(field, ": ", message)
                  : absl::StrCat(field, ".", sub, ": ", message));
}

struct DtypeName {
  const char* name;
  c10::ScalarType dtype;
};
// Names torch accepts (getattr(torch, name)) for the dtypes a scheme can use.
constexpr std::array<DtypeName, 13> kDtypes = {{
    {"float8_e4m3fn", c10::ScalarType::Float8_e4m3fn},
    {"float8_e5m2", c10::ScalarType::Float8_e5m2},
    {"uint8", c10::ScalarType::Byte},
    {"int8", c10::ScalarType::Char},
    {"int16", c10::ScalarType::Short},
    {"int32", c10::ScalarType::Int},
    {"bfloat16", c10::ScalarType::BFloat16},
    {"float16", c10::ScalarType::Half},
    {"float32", c10::ScalarType::Float},
    {"float64", c10::ScalarType::Double},
    {"half", c10::ScalarType::Half},
    {"float", c10::ScalarType::Float},
    {"double", c10::ScalarType::Double},
}};

constexpr std::array<std::pair<const char*, Strategy>, 7> kStrategies = {{
    {"tensor", Strategy::kTensor},
    {"channel", Strategy::kChannel},
    {"group", Strategy::kGroup},
    {"block", Strategy::kBlock},
    {"token", Strategy::kToken},
    {"tensor_group", Strategy::kTensorGroup},
    {"attn_head", Strategy::kAttnHead},
}};

constexpr std::array<const char*, 5> kObservers = {
    "minmax", "static_minmax", "memoryless_minmax", "mse", "memoryless_mse"};

absl::StatusOr<c10::ScalarType> ParseDtype(const Json& j,
                                           absl::string_view field) {
  if (!j.is_string()) {
    return FieldError(
        field, "",
        absl::StrCat("expected a dtype name, got ", util::JsonTypeName(j)));
  }
  absl::string_view name = j.get_ref<const std::string&>();
  absl::ConsumePrefix(&name, "torch.");
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  return FieldError(field, "",
                    absl::StrCat("no such torch dtype `torch.", name, "`"));
}

absl::StatusOr<std::string> GetString(const Json& j, absl::string_view field) {
  if (!j.is_string()) {
    return FieldError(
        field, "",
        absl::StrCat("expected a string, got ", util::JsonTypeName(j)));
  }
  return j.get<std::string>();
}

absl::StatusOr<int64_t> GetInt(const Json& j, absl::string_view field) {
  if (!j.is_number_integer()) {
    return FieldError(
        field, "",
        absl::StrCat("expected an integer, got ", util::JsonTypeName(j)));
  }
  return j.get<int64_t>();
}

absl::Status CheckObject(const Json& j, absl::string_view field,
                         const std::vector<absl::string_view>& known,
                         const std::vector<absl::string_view>& ignored = {}) {
  if (!j.is_object()) {
    return FieldError(
        field, "",
        absl::StrCat("expected an object, got ", util::JsonTypeName(j)));
  }
  for (const auto& [key, value] : j.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end() &&
        std::find(ignored.begin(), ignored.end(), key) == ignored.end()) {
      return FieldError(field, key,
                        absl::StrCat("unknown field (known: ",
                                     absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<QuantizationArgs>> OptionalArgs(
    const Json& parent, absl::string_view key, absl::string_view field) {
  const Json* j = util::FindMember(parent, key);
  if (j == nullptr || j->is_null()) return std::optional<QuantizationArgs>();
  ASSIGN_OR_RETURN(
      QuantizationArgs args,
      QuantizationArgs::FromJson(*j, absl::StrCat(field, ".", key)));
  return std::optional<QuantizationArgs>(std::move(args));
}

Json OptionalArgsJson(const std::optional<QuantizationArgs>& args) {
  return args.has_value() ? args->ToJson() : Json(nullptr);
}

}  // namespace

absl::string_view QuantTypeName(QuantType t) {
  return t == QuantType::kInt ? "int" : "float";
}

absl::string_view StrategyName(Strategy s) {
  for (const auto& [name, strategy] : kStrategies) {
    if (strategy == s) return name;
  }
  return "?";
}

absl::string_view ActOrderName(ActOrder a) {
  switch (a) {
    case ActOrder::kNone:
      return "";
    case ActOrder::kWeight:
      return "weight";
    case ActOrder::kStatic:
      return "static";
  }
  return "";
}

std::string TorchDtypeName(c10::ScalarType dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return absl::StrCat("torch.", d.name);
  }
  return absl::StrCat("torch.", c10::toString(dtype));
}

Strategy QuantizationArgs::resolved_strategy() const {
  if (strategy.has_value()) return *strategy;
  if (group_size.has_value() && *group_size > 0) return Strategy::kGroup;
  if (group_size.has_value() && *group_size == -1) return Strategy::kChannel;
  return Strategy::kTensor;
}

bool QuantizationArgs::is_mx() const {
  return type == QuantType::kFloat && (num_bits == 4 || num_bits == 8) &&
         group_size == 32 && scale_dtype == c10::ScalarType::Byte;
}

c10::ScalarType QuantizationArgs::storage_dtype() const {
  if (type == QuantType::kFloat) {
    return num_bits == 8 ? c10::ScalarType::Float8_e4m3fn
                         : c10::ScalarType::Undefined;
  }
  if (num_bits <= 8) return c10::ScalarType::Char;
  if (num_bits <= 16) return c10::ScalarType::Short;
  return c10::ScalarType::Int;
}

absl::Status QuantizationArgs::Resolve(absl::string_view field) {
  // compressed-tensors' own field and model validators, in its order.
  if (group_size.has_value() && *group_size < -1) {
    return FieldError(field, "group_size",
                      absl::StrCat("invalid group size ", *group_size,
                                   "; use > 0 for strategy group and -1 for "
                                   "channel"));
  }
  if (block_structure.has_value() &&
      (block_structure->size() != 2 || (*block_structure)[0] <= 0 ||
       (*block_structure)[1] <= 0)) {
    return FieldError(field, "block_structure",
                      absl::StrCat("must be two positive ints [rows, cols], "
                                   "got [",
                                   absl::StrJoin(*block_structure, ", "), "]"));
  }
  if (!strategy.has_value()) {
    if (group_size.has_value() && *group_size == 0) {
      return FieldError(field, "group_size",
                        "invalid group size 0; use > 0 for strategy group and "
                        "-1 for channel");
    }
    strategy = resolved_strategy();
  }
  const Strategy s = *strategy;
  if (s == Strategy::kToken && dynamic == Dynamic::kStatic) {
    return FieldError(field, "dynamic",
                      "static token quantization is impossible; use dynamic: "
                      "true");
  }
  if ((s == Strategy::kGroup || s == Strategy::kTensorGroup) &&
      (!group_size.has_value() || *group_size <= 0)) {
    return FieldError(field, "group_size",
                      absl::StrCat("strategy ", StrategyName(s),
                                   " requires a positive group_size"));
  }
  if (group_size.has_value() && *group_size > 0 && s != Strategy::kGroup &&
      s != Strategy::kTensorGroup) {
    return FieldError(field, "group_size",
                      absl::StrCat("group_size ", *group_size,
                                   " requires strategy group or tensor_group, "
                                   "got ",
                                   StrategyName(s)));
  }
  if (s == Strategy::kBlock && !block_structure.has_value()) {
    return FieldError(field, "block_structure",
                      "strategy block requires a block_structure");
  }
  if (s != Strategy::kBlock && block_structure.has_value()) {
    return FieldError(field, "block_structure",
                      absl::StrCat("block_structure requires strategy block, "
                                   "got ",
                                   StrategyName(s)));
  }
  if (dynamic != Dynamic::kStatic &&
      !(s == Strategy::kToken || s == Strategy::kTensor ||
        s == Strategy::kTensorGroup || s == Strategy::kGroup)) {
    return FieldError(field, "dynamic",
                      absl::StrCat("dynamic quantization needs strategy "
                                   "token, tensor, tensor_group or group, got ",
                                   StrategyName(s)));
  }
  if (dynamic == Dynamic::kLocal && s != Strategy::kTensorGroup) {
    return FieldError(field, "dynamic",
                      "\"local\" is only supported for strategy tensor_group");
  }

  // What tracecut computes and stores (Note [What tracecut refuses]).
  if (type == QuantType::kInt && (num_bits < 2 || num_bits > 8)) {
    return FieldError(
        field, "num_bits",
        absl::StrCat("int quantization needs 2..8 bits, got ", num_bits));
  }
  if (type == QuantType::kFloat && num_bits != 4 && num_bits != 8) {
    return FieldError(field, "num_bits",
                      absl::StrCat("float quantization is 4-bit (e2m1) or "
                                   "8-bit (e4m3), got ",
                                   num_bits));
  }
  if (type == QuantType::kFloat && !symmetric) {
    return FieldError(field, "symmetric",
                      absl::StrCat("float", num_bits,
                                   " must be symmetric (no kernel reads a "
                                   "float zero point)"));
  }
  if (scale_dtype.has_value()) {
    const c10::ScalarType d = *scale_dtype;
    const bool float_scale =
        d == c10::ScalarType::Float8_e4m3fn || d == c10::ScalarType::BFloat16 ||
        d == c10::ScalarType::Half || d == c10::ScalarType::Float ||
        d == c10::ScalarType::Double;
    if (d == c10::ScalarType::Byte ? !is_mx() : !float_scale) {
      return FieldError(
          field, "scale_dtype",
          absl::StrCat(TorchDtypeName(d),
                       d == c10::ScalarType::Byte
                           ? " (e8m0) scales are for MX formats only: float "
                             "4/8-bit with group_size 32"
                           : " is not a scale dtype (float8_e4m3fn, "
                             "bfloat16, float16, float32, float64, or uint8 "
                             "for MX)"));
    }
  }
  if (is_fp4()) {
    const bool nvfp4 = s == Strategy::kTensorGroup && group_size == 16 &&
                       scale_dtype == c10::ScalarType::Float8_e4m3fn;
    const bool mxfp4 = s == Strategy::kGroup && is_mx();
    if (!nvfp4 && !mxfp4) {
      absl::string_view bad =
          group_size != 16 && group_size != 32 ? "group_size"
          : (s != Strategy::kTensorGroup && s != Strategy::kGroup)
              ? "strategy"
              : "scale_dtype";
      return FieldError(
          field, bad,
          absl::StrCat(
              "float 4-bit is NVFP4 (strategy tensor_group, "
              "group_size 16, scale_dtype float8_e4m3fn) or MXFP4 "
              "(strategy group, group_size 32, scale_dtype uint8); "
              "got strategy ",
              StrategyName(s), ", group_size ",
              group_size.has_value() ? absl::StrCat(*group_size) : "null",
              ", scale_dtype ",
              scale_dtype.has_value() ? TorchDtypeName(*scale_dtype) : "null"));
    }
  }
  if (observer.has_value() && std::find(kObservers.begin(), kObservers.end(),
                                        *observer) == kObservers.end()) {
    return FieldError(
        field, "observer",
        absl::StrCat("unknown observer \"", *observer,
                     "\" (known: ", absl::StrJoin(kObservers, ", "), ")"));
  }
  if (!observer_kwargs.is_object()) {
    return FieldError(field, "observer_kwargs", "expected an object");
  }
  if (!zp_dtype.has_value()) {
    // compressed-tensors defaults to float8 for float 4-bit, else to the
    // storage dtype; its MX presets say uint8, which a symmetric JSON dump
    // does not carry: MX args get uint8 either way (the zero point of a
    // symmetric scheme is 0 and never stored).
    zp_dtype = is_mx()    ? c10::ScalarType::Byte
               : is_fp4() ? c10::ScalarType::Float8_e4m3fn
                          : storage_dtype();
  }
  return absl::OkStatus();
}

std::string QuantizationArgs::ToString() const {
  const Strategy s = resolved_strategy();
  std::string granularity(StrategyName(s));
  if (group_size.has_value() && *group_size > 0) {
    absl::StrAppend(&granularity, *group_size);
  }
  if (block_structure.has_value()) {
    absl::StrAppend(&granularity, absl::StrJoin(*block_structure, "x"));
  }
  std::string text = absl::StrCat(QuantTypeName(type), num_bits, " ",
                                  symmetric ? "sym" : "asym", " ", granularity);
  if (dynamic == Dynamic::kDynamic) absl::StrAppend(&text, " dynamic");
  if (dynamic == Dynamic::kLocal) absl::StrAppend(&text, " dynamic-local");
  return text;
}

Json QuantizationArgs::ToJson() const {
  Json j = Json::object();
  j["num_bits"] = num_bits;
  j["type"] = std::string(QuantTypeName(type));
  j["symmetric"] = symmetric;
  j["group_size"] = group_size.has_value() ? Json(*group_size) : Json(nullptr);
  j["strategy"] = strategy.has_value()
                      ? Json(std::string(StrategyName(*strategy)))
                      : Json(nullptr);
  j["block_structure"] =
      block_structure.has_value() ? Json(*block_structure) : Json(nullptr);
  switch (dynamic) {
    case Dynamic::kStatic:
      j["dynamic"] = false;
      break;
    case Dynamic::kDynamic:
      j["dynamic"] = true;
      break;
    case Dynamic::kLocal:
      j["dynamic"] = "local";
      break;
  }
  j["actorder"] = actorder == ActOrder::kNone
                      ? Json(nullptr)
                      : Json(std::string(ActOrderName(actorder)));
  j["scale_dtype"] = scale_dtype.has_value()
                         ? Json(TorchDtypeName(*scale_dtype))
                         : Json(nullptr);
  // compressed-tensors serializes zp_dtype only for asymmetric args.
  j["zp_dtype"] = !symmetric && zp_dtype.has_value()
                      ? Json(TorchDtypeName(*zp_dtype))
                      : Json(nullptr);
  j["observer"] = observer.has_value() ? Json(*observer) : Json(nullptr);
  j["observer_kwargs"] = observer_kwargs;
  return j;
}

absl::StatusOr<QuantizationArgs> QuantizationArgs::FromJson(
    const Json& j, absl::string_view field) {
  RETURN_IF_ERROR(
      CheckObject(j, field,
                  {"num_bits", "type", "symmetric", "group_size", "strategy",
                   "block_structure", "dynamic", "actorder", "scale_dtype",
                   "zp_dtype", "observer", "observer_kwargs"}));
  QuantizationArgs args;
  auto sub = [&](absl::string_view key) {
    return absl::StrCat(field, ".", key);
  };
  for (const auto& [key, value] : j.items()) {
    const std::string where = sub(key);
    if (key == "num_bits") {
      ASSIGN_OR_RETURN(int64_t bits, GetInt(value, where));
      if (bits < 1 || bits > 64) {
        return FieldError(where, "", absl::StrCat("invalid bits ", bits));
      }
      args.num_bits = static_cast<int>(bits);
    } else if (key == "type") {
      ASSIGN_OR_RETURN(std::string t, GetString(value, where));
      t = absl::AsciiStrToLower(t);
      if (t != "int" && t != "float") {
        return FieldError(
            where, "",
            absl::StrCat("expected \"int\" or \"float\", got \"", t, "\""));
      }
      args.type = t == "int" ? QuantType::kInt : QuantType::kFloat;
    } else if (key == "symmetric") {
      if (!value.is_boolean()) {
        return FieldError(where, "", "expected true or false");
      }
      args.symmetric = value.get<bool>();
    } else if (key == "group_size") {
      if (!value.is_null()) {
        ASSIGN_OR_RETURN(args.group_size, GetInt(value, where));
      }
    } else if (key == "strategy") {
      if (!value.is_null()) {
        ASSIGN_OR_RETURN(std::string name, GetString(value, where));
        name = absl::AsciiStrToLower(name);
        bool found = false;
        for (const auto& [n, s] : kStrategies) {
          if (name == n) {
            args.strategy = s;
            found = true;
          }
        }
        if (!found) {
          return FieldError(where, "",
                            absl::StrCat("unknown strategy \"", name,
                                         "\" (tensor, channel, group, block, "
                                         "token, tensor_group, attn_head)"));
        }
      }
    } else if (key == "block_structure") {
      if (value.is_string()) {  // Older "128x128" form.
        std::vector<int64_t> dims;
        for (absl::string_view part :
             absl::StrSplit(value.get_ref<const std::string&>(), 'x')) {
          int64_t d = 0;
          if (!absl::SimpleAtoi(part, &d)) {
            return FieldError(where, "",
                              absl::StrCat("invalid block_structure \"",
                                           value.get<std::string>(), "\""));
          }
          dims.push_back(d);
        }
        args.block_structure = dims;
      } else if (value.is_array()) {
        std::vector<int64_t> dims;
        for (const Json& d : value) {
          ASSIGN_OR_RETURN(int64_t v, GetInt(d, where));
          dims.push_back(v);
        }
        args.block_structure = dims;
      } else if (!value.is_null()) {
        return FieldError(where, "", "expected [rows, cols]");
      }
    } else if (key == "dynamic") {
      if (value.is_boolean()) {
        args.dynamic = value.get<bool>() ? Dynamic::kDynamic : Dynamic::kStatic;
      } else if (value.is_string() &&
                 absl::AsciiStrToLower(value.get<std::string>()) == "local") {
        args.dynamic = Dynamic::kLocal;
      } else {
        return FieldError(where, "", "expected true, false or \"local\"");
      }
    } else if (key == "actorder") {
      if (value.is_null() || (value.is_boolean() && !value.get<bool>())) {
        args.actorder = ActOrder::kNone;
      } else if (value.is_boolean()) {
        return FieldError(where, "",
                          "actorder true (group ordering) was removed from "
                          "compressed-tensors; use \"weight\"");
      } else if (value.is_string()) {
        const std::string a = absl::AsciiStrToLower(value.get<std::string>());
        if (a == "weight") {
          args.actorder = ActOrder::kWeight;
        } else if (a == "static") {
          args.actorder = ActOrder::kStatic;
        } else {
          return FieldError(where, "",
                            absl::StrCat("actorder \"", a,
                                         "\" is not supported; use \"weight\" "
                                         "(alias \"static\") or null"));
        }
      } else {
        return FieldError(where, "", "expected null, \"weight\" or \"static\"");
      }
    } else if (key == "scale_dtype") {
      if (!value.is_null()) {
        ASSIGN_OR_RETURN(args.scale_dtype, ParseDtype(value, where));
      }
    } else if (key == "zp_dtype") {
      if (!value.is_null()) {
        ASSIGN_OR_RETURN(args.zp_dtype, ParseDtype(value, where));
      }
    } else if (key == "observer") {
      if (!value.is_null()) {
        ASSIGN_OR_RETURN(args.observer, GetString(value, where));
      }
    } else if (key == "observer_kwargs") {
      if (!value.is_object()) {
        return FieldError(where, "", "expected an object");
      }
      args.observer_kwargs = value;
    }
  }
  RETURN_IF_ERROR(args.Resolve(field));
  return args;
}

bool QuantizationArgs::operator==(const QuantizationArgs& o) const {
  return num_bits == o.num_bits && type == o.type && symmetric == o.symmetric &&
         group_size == o.group_size && strategy == o.strategy &&
         block_structure == o.block_structure && dynamic == o.dynamic &&
         actorder == o.actorder && scale_dtype == o.scale_dtype &&
         zp_dtype == o.zp_dtype && observer == o.observer &&
         observer_kwargs == o.observer_kwargs;
}

absl::Status QuantizationScheme::Resolve(absl::string_view field) {
  if (weights.has_value()) {
    const std::string where = absl::StrCat(field, ".weights");
    RETURN_IF_ERROR(weights->Resolve(where));
    if (weights->dynamic != Dynamic::kStatic) {
      return FieldError(where, "dynamic",
                        "weights are quantized statically (dynamic: false)");
    }
    const Strategy s = *weights->strategy;
    if (s == Strategy::kToken || s == Strategy::kAttnHead) {
      return FieldError(where, "strategy",
                        absl::StrCat(StrategyName(s),
                                     " applies to activations, not weights"));
    }
  }
  if (input_activations.has_value()) {
    const std::string where = absl::StrCat(field, ".input_activations");
    RETURN_IF_ERROR(input_activations->Resolve(where));
    const Strategy s = *input_activations->strategy;
    if (s == Strategy::kChannel || s == Strategy::kBlock) {
      return FieldError(where, "strategy",
                        absl::StrCat(StrategyName(s),
                                     " is not supported for activation "
                                     "quantization"));
    }
    if (input_activations->actorder != ActOrder::kNone) {
      return FieldError(where, "actorder",
                        "cannot apply actorder to input activations");
    }
  }
  if (output_activations.has_value()) {
    const std::string where = absl::StrCat(field, ".output_activations");
    RETURN_IF_ERROR(output_activations->Resolve(where));
    if (output_activations->actorder != ActOrder::kNone) {
      return FieldError(where, "actorder",
                        "cannot apply actorder to output activations");
    }
  }
  if (format == "mixed-precision") {
    return FieldError(field, "format",
                      "mixed-precision is a checkpoint format, not a scheme's");
  }
  return absl::OkStatus();
}

Json QuantizationScheme::ToJson() const {
  Json j = Json::object();
  j["targets"] = targets;
  j["weights"] = OptionalArgsJson(weights);
  j["input_activations"] = OptionalArgsJson(input_activations);
  j["output_activations"] = OptionalArgsJson(output_activations);
  j["format"] = format.has_value() ? Json(*format) : Json(nullptr);
  return j;
}

absl::StatusOr<QuantizationScheme> QuantizationScheme::FromJson(
    const Json& j, absl::string_view field) {
  RETURN_IF_ERROR(CheckObject(j, field,
                              {"targets", "weights", "input_activations",
                               "output_activations", "format"}));
  QuantizationScheme scheme;
  const Json* targets = util::FindMember(j, "targets");
  if (targets == nullptr || !targets->is_array()) {
    return FieldError(field, "targets", "expected a list of module names");
  }
  for (const Json& t : *targets) {
    ASSIGN_OR_RETURN(std::string name,
                     GetString(t, absl::StrCat(field, ".targets")));
    scheme.targets.push_back(std::move(name));
  }
  ASSIGN_OR_RETURN(scheme.weights, OptionalArgs(j, "weights", field));
  ASSIGN_OR_RETURN(scheme.input_activations,
                   OptionalArgs(j, "input_activations", field));
  ASSIGN_OR_RETURN(scheme.output_activations,
                   OptionalArgs(j, "output_activations", field));
  if (const Json* f = util::FindMember(j, "format"); f && !f->is_null()) {
    ASSIGN_OR_RETURN(scheme.format,
                     GetString(*f, absl::StrCat(field, ".format")));
  }
  RETURN_IF_ERROR(scheme.Resolve(field));
  return scheme;
}

bool QuantizationScheme::operator==(const QuantizationScheme& o) const {
  return targets == o.targets && weights == o.weights &&
         input_activations == o.input_activations &&
         output_activations == o.output_activations && format == o.format;
}

Json QuantizationConfig::ToJson() const {
  Json j = Json::object();
  Json groups = Json::object();
  for (const auto& [name, scheme] : config_groups)
    groups[name] = scheme.ToJson();
  j["config_groups"] = std::move(groups);
  j["quant_method"] = quant_method;
  j["kv_cache_scheme"] = OptionalArgsJson(kv_cache_scheme);
  j["format"] = format;
  j["quantization_status"] = quantization_status;
  j["global_compression_ratio"] = global_compression_ratio.has_value()
                                      ? Json(*global_compression_ratio)
                                      : Json(nullptr);
  j["ignore"] = ignore;
  return j;
}

absl::StatusOr<QuantizationConfig> QuantizationConfig::FromJson(
    const Json& j, absl::string_view field) {
  // Transformers' writer puts the sparsity/transform configs and a version
  // beside the quantization fields; they are not ours to read.
  RETURN_IF_ERROR(
      CheckObject(j, field,
                  {"config_groups", "quant_method", "kv_cache_scheme", "format",
                   "quantization_status", "global_compression_ratio", "ignore"},
                  {"sparsity_config", "transform_config", "version"}));
  QuantizationConfig config;
  const Json* groups = util::FindMember(j, "config_groups");
  if (groups == nullptr || !groups->is_object()) {
    return FieldError(field, "config_groups", "expected an object");
  }
  for (const auto& [name, value] : groups->items()) {
    const std::string where = absl::StrCat(field, ".config_groups.", name);
    if (value.is_array()) {  // {"W4A16": ["Linear"]}: a preset by name.
      std::vector<std::string> targets;
      for (const Json& t : value) {
        ASSIGN_OR_RETURN(std::string target, GetString(t, where));
        targets.push_back(std::move(target));
      }
      ASSIGN_OR_RETURN(QuantizationScheme scheme, PresetScheme(name, targets));
      config.config_groups.emplace_back(name, std::move(scheme));
      continue;
    }
    ASSIGN_OR_RETURN(QuantizationScheme scheme,
                     QuantizationScheme::FromJson(value, where));
    config.config_groups.emplace_back(name, std::move(scheme));
  }
  for (absl::string_view key :
       {"quant_method", "format", "quantization_status"}) {
    if (const Json* v = util::FindMember(j, key); v != nullptr) {
      ASSIGN_OR_RETURN(std::string s,
                       GetString(*v, absl::StrCat(field, ".", key)));
      if (key == "quant_method") config.quant_method = std::move(s);
      if (key == "format") config.format = std::move(s);
      if (key == "quantization_status")
        config.quantization_status = std::move(s);
    }
  }
  ASSIGN_OR_RETURN(config.kv_cache_scheme,
                   OptionalArgs(j, "kv_cache_scheme", field));
  if (const Json* r = util::FindMember(j, "global_compression_ratio");
      r != nullptr && !r->is_null()) {
    if (!r->is_number()) {
      return FieldError(field, "global_compression_ratio", "expected a number");
    }
    config.global_compression_ratio = r->get<double>();
  }
  if (const Json* ig = util::FindMember(j, "ignore");
      ig != nullptr && !ig->is_null()) {
    if (!ig->is_array()) return FieldError(field, "ignore", "expected a list");
    for (const Json& name : *ig) {
      ASSIGN_OR_RETURN(std::string s,
                       GetString(name, absl::StrCat(field, ".ignore")));
      config.ignore.push_back(std::move(s));
    }
  }
  return config;
}

}  // namespace tracecut::quantization
