#ifndef TRACECUT_TRACER_HF_CONFIG_H_
#define TRACECUT_TRACER_HF_CONFIG_H_

// Hugging Face awareness without LibTorch: typed access to a model's
// config.json, and the defaults HF tooling derives from it (which module
// types a sequential pipeline splits at, which modules it leaves alone).
//
//   ASSIGN_OR_RETURN(HfConfig config, HfConfig::Parse(text,
//   "model.pt:config.json")); ASSIGN_OR_RETURN(std::optional<int64_t> vocab,
//   config.GetInt("vocab_size")); HfDefaults d = DefaultsFor(config);  //
//   {"LlamaDecoderLayer"}, {"lm_head"}
//
// A value of the wrong type is an error naming the key and the file
// ("model.pt:config.json: "vocab_size" must be an integer, got string"),
// never a silent default.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/json.h"

namespace tracecut::tracer::hf {

class HfConfig {
 public:
  // Parses config.json text. `source` names it in errors (a path, or
  // "model.pt:config.json" for a config embedded in a TorchScript archive).
  // Checks the types of the keys tracecut reads (model_type, architectures,
  // vocab_size, hidden_size, image_size, ...), here and in text_config /
  // vision_config.
  static absl::StatusOr<HfConfig> Parse(absl::string_view text,
                                        std::string source);
  // Reads and parses a config.json file.
  static absl::StatusOr<HfConfig> Load(const std::string& path);

  const std::string& source() const { return source_; }
  // The text it was parsed from.
  const std::string& text() const { return text_; }
  const util::Json& json() const { return json_; }

  // "" when absent.
  const std::string& model_type() const { return model_type_; }
  const std::vector<std::string>& architectures() const {
    return architectures_;
  }

  // Top-level lookups: nullopt when absent or null; an error when present
  // with another type.
  absl::StatusOr<std::optional<int64_t>> GetInt(absl::string_view key) const;
  absl::StatusOr<std::optional<double>> GetDouble(absl::string_view key) const;
  absl::StatusOr<std::optional<bool>> GetBool(absl::string_view key) const;
  absl::StatusOr<std::optional<std::string>> GetString(
      absl::string_view key) const;

  // Like GetInt, but falls back to the nested text_config / vision_config
  // (CLIP-style composite configs) when the top level lacks the key.
  absl::StatusOr<std::optional<int64_t>> FindInt(absl::string_view key) const;

  // The model class's `_no_split_modules`, when whoever loaded the config
  // knows them (tracecut export records them next to config.json); they win
  // over the architecture table in DefaultsFor.
  const std::vector<std::string>& no_split_modules() const {
    return no_split_modules_;
  }
  void set_no_split_modules(std::vector<std::string> types) {
    no_split_modules_ = std::move(types);
  }

 private:
  HfConfig(util::Json json, std::string source)
      : json_(std::move(json)), source_(std::move(source)) {}

  absl::StatusOr<std::optional<int64_t>> IntIn(const util::Json& object,
                                               absl::string_view prefix,
                                               absl::string_view key) const;

  util::Json json_;
  std::string source_;
  std::string text_;
  std::string model_type_;
  std::vector<std::string> architectures_;
  std::vector<std::string> no_split_modules_;
};

// What HF tooling derives from a config.
struct HfDefaults {
  std::string model_type;  // As matched in the table ("llama").
  // Short module types a sequential pipeline splits at (the model class's
  // `_no_split_modules`): {"LlamaDecoderLayer"}.
  std::vector<std::string> sequential_targets;
  // Module paths or types left out of calibration: {"lm_head"}.
  std::vector<std::string> ignore;
};

// One row of the architecture table.
struct ArchitectureDefaults {
  const char* model_type;   // config.model_type: "llama"
  const char* arch_prefix;  // architectures[i] prefix: "Llama" (LlamaFor...)
  std::vector<const char*> sequential_targets;
};

// The known architectures, in lookup order. Extend here.
const std::vector<ArchitectureDefaults>& KnownArchitectures();

// Defaults for `config`: its no_split_modules() when set (entries naming
// embeddings dropped, as in the table), else matched by model_type, else by an
// architectures entry "<prefix>For..." / "<prefix>Model". Unknown models get no
// sequential targets and the default ignore list ({"lm_head"}).
HfDefaults DefaultsFor(const HfConfig& config);

}  // namespace tracecut::tracer::hf

#endif  // TRACECUT_TRACER_HF_CONFIG_H_
