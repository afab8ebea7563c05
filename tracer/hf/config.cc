#include "tracer/hf/config.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "util/json.h"
#include "util/path_guard.h"
#include "util/status_macros.h"

namespace tracecut::tracer::hf {

using util::Json;

namespace {

// Keys tracecut reads, with the JSON type each must have when present and
// not null. Checked up front so a bad config fails with a clear message
// before tracing starts.
enum class Want { kInt, kNumber, kBool, kString, kStringList, kIntOrIntList };

// Integers also have a range: a config is untrusted input, and its sizes
// become tensor shapes, layer counts and the output's config.json. The
// bounds are far above any released model's and far below what a machine
// could build (num_hidden_layers = 100000, vocab_size = 2^40).
constexpr int64_t kAny = -1;
constexpr struct {
  const char* key;
  Want want;
  int64_t min = kAny, max = kAny;  // Inclusive, for integers.
} kTypedKeys[] = {
    {"model_type", Want::kString},
    {"architectures", Want::kStringList},
    {"vocab_size", Want::kInt, 1, int64_t{1} << 24},
    {"hidden_size", Want::kInt, 1, int64_t{1} << 18},
    {"intermediate_size", Want::kInt, 1, int64_t{1} << 20},
    {"num_hidden_layers", Want::kInt, 1, 1024},
    {"num_attention_heads", Want::kInt, 1, int64_t{1} << 14},
    {"num_key_value_heads", Want::kInt, 1, int64_t{1} << 14},
    {"max_position_embeddings", Want::kInt, 1, int64_t{1} << 24},
    {"n_positions", Want::kInt, 1, int64_t{1} << 24},
    {"type_vocab_size", Want::kInt, 0, int64_t{1} << 16},
    {"num_channels", Want::kInt, 1, 4096},
    {"image_size", Want::kIntOrIntList, 1, int64_t{1} << 16},
    {"patch_size", Want::kIntOrIntList, 1, int64_t{1} << 16},
    {"num_labels", Want::kInt, 0, int64_t{1} << 20},
    {"torch_dtype", Want::kString},
    {"tie_word_embeddings", Want::kBool},
    {"is_encoder_decoder", Want::kBool},
    {"use_cache", Want::kBool},
    {"layer_norm_eps", Want::kNumber},
    {"rms_norm_eps", Want::kNumber},
};

constexpr uint64_t kMaxConfigBytes = 16 << 20;

// Sub-configs of composite models whose keys are checked the same way.
constexpr const char* kSubConfigs[] = {"text_config", "vision_config"};

absl::string_view WantName(Want want) {
  switch (want) {
    case Want::kInt:
      return "an integer";
    case Want::kNumber:
      return "a number";
    case Want::kBool:
      return "a bool (true/false)";
    case Want::kString:
      return "a string";
    case Want::kStringList:
      return "a list of strings";
    case Want::kIntOrIntList:
      return "an integer or a list of integers";
  }
  return "?";
}

bool Matches(const Json& v, Want want) {
  auto all = [&](auto pred) {
    if (!v.is_array()) return false;
    for (const Json& e : v) {
      if (!pred(e)) return false;
    }
    return true;
  };
  switch (want) {
    case Want::kInt:
      return v.is_number_integer();
    case Want::kNumber:
      return v.is_number();
    case Want::kBool:
      return v.is_boolean();
    case Want::kString:
      return v.is_string();
    case Want::kStringList:
      return all([](const Json& e) { return e.is_string(); });
    case Want::kIntOrIntList:
      return v.is_number_integer() ||
             all([](const Json& e) { return e.is_number_integer(); });
  }
  return false;
}

absl::Status TypeError(absl::string_view source, absl::string_view key,
                       absl::string_view want, const Json& got) {
  std::string shown = util::DumpJson(got);
  if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": \"", key, "\" must be ", want, ", got ",
                   util::JsonTypeName(got), " ", shown));
}

