#include "tracer/native_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "tracer/hf/inputs.h"
#include "tracer/load.h"

namespace tracecut::tracer {
namespace {

using ::testing::HasSubstr;

constexpr char kLlama[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-6, "hidden_act": "silu", "max_position_embeddings": 64,
  "tie_word_embeddings": true,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
})";

hf::HfConfig Config(const std::string& text) {
  absl::StatusOr<hf::HfConfig> c = hf::HfConfig::Parse(text, "config.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// kLlama with `key` set to the JSON `value`.
hf::HfConfig With(const std::string& key, const std::string& value) {
  util::Json j = util::Json::parse(kLlama);
  j[key] = util::Json::parse(value);
  if (key == "layer_types") {
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["model_type"] = "qwen2";
  }
  return Config(j.dump());
}

TEST(NativeSupportTest, AcceptsTheFamily) {
  EXPECT_TRUE(NativeSupport(Config(kLlama)).ok());
  util::Json j = util::Json::parse(kLlama);
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["layer_types"] = {"full_attention", "sliding_attention"};
  j["sliding_window"] = 4;
  EXPECT_TRUE(NativeSupport(Config(j.dump())).ok());
  // Phi-3: partial rotary (half of each 4-wide head).
  j = util::Json::parse(kLlama);
  j["architectures"] = {"Phi3ForCausalLM"};
  j["model_type"] = "phi3";
  j["partial_rotary_factor"] = 0.5;
  EXPECT_TRUE(NativeSupport(Config(j.dump())).ok());
  // An odd number of turned dimensions has no rotate_half.
  j["partial_rotary_factor"] = 0.75;
  EXPECT_THAT(NativeSupport(Config(j.dump())).message(),
              HasSubstr("partial_rotary_factor 0.75"));
  // transformers 4's rope keys.
  j = util::Json::parse(kLlama);
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_TRUE(NativeSupport(Config(j.dump())).ok());
}

TEST(NativeSupportTest, RefusesWhatItDoesNotBuild) {
  struct Case {
    std::string key, value, why;
  };
  for (const Case& c : std::vector<Case>{
           {"architectures", R"(["GPT2LMHeadModel"])", "GPT2LMHeadModel"},
           {"quantization_config", R"({"quant_method": "gptq"})",
            "already quantized"},
           {"hidden_act", R"("gelu")", "hidden_act \"gelu\""},
           {"rope_parameters", R"({"rope_type": "yarn", "factor": 4.0})",
            "rope type \"yarn\""},
           {"rope_parameters",
            R"({"rope_type": "default", "partial_rotary_factor": 0.5})",
            "partial rotary"},
           {"num_key_value_heads", "3", "multiple of num_key_value_heads"},
           {"rope_parameters", R"({"rope_type": "linear", "factor": 0})",
            "rope \"factor\" must be positive"},
           {"rope_parameters", R"({"rope_theta": -1.0})",
            "\"rope_theta\" must be positive"},
           {"rms_norm_eps", "-1e-6", "\"rms_norm_eps\" must be >= 0"},
           {"layer_types", R"(["full_attention", "chunked_attention"])",
            "layer type \"chunked_attention\""},
       }) {
    absl::Status s = NativeSupport(With(c.key, c.value));
    EXPECT_FALSE(s.ok()) << c.key;
    EXPECT_THAT(s.message(), HasSubstr(c.why)) << c.key;
  }
}

class NativeBuildTest : public ::testing::Test {
 protected:
  // A seeded checkpoint of kLlama (tied: no lm_head.weight) in a fresh
  // directory, with `config` as its config.json.
  std::string Checkpoint(const std::string& config) {
    dir_ = absl::StrCat(
        ::testing::TempDir(), "/native_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    torch::manual_seed(0);
    std::vector<std::pair<std::string, torch::Tensor>> t = {
        {"model.embed_tokens.weight", torch::randn({32, 16})},
        {"model.norm.weight", 1 + 0.1 * torch::randn({16})}};
    for (int i = 0; i < 2; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      for (auto [name, rows, cols] :
           std::vector<std::tuple<std::string, int, int>>{
               {"self_attn.q_proj", 16, 16},
               {"self_attn.k_proj", 8, 16},
               {"self_attn.v_proj", 8, 16},
               {"self_attn.o_proj", 16, 16},
               {"mlp.gate_proj", 24, 16},
               {"mlp.up_proj", 24, 16},
               {"mlp.down_proj", 16, 24}}) {
        t.emplace_back(p + name + ".weight",
                       0.3 * torch::randn({rows, cols}).to(torch::kBFloat16));
      }
      for (const char* n : {"input_layernorm", "post_attention_layernorm"}) {
        t.emplace_back(p + n + ".weight", 1 + 0.1 * torch::randn({16}));
      }
    }
    absl::StatusOr<std::string> bytes = checkpoint::SerializeSafetensors(t);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    std::ofstream(dir_ + "/model.safetensors", std::ios::binary) << *bytes;
    std::ofstream(dir_ + "/config.json") << config;
    return dir_;
  }

  torch::Tensor Logits(NativeModel& m, const torch::Tensor& ids) {
    return m.module.forward({ids}).toTensor();
  }

  std::string dir_;
};

TEST_F(NativeBuildTest, BuildsTheModuleTreeAndRunsCausally) {
  const std::string dir = Checkpoint(kLlama);
  absl::StatusOr<NativeModel> m =
      BuildNativeModel(dir, Config(kLlama), /*defer=*/false);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->module.type()->name()->qualifiedName(),
            "__torch__.transformers.models.llama.modeling_llama."
            "LlamaForCausalLM");
  EXPECT_EQ(m->module.attr("model")
                .toModule()
                .attr("layers")
                .toModule()
                .attr("1")
                .toModule()
                .attr("mlp")
                .toModule()
                .attr("up_proj")
                .toModule()
                .type()
                ->name()
                ->qualifiedName(),
            "__torch__.torch.nn.modules.linear.Linear");
  // Tied: lm_head reads the embedding (the checkpoint holds no lm_head).
  torch::Tensor head =
      m->module.attr("lm_head").toModule().attr("weight").toTensor();
  EXPECT_EQ(head.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(head, m->module.attr("model")
                                     .toModule()
                                     .attr("embed_tokens")
                                     .toModule()
                                     .attr("weight")
                                     .toTensor()));
  torch::Tensor ids = torch::randint(0, 32, {2, 6}, torch::kLong);
  torch::Tensor logits = Logits(*m, ids);
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 6, 32}));
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  // Causal: changing the last token leaves every earlier position's logits.
  torch::Tensor changed = ids.clone();
  changed.index_put_({torch::indexing::Slice(), 5},
                     (ids.index({torch::indexing::Slice(), 5}) + 1) % 32);
  torch::Tensor other = Logits(*m, changed);
  EXPECT_TRUE(torch::equal(other.narrow(1, 0, 5), logits.narrow(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(other.narrow(1, 5, 1), logits.narrow(1, 5, 1)));
  EXPECT_THAT(m->model_json, HasSubstr("\"LlamaDecoderLayer\""));
  EXPECT_THAT(m->model_json, HasSubstr("\"lm_head.weight\""));
  absl::StatusOr<hf::InputsFile> inputs =
      hf::ParseInputsJson(m->inputs_json, "tracecut_inputs.json");
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->inputs.size(), 1u);
  EXPECT_EQ(inputs->inputs[0].high, 32);
}

TEST_F(NativeBuildTest, SlidingWindowHidesTokensBehindIt) {
  util::Json j = util::Json::parse(kLlama);
  j["architectures"] = {"MistralForCausalLM"};
  j["model_type"] = "mistral";
  j["sliding_window"] = 2;
  const std::string dir = Checkpoint(j.dump());
  absl::StatusOr<NativeModel> m =
      BuildNativeModel(dir, Config(j.dump()), /*defer=*/false);
  ASSERT_TRUE(m.ok()) << m.status();
  torch::Tensor ids = torch::randint(0, 32, {1, 8}, torch::kLong);
  torch::Tensor changed = ids.clone();
  changed.index_put_({0, 0}, (ids.index({0, 0}) + 1) % 32);
  torch::Tensor a = Logits(*m, ids), b = Logits(*m, changed);
  // Two layers of window 2: token 0 reaches positions 0-2 only.
  EXPECT_FALSE(torch::allclose(a.narrow(1, 2, 1), b.narrow(1, 2, 1)));
  EXPECT_TRUE(torch::equal(a.narrow(1, 3, 5), b.narrow(1, 3, 5)));
}

TEST_F(NativeBuildTest, DefersTensorsToTheCheckpoint) {
  const std::string dir = Checkpoint(kLlama);
  absl::StatusOr<NativeModel> m =
      BuildNativeModel(dir, Config(kLlama), /*defer=*/true);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->deferred.contains("lm_head.weight"));
  EXPECT_EQ(m->deferred.at("lm_head.weight").name, "model.embed_tokens.weight");
  const exported::DeferredTensor& q =
      m->deferred.at("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.stored, torch::kBFloat16);
  EXPECT_EQ(q.dtype, torch::kFloat);
  EXPECT_TRUE(exported::IsStandIn(
      m->module.attr("lm_head").toModule().attr("weight").toTensor()));
}

// In bfloat16 the tensors and activations are bfloat16 and the result is
// the float32 model's within bfloat16's rounding (tests/hf/native_model_test
// checks it against transformers' own bfloat16 forward, bit for bit).
TEST_F(NativeBuildTest, ComputesInBFloat16) {
  const std::string dir = Checkpoint(kLlama);
  absl::StatusOr<NativeModel> f32 =
      BuildNativeModel(dir, Config(kLlama), /*defer=*/false);
  absl::StatusOr<NativeModel> bf16 =
      BuildNativeModel(dir, Config(kLlama), /*defer=*/false, torch::kBFloat16);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->module.attr("lm_head")
                .toModule()
                .attr("weight")
                .toTensor()
                .scalar_type(),
            torch::kBFloat16);
  torch::Tensor ids = torch::randint(0, 32, {2, 6}, torch::kLong);
  torch::Tensor want = Logits(*f32, ids), got = Logits(*bf16, ids);
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
  const double err =
      ((got.to(torch::kFloat) - want).norm() / want.norm()).item<double>();
  EXPECT_GT(err, 0);  // It did compute in bfloat16.
  EXPECT_LT(err, 3e-2);
  absl::StatusOr<NativeModel> deferred =
      BuildNativeModel(dir, Config(kLlama), /*defer=*/true, torch::kBFloat16);
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  EXPECT_EQ(
      deferred->deferred.at("model.layers.0.self_attn.q_proj.weight").dtype,
      torch::kBFloat16);
  absl::StatusOr<NativeModel> ints =
      BuildNativeModel(dir, Config(kLlama), /*defer=*/true, torch::kInt);
  ASSERT_FALSE(ints.ok());
  EXPECT_THAT(ints.status().message(),
              HasSubstr("float32, bfloat16 or float16"));
}

