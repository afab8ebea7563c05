#include "tracer/hf/config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tracer/hf/inputs.h"

namespace tracecut::tracer::hf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HfConfigTest, TypedAccess) {
  absl::StatusOr<HfConfig> c = HfConfig::Parse(
      R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
          "vocab_size": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
          "pad_token_id": null, "text_config": {"hidden_size": 8}})",
      "llama.pt:config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type(), "llama");
  EXPECT_THAT(c->architectures(), ElementsAre("LlamaForCausalLM"));
  EXPECT_EQ(c->GetInt("vocab_size")->value(), 256);
  EXPECT_FALSE(c->GetInt("pad_token_id")->has_value());
  EXPECT_FALSE(c->GetInt("absent")->has_value());
  EXPECT_EQ(c->GetDouble("rms_norm_eps")->value(), 1e-6);
  EXPECT_EQ(c->GetBool("tie_word_embeddings")->value(), false);
  EXPECT_EQ(c->FindInt("hidden_size")->value(), 8);
  absl::StatusOr<std::optional<int64_t>> wrong = c->GetInt("model_type");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("\"model_type\""));
  EXPECT_THAT(wrong.status().message(), HasSubstr("llama.pt:config.json"));
}

TEST(HfConfigTest, WrongTypesNameTheKeyAndFile) {
  struct Case {
    const char* json;
    const char* key;
  } cases[] = {
      {R"({"vocab_size": "256"})", "\"vocab_size\" must be an integer"},
      {R"({"vocab_size": 25.5})", "\"vocab_size\" must be an integer"},
      {R"({"architectures": "Llama"})", "\"architectures\" must be a list"},
      {R"({"model_type": 3})", "\"model_type\" must be a string"},
      {R"({"text_config": {"vocab_size": true}})",
       "\"text_config.vocab_size\" must be an integer"},
      {R"({"text_config": 1})", "\"text_config\" must be an object"},
      {R"([1])", "must be a JSON object"},
      {R"({"a": )", "cfg.json:1:7"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<HfConfig> config = HfConfig::Parse(c.json, "cfg.json");
    ASSERT_FALSE(config.ok()) << c.json;
    EXPECT_THAT(config.status().message(), HasSubstr(c.key)) << c.json;
    EXPECT_THAT(config.status().message(), HasSubstr("cfg.json")) << c.json;
  }
  EXPECT_EQ(HfConfig::Load("/nonexistent/config.json").status().code(),
            absl::StatusCode::kNotFound);
}

HfDefaults DefaultsOf(const char* json) {
  absl::StatusOr<HfConfig> c = HfConfig::Parse(json, "c");
  EXPECT_TRUE(c.ok()) << c.status();
  return DefaultsFor(*c);
}

TEST(HfDefaultsTest, ByModelTypeOrArchitecture) {
  EXPECT_THAT(DefaultsOf(R"({"model_type": "llama"})").sequential_targets,
              ElementsAre("LlamaDecoderLayer"));
  EXPECT_THAT(DefaultsOf(R"({"model_type": "gpt2"})").sequential_targets,
              ElementsAre("GPT2Block"));
  EXPECT_THAT(DefaultsOf(R"({"model_type": "bert"})").sequential_targets,
              ElementsAre("BertLayer"));
  EXPECT_THAT(DefaultsOf(R"({"model_type": "opt"})").sequential_targets,
              ElementsAre("OPTDecoderLayer"));
  EXPECT_THAT(DefaultsOf(R"({"architectures": ["Qwen2MoeForCausalLM"]})")
                  .sequential_targets,
              ElementsAre("Qwen2MoeDecoderLayer"));
  EXPECT_THAT(DefaultsOf(R"({"architectures": ["MistralForCausalLM"]})")
                  .sequential_targets,
              ElementsAre("MistralDecoderLayer"));
  HfDefaults unknown = DefaultsOf(R"({"model_type": "cnn"})");
  EXPECT_TRUE(unknown.sequential_targets.empty());
  EXPECT_THAT(unknown.ignore, ElementsAre("lm_head"));
  for (const ArchitectureDefaults& row : KnownArchitectures()) {
    EXPECT_FALSE(row.sequential_targets.empty()) << row.model_type;
  }
}

TEST(InputsTest, ParsesTracecutInputsJson) {
  absl::StatusOr<InputsFile> f = ParseInputsJson(
      R"({"inputs": [{"name": "input_ids", "shape": [2, 16], "dtype": "int64",
                      "kind": "tokens", "high": 256},
                     {"name": "attention_mask", "shape": [2, 16], "dtype": "int64",
                      "kind": "ones"}],
          "outputs": ["logits"]})",
      "m.pt:tracecut_inputs.json");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->inputs.size(), 2u);
  EXPECT_EQ(f->inputs[0].high, 256);
  EXPECT_THAT(f->inputs[1].shape, ElementsAre(2, 16));
  EXPECT_THAT(f->outputs, ElementsAre("logits"));
  EXPECT_TRUE(f->seq_lens.empty());

  // The lengths a program unrolled for its example's length is valid for.
  f = ParseInputsJson(R"({"inputs": [], "seq_lens": [[1, 63], [65, null]]})",
                      "in.json");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(f->seq_lens,
              ElementsAre(LengthRange{1, 63}, LengthRange{65, std::nullopt}));

  for (
      const char* bad : {
          R"({})",
          R"({"inputs": [{"shape": [1]}]})",
          R"({"inputs": [{"name": "x", "shape": [-1]}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "dtype": "float"}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "kind": "random"}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "kind": "tokens"}]})",
          R"({"inputs": [{"name": "x", "shape": [1]}, {"name": "x", "shape": [1]}]})",
          R"({"inputs": [], "seq_lens": [[0, 4]]})",
          R"({"inputs": [], "seq_lens": [[5, 4]]})",
          R"({"inputs": [], "seq_lens": [3]})",
          R"({"inputs": [], "seq_lens": {"min": 1}})",
      }) {
    absl::StatusOr<InputsFile> r = ParseInputsJson(bad, "in.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("in.json")) << bad;
  }
}