absl::Status CheckKeys(const Json& object, absl::string_view source,
                       absl::string_view prefix) {
  for (const auto& k : kTypedKeys) {
    const Json* v = util::FindMember(object, k.key);
    if (v == nullptr || v->is_null()) continue;
    if (!Matches(*v, k.want)) {
      return TypeError(source, absl::StrCat(prefix, k.key), WantName(k.want),
                       *v);
    }
    if (k.min == kAny) continue;
    auto in_range = [&](const Json& e) {
      if (e.is_number_unsigned()) {  // May be past int64 (2^63 and up).
        const uint64_t u = e.get<uint64_t>();
        return u >= static_cast<uint64_t>(k.min) &&
               u <= static_cast<uint64_t>(k.max);
      }
      const int64_t x = e.get<int64_t>();
      return x >= k.min && x <= k.max;
    };
    const bool ok = v->is_array() ? std::all_of(v->begin(), v->end(), in_range)
                                  : in_range(*v);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": \"", prefix, k.key, "\" must be between ", k.min, " and ",
          k.max, ", got ", util::DumpJson(*v).substr(0, 40)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfConfig> HfConfig::Parse(absl::string_view text,
                                         std::string source) {
  ASSIGN_OR_RETURN(Json json, util::ParseJson(text, source));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a config must be a JSON object, got ",
                     util::JsonTypeName(json)));
  }
  RETURN_IF_ERROR(CheckKeys(json, source, ""));
  for (const char* sub : kSubConfigs) {
    const Json* v = util::FindMember(json, sub);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_object()) {
      return TypeError(source, sub, "an object", *v);
    }
    RETURN_IF_ERROR(CheckKeys(*v, source, absl::StrCat(sub, ".")));
  }
  HfConfig config(std::move(json), std::move(source));
  config.text_ = std::string(text);
  if (const Json* v = util::FindMember(config.json_, "model_type");
      v && v->is_string()) {
    config.model_type_ = v->get<std::string>();
  }
  if (const Json* v = util::FindMember(config.json_, "architectures");
      v && v->is_array()) {
    for (const Json& e : *v) {
      config.architectures_.push_back(e.get<std::string>());
    }
  }
  return config;
}

absl::StatusOr<HfConfig> HfConfig::Load(const std::string& path) {
  // Configs are a few kilobytes; a FIFO or /dev/zero is not one.
  ASSIGN_OR_RETURN(std::string text,
                   util::ReadRegularFile(path, kMaxConfigBytes, "config"));
  return Parse(text, path);
}

absl::StatusOr<std::optional<int64_t>> HfConfig::IntIn(
    const Json& object, absl::string_view prefix, absl::string_view key) const {
  const Json* v = util::FindMember(object, key);
  if (v == nullptr || v->is_null()) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    return TypeError(source_, absl::StrCat(prefix, key), "an integer", *v);
  }
  return std::optional<int64_t>(v->get<int64_t>());
}

absl::StatusOr<std::optional<int64_t>> HfConfig::GetInt(
    absl::string_view key) const {
  return IntIn(json_, "", key);
}