// LoadOptions::dtype: "auto" is config.json's dtype; a saved program keeps
// its own.
TEST_F(NativeBuildTest, LoadResolvesTheDType) {
  util::Json j = util::Json::parse(kLlama);
  j["dtype"] = "bfloat16";
  const std::string dir = Checkpoint(j.dump());
  for (auto [name, want] : std::vector<std::pair<std::string, c10::ScalarType>>{
           {"", torch::kFloat},
           {"float32", torch::kFloat},
           {"auto", torch::kBFloat16},
           {"float16", torch::kHalf}}) {
    absl::StatusOr<LoadedModel> m = LoadModel(dir, {.dtype = name});
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_EQ(m->native_dtype, want) << name;
  }
  absl::StatusOr<LoadedModel> bad = LoadModel(dir, {.dtype = "int8"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("dtype 'int8'"));
  // A directory with a .pt2 computes as it was exported.
  std::ofstream(dir + "/model.pt2") << "not read";
  absl::StatusOr<LoadedModel> program = LoadModel(dir, {.dtype = "bfloat16"});
  ASSERT_FALSE(program.ok());
  EXPECT_THAT(program.status().message(), HasSubstr("saved program"));
}

TEST_F(NativeBuildTest, NamesTheMissingTensor) {
  util::Json j = util::Json::parse(kLlama);
  j["tie_word_embeddings"] = false;
  const std::string dir = Checkpoint(j.dump());
  absl::StatusOr<NativeModel> m =
      BuildNativeModel(dir, Config(j.dump()), /*defer=*/true);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("'lm_head.weight'"));
}

}  // namespace
}  // namespace tracecut::tracer