TEST(InputsTest, HfDummyInputs) {
  absl::StatusOr<HfConfig> c = HfConfig::Parse(
      R"({"vocab_size": 100, "max_position_embeddings": 8, "image_size": 32,
          "num_channels": 1, "hidden_size": 4})",
      "c.json");
  ASSERT_TRUE(c.ok());
  DummyShape shape;
  auto spec = [&](const char* name) {
    absl::StatusOr<std::optional<InputSpec>> s =
        DummyInputSpec(&*c, name, shape);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : std::nullopt;
  };
  EXPECT_EQ(spec("input_ids")->kind, "tokens");
  EXPECT_EQ(spec("input_ids")->high, 100);
  EXPECT_THAT(spec("input_ids")->shape, ElementsAre(2, 8));  // Capped.
  EXPECT_EQ(spec("attention_mask")->kind, "ones");
  EXPECT_EQ(spec("token_type_ids")->kind, "zeros");
  EXPECT_EQ(spec("position_ids")->kind, "arange");
  EXPECT_THAT(spec("pixel_values")->shape, ElementsAre(2, 1, 32, 32));
  EXPECT_THAT(spec("inputs_embeds")->shape, ElementsAre(2, 8, 4));
  EXPECT_FALSE(spec("something_else").has_value());

  absl::StatusOr<std::optional<InputSpec>> no_config =
      DummyInputSpec(nullptr, "input_ids", shape);
  ASSERT_FALSE(no_config.ok());
  EXPECT_THAT(no_config.status().message(), HasSubstr("vocab_size"));
  absl::StatusOr<HfConfig> bad =
      HfConfig::Parse(R"({"model_type": "x"})", "b.json");
  absl::StatusOr<std::optional<InputSpec>> missing =
      DummyInputSpec(&*bad, "pixel_values", shape);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("b.json"));
  EXPECT_THAT(missing.status().message(), HasSubstr("image_size"));
}

}  // namespace
}  // namespace tracecut::tracer::hf