absl::StatusOr<std::optional<double>> HfConfig::GetDouble(
    absl::string_view key) const {
  const Json* v = util::FindMember(json_, key);
  if (v == nullptr || v->is_null()) return std::optional<double>();
  if (!v->is_number()) return TypeError(source_, key, "a number", *v);
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<std::optional<bool>> HfConfig::GetBool(
    absl::string_view key) const {
  const Json* v = util::FindMember(json_, key);
  if (v == nullptr || v->is_null()) return std::optional<bool>();
  if (!v->is_boolean()) return TypeError(source_, key, "a bool", *v);
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<std::string>> HfConfig::GetString(
    absl::string_view key) const {
  const Json* v = util::FindMember(json_, key);
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) return TypeError(source_, key, "a string", *v);
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::optional<int64_t>> HfConfig::FindInt(
    absl::string_view key) const {
  ASSIGN_OR_RETURN(std::optional<int64_t> top, GetInt(key));
  if (top.has_value()) return top;
  for (const char* sub : kSubConfigs) {
    const Json* object = util::FindMember(json_, sub);
    if (object == nullptr || !object->is_object()) continue;
    ASSIGN_OR_RETURN(std::optional<int64_t> v,
                     IntIn(*object, absl::StrCat(sub, "."), key));
    if (v.has_value()) return v;
  }
  return std::optional<int64_t>();
}

const std::vector<ArchitectureDefaults>& KnownArchitectures() {
  // Sequential targets are the model classes' `_no_split_modules` in
  // transformers (the transformer block; embeddings entries dropped).
  static const auto* table = new std::vector<ArchitectureDefaults>{
      {"llama", "Llama", {"LlamaDecoderLayer"}},
      {"mistral", "Mistral", {"MistralDecoderLayer"}},
      {"mixtral", "Mixtral", {"MixtralDecoderLayer"}},
      {"qwen2_moe", "Qwen2Moe", {"Qwen2MoeDecoderLayer"}},
      {"qwen2", "Qwen2", {"Qwen2DecoderLayer"}},
      {"qwen3", "Qwen3", {"Qwen3DecoderLayer"}},
      {"gemma2", "Gemma2", {"Gemma2DecoderLayer"}},
      {"gemma", "Gemma", {"GemmaDecoderLayer"}},
      {"phi3", "Phi3", {"Phi3DecoderLayer"}},
      {"phi", "Phi", {"PhiDecoderLayer"}},
      {"falcon", "Falcon", {"FalconDecoderLayer"}},
      {"gpt_neox", "GPTNeoX", {"GPTNeoXLayer"}},
      {"gptj", "GPTJ", {"GPTJBlock"}},
      {"gpt2", "GPT2", {"GPT2Block"}},
      {"bloom", "Bloom", {"BloomBlock"}},
      {"opt", "OPT", {"OPTDecoderLayer"}},
      {"starcoder2", "Starcoder2", {"Starcoder2DecoderLayer"}},
      {"stablelm", "StableLm", {"StableLmDecoderLayer"}},
      {"cohere", "Cohere", {"CohereDecoderLayer"}},
      {"mpt", "Mpt", {"MptBlock"}},
      {"bert", "Bert", {"BertLayer"}},
      {"roberta", "Roberta", {"RobertaLayer"}},
      {"distilbert", "DistilBert", {"TransformerBlock"}},
      {"t5", "T5", {"T5Block"}},
      {"bart", "Bart", {"BartEncoderLayer", "BartDecoderLayer"}},
      {"whisper", "Whisper", {"WhisperEncoderLayer", "WhisperDecoderLayer"}},
      {"vit", "ViT", {"ViTLayer"}},
      {"clip", "CLIP", {"CLIPEncoderLayer"}},
      {"siglip", "Siglip", {"SiglipEncoderLayer"}},
  };
  return *table;
}

HfDefaults DefaultsFor(const HfConfig& config) {
  HfDefaults d;
  d.ignore = {"lm_head"};
  if (!config.no_split_modules().empty()) {
    d.model_type = config.model_type();
    for (const std::string& t : config.no_split_modules()) {
      if (!absl::StrContains(t, "Embedding")) d.sequential_targets.push_back(t);
    }
    if (!d.sequential_targets.empty()) return d;
  }
  const ArchitectureDefaults* match = nullptr;
  for (const ArchitectureDefaults& row : KnownArchitectures()) {
    if (config.model_type() == row.model_type) {
      match = &row;
      break;
    }
  }
  if (match == nullptr) {
    // Longest prefix wins, so "Qwen2MoeForCausalLM" is not taken for Qwen2.
    size_t best = 0;
    for (const std::string& arch : config.architectures()) {
      for (const ArchitectureDefaults& row : KnownArchitectures()) {
        absl::string_view prefix = row.arch_prefix;
        if (prefix.size() <= best || !absl::StartsWith(arch, prefix)) continue;
        absl::string_view rest = absl::string_view(arch).substr(prefix.size());
        if (absl::StartsWith(rest, "For") || absl::StartsWith(rest, "Model") ||
            absl::StartsWith(rest, "LMHead")) {
          match = &row;
          best = prefix.size();
        }
      }
    }
  }
  if (match != nullptr) {
    d.model_type = match->model_type;
    for (const char* t : match->sequential_targets) {
      d.sequential_targets.push_back(t);
    }
  }
  return d;
}

}  // namespace tracecut::tracer::hf
