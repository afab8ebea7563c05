// The whole calibration flow: outputs, determinism, kill-and-resume, and
// bad input that must fail with one clear error and no output.

#include "pipelines/calibrate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pipelines/recipe.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::Modifier;
using ::tracecut::modifiers::ModuleCall;
using ::tracecut::modifiers::RunContext;
using ::tracecut::modifiers::SubgraphInfo;
namespace {

using ::tracecut::util::testing::Runfile;
using ::tracecut::util::testing::StatusIs;
using ::tracecut::util::testing::TempDir;

std::string Llama() { return Runfile("tests/fixtures/llama.pt"); }

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

recipe::Recipe Recipe(const std::string& text) {
  absl::StatusOr<recipe::Recipe> r = ParseRecipe(text, "test.textproto");
  EXPECT_OK(r);
  return *r;
}

constexpr char kGptqRecipe[] = R"pb(
  modifiers {
    gptq {
      scheme { bits: 4 group_size: 128 }
      targets: "Linear"
      ignore: "lm_head"
    }
  }
  modifiers { observer { kind: MINMAX targets: "Linear" } }
  sequential_targets: "LlamaDecoderLayer"
)pb";

CalibrateOptions Base(const std::string& dir) {
  CalibrateOptions o;
  o.model_path = Llama();
  o.recipe = Recipe(kGptqRecipe);
  o.recipe_source = "test.textproto";
  o.synthetic_samples = 12;
  o.batch_size = 4;
  o.output_path = absl::StrCat(dir, "/model.pt");
  o.report_path = absl::StrCat(dir, "/report.json");
  o.report_run_section = false;
  return o;
}

// Checks that a failed run left nothing behind in `dir`.
void ExpectNoOutput(const CalibrateOptions& o) {
  EXPECT_FALSE(Exists(o.output_path)) << o.output_path;
  EXPECT_FALSE(Exists(o.report_path)) << o.report_path;
  EXPECT_FALSE(Exists(o.output_path + ".run")) << o.output_path << ".run";
}

TEST(CalibrateTest, WritesModelAndReport) {
  std::string dir = TempDir("writes");
  CalibrateOptions o = Base(dir);
  o.report_run_section = true;
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_OK(out);
  EXPECT_FALSE(out->stopped);
  EXPECT_EQ(out->targets, std::vector<std::string>({"LlamaDecoderLayer"}));
  EXPECT_EQ(out->num_batches, 3);
  EXPECT_FALSE(Exists(o.output_path + ".run"));  // Removed after success.

  // The saved model loads, carries the parameters as buffers and computes
  // what the calibrated model in memory computes.
  torch::jit::ExtraFilesMap extra{{"config.json", ""}};
  torch::jit::Module saved = torch::jit::load(o.output_path, at::kCPU, extra);
  EXPECT_TRUE(absl::StrContains(extra["config.json"], "\"llama\""));
  bool found_scale = false, found_input_scale = false;
  for (const auto& b : saved.named_buffers()) {
    if (b.name == "model.layers.0.mlp.down_proj.weight_scale") {
      found_scale = true;
      EXPECT_EQ(b.value.sizes(), at::IntArrayRef({128, 2}));
    }
    if (b.name == "model.layers.1.self_attn.q_proj.input_scale") {
      found_input_scale = true;
    }
    EXPECT_NE(b.name, "lm_head.weight_scale");
  }
  EXPECT_TRUE(found_scale);
  EXPECT_TRUE(found_input_scale);
  at::Tensor ids = at::randint(0, 256, {2, 16}, at::kLong);
  std::vector<c10::IValue> inputs = {ids, at::ones_like(ids)};
  at::Tensor a = saved.forward(inputs).toTupleRef().elements()[0].toTensor();
  at::Tensor b = out->model->module()
                     .forward(inputs)
                     .toTupleRef()
                     .elements()[0]
                     .toTensor();
  EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-6));
  // The weights are quantize-dequantize values: at most 16 distinct values
  // per row and group of 128 (int4).
  at::Tensor w = saved.attr("model")
                     .toModule()
                     .attr("layers")
                     .toModule()
                     .attr("0")
                     .toModule()
                     .attr("mlp")
                     .toModule()
                     .attr("up_proj")
                     .toModule()
                     .attr("weight")
                     .toTensor();
  EXPECT_LE(std::get<0>(at::_unique(w[0].narrow(0, 0, 128))).numel(), 16);

  std::string report = ReadFile(o.report_path);
  absl::StatusOr<util::Json> json = util::ParseJson(report);
  ASSERT_OK(json);
  EXPECT_EQ(json->at("pipeline").get<std::string>(), "sequential");
  EXPECT_EQ(json->at("modules").size(), 15u);
  EXPECT_EQ(json->at("summary").at("weights_quantized").get<int64_t>(), 14);
  ASSERT_NE(util::FindMember(*json, "run"), nullptr);
  EXPECT_EQ(json->at("run").at("timings").size(), 3u);
  EXPECT_TRUE(absl::StrContains(report, "\"rtn_output_error\""));
}

TEST(CalibrateTest, KilledThenResumedRunGivesIdenticalBytes) {
  // Uninterrupted.
  std::string full_dir = TempDir("full");
  CalibrateOptions full = Base(full_dir);
  absl::StatusOr<CalibrateOutcome> a = Calibrate(full);
  ASSERT_OK(a);

  // Stopped after subgraph 1 (the first decoder layer): as if killed there.
  std::string dir = TempDir("resumed");
  CalibrateOptions o = Base(dir);
  o.stop_after_subgraph = 1;
  absl::StatusOr<CalibrateOutcome> stopped = Calibrate(o);
  ASSERT_OK(stopped);
  EXPECT_TRUE(stopped->stopped);
  EXPECT_FALSE(Exists(o.output_path));
  EXPECT_FALSE(Exists(o.report_path));
  EXPECT_TRUE(Exists(o.output_path + ".run/state.pt"));
  EXPECT_TRUE(Exists(o.output_path + ".run/weights-00001.pt"));
  EXPECT_FALSE(Exists(o.output_path + ".run/weights-00000.pt"));  // Head.

  // A resume with another recipe is refused.
  CalibrateOptions other = o;
  other.stop_after_subgraph = -1;
  other.resume = true;
  other.recipe.mutable_modifiers(0)->mutable_gptq()->set_dampening_frac(0.1);
  absl::StatusOr<CalibrateOutcome> refused = Calibrate(other);
  ASSERT_THAT(refused, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "different run"))
      << refused.status();
  EXPECT_TRUE(Exists(o.output_path + ".run/state.pt"));  // Kept.

  o.stop_after_subgraph = -1;
  o.resume = true;
  absl::StatusOr<CalibrateOutcome> b = Calibrate(o);
  ASSERT_OK(b);
  EXPECT_TRUE(b->pipeline.resumed);
  EXPECT_EQ(b->pipeline.first_subgraph, 2);
  EXPECT_EQ(b->pipeline.subgraphs.size(), 1u);  // Only the last one ran.
  EXPECT_FALSE(Exists(o.output_path + ".run"));

  const std::string model_a = ReadFile(full.output_path);
  const std::string model_b = ReadFile(o.output_path);
  ASSERT_FALSE(model_a.empty());
  EXPECT_TRUE(model_a == model_b) << "the .pt files differ";
  const std::string report_a = ReadFile(full.report_path);
  EXPECT_FALSE(report_a.empty());
  EXPECT_EQ(report_a, ReadFile(o.report_path));
}

// A modifier of the caller's own, after (or instead of) the recipe's.
class CountCalls : public Modifier {
 public:
  std::string name() const override { return "count-calls"; }
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override {
    return true;
  }
  absl::Status OnModuleCall(RunContext& ctx, const ModuleCall& call) override {
    ++calls;
    return absl::OkStatus();
  }
  absl::Status OnSubgraphEnd(RunContext& ctx,
                             const SubgraphInfo& subgraph) override {
    ++subgraphs;
    return absl::OkStatus();
  }
  int64_t calls = 0;
  int subgraphs = 0;
};

TEST(CalibrateTest, ExtraModifiersRunAfterTheRecipe) {
  std::string dir = TempDir("extra");
  CalibrateOptions o = Base(dir);
  CountCalls count;
  o.extra_modifiers = {&count};
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_OK(out);
  EXPECT_EQ(count.subgraphs, 3);
  // 3 batches x 16 leaf-module calls: embed_tokens, lm_head and 7 Linears
  // per layer (transformers' SiLUActivation is not a torch.nn leaf).
  EXPECT_EQ(count.calls, 3 * 16);

  // Alone, with a recipe that has no modifiers.
  o.recipe.clear_modifiers();
  CountCalls alone;
  o.extra_modifiers = {&alone};
  out = Calibrate(o);
  ASSERT_OK(out);
  EXPECT_EQ(alone.calls, 3 * 16);
}

TEST(CalibrateTest, ResumeWithoutCheckpointStartsAfresh) {
  std::string dir = TempDir("fresh_resume");
  CalibrateOptions o = Base(dir);
  o.resume = true;
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_OK(out);
  EXPECT_FALSE(out->pipeline.resumed);
  EXPECT_TRUE(Exists(o.output_path));
}

TEST(CalibrateTest, EveryPipelineFromTheRecipe) {
  for (const char* pipeline : {"BASIC", "LAYER_SEQUENTIAL", "SEQUENTIAL"}) {
    SCOPED_TRACE(pipeline);
    std::string dir = TempDir(absl::StrCat("pipeline_", pipeline));
    CalibrateOptions o = Base(dir);
    o.recipe = Recipe(absl::StrCat(kGptqRecipe, " pipeline: ", pipeline));
    absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
    ASSERT_OK(out);
    EXPECT_TRUE(Exists(o.output_path));
  }
}

TEST(CalibrateTest, TargetsMatchingNothing) {
  std::string dir = TempDir("no_targets");
  CalibrateOptions o = Base(dir);
  o.recipe = Recipe(R"pb(
    modifiers {
      gptq {
        scheme { bits: 4 }
        targets: "Conv2d"
      }
    }
  )pb");
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_THAT(out, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(out.status().message(),
                                "gptq: targets [Conv2d] match no leaf module"))
      << out.status();
  ExpectNoOutput(o);

  o.recipe = Recipe(R"pb(
    modifiers {
      gptq {
        scheme { bits: 4 }
        targets: "Linear"
      }
    }
    sequential_targets: "BertLayer"
  )pb");
  out = Calibrate(o);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "BertLayer"))
      << out.status();
  ExpectNoOutput(o);
}

TEST(CalibrateTest, BadCalibrationData) {
  std::string dir = TempDir("bad_data");
  struct Case {
    std::string file;
    std::string contents;
    std::string expected;
  };
  // A sequence longer than max_position_embeddings (64).
  std::string long_line = "[";
  for (int i = 0; i < 65; ++i) absl::StrAppend(&long_line, i ? ", " : "", 1);
  const Case cases[] = {
      {"out_of_range.jsonl", "[1, 2, 3, 4]\n[5, 6, 256, 7]\n",
       "token id 256 at sample 1, position 2 is out of range [0, 256)"},
      {"negative.jsonl", "[1, -2]\n", "token id -2 at sample 0, position 1"},
      {"too_long.jsonl", long_line + "]\n",
       "sequence length 65 exceeds the model's max_position_embeddings 64"},
      {"floats.jsonl", "[1.5, 2]\n", "token 0 is a number"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    CalibrateOptions o = Base(dir);
    o.synthetic_samples = 0;
    o.data_path = WriteFile(absl::StrCat(dir, "/", c.file), c.contents);
    absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
    ASSERT_THAT(out, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(absl::StrContains(out.status().message(), c.expected))
        << out.status();
    ExpectNoOutput(o);
  }
  // Float token ids in a torch.save file.
  CalibrateOptions o = Base(dir);
  o.synthetic_samples = 0;
  o.data_path = Runfile("pipelines/testdata/tokens_float.pt");
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(),
                                "must be an integer tensor [N, seq], got "
                                "float32[6, 16]"))
      << out.status();
  ExpectNoOutput(o);
  // A real torch.save file works.
  o.data_path = Runfile("pipelines/testdata/tokens_dicts.pt");
  out = Calibrate(o);
  EXPECT_OK(out);
}

TEST(CalibrateTest, NaNActivationsFailWithoutOutput) {
  // A copy of the fixture whose second layer overflows: its weights are
  // finite (NaN or Inf weights are refused at load, calibrate_guards_test),
  // its activations are not.
  std::string dir = TempDir("nan");
  torch::jit::ExtraFilesMap extra{{"config.json", ""},
                                  {"tracecut_inputs.json", ""}};
  torch::jit::Module m = torch::jit::load(Llama(), at::kCPU, extra);
  {
    c10::NoGradGuard no_grad;
    at::Tensor w = m.attr("model")
                       .toModule()
                       .attr("layers")
                       .toModule()
                       .attr("1")
                       .toModule()
                       .attr("mlp")
                       .toModule()
                       .attr("gate_proj")
                       .toModule()
                       .attr("weight")
                       .toTensor();
    w[7].fill_(3e38);
  }
  std::string model = absl::StrCat(dir, "/nan_llama.pt");
  m.save(model, extra);

  CalibrateOptions o = Base(dir);
  o.model_path = model;
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_THAT(out, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(
      absl::StrContains(out.status().message(), "non-finite activation"))
      << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(), "model.layers.1"))
      << out.status();
  // Subgraphs 0 and 1 had been checkpointed; the failed run removed them.
  ExpectNoOutput(o);
}

TEST(CalibrateTest, BadRecipeAndOptions) {
  std::string dir = TempDir("bad_recipe");
  absl::StatusOr<recipe::Recipe> r = ParseRecipe(
      "modifiers { gptq { scheme { bits: 9 } targets: \"Linear\" } }",
      "bad.textproto");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "bad.textproto:1:"))
      << r.status();

  CalibrateOptions o = Base(dir);
  o.recipe.mutable_modifiers(0)->mutable_gptq()->mutable_scheme()->set_bits(1);
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "bits"))
      << out.status();
  ExpectNoOutput(o);

  o = Base(dir);
  o.data_path = "x.jsonl";  // And --synthetic.
  out = Calibrate(o);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "exactly one"));

  o = Base(dir);
  o.model_path = absl::StrCat(dir, "/missing.pt");
  out = Calibrate(o);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound) << out.status();
  ExpectNoOutput(o);
}

// A torch.save'd value, as Python's torch.save writes it.
std::string SaveValue(const std::string& path, const c10::IValue& value) {
  std::vector<char> bytes = torch::jit::pickle_save(value);
  return WriteFile(path, std::string(bytes.begin(), bytes.end()));
}

TEST(CalibrateTest, CnnFromImageTensors) {
  std::string dir = TempDir("cnn");
  const std::string images =
      SaveValue(absl::StrCat(dir, "/images.pt"), at::randn({6, 3, 16, 16}));
  for (const char* pipeline : {"BASIC", "SEQUENTIAL"}) {
    SCOPED_TRACE(pipeline);
    CalibrateOptions o = Base(dir);
    o.model_path = Runfile("tests/fixtures/cnn.pt");
    o.recipe = Recipe(absl::StrCat(R"pb(
                                     modifiers {
                                       gptq {
                                         scheme { bits: 4 group_size: 32 }
                                         targets: "Linear"
                                       }
                                     }
                                     sequential_targets: "Conv2d"
                                     pipeline:)pb",
                                   pipeline));
    o.synthetic_samples = 0;
    o.data_path = images;
    o.batch_size = 4;
    absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
    ASSERT_OK(out);
    EXPECT_EQ(out->num_batches, 2);
    const util::Json* data = util::FindMember(out->report, "data");
    ASSERT_NE(data, nullptr);
    EXPECT_EQ(data->at("samples").get<int64_t>(), 6);
    EXPECT_EQ(data->at("inputs").at(0).get<std::string>(),
              "pixel_values: float32[6, 3, 16, 16]");
    const util::Json* summary = util::FindMember(out->report, "summary");
    EXPECT_EQ(summary->at("weights_quantized").get<int64_t>(), 1);
    // The calibrated model loads and runs.
    torch::jit::Module m = torch::jit::load(o.output_path);
    at::Tensor y = m.forward({at::randn({2, 3, 16, 16})})
                       .toTupleRef()
                       .elements()[0]
                       .toTensor();
    EXPECT_EQ(y.sizes(), at::IntArrayRef({2, 10}));
    EXPECT_TRUE(y.isfinite().all().item<bool>());
  }

  // Token ids are not images: one error naming the file and the input.
  CalibrateOptions o = Base(TempDir("cnn_bad"));
  o.model_path = Runfile("tests/fixtures/cnn.pt");
  o.recipe = Recipe(R"pb(
    modifiers {
      rtn {
        scheme { bits: 4 }
        targets: "Linear"
      }
    }
    pipeline: BASIC
  )pb");
  o.synthetic_samples = 0;
  o.data_path = Runfile("pipelines/testdata/tokens_tensor.pt");
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "tokens_tensor.pt"))
      << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(),
                                "input 'pixel_values' must be a "
                                "floating-point tensor"))
      << out.status();
  ExpectNoOutput(o);

  // Example inputs from the caller trace the model at another batch size.
  o.data_path = images;
  tracer::hf::InputSpec spec;
  spec.name = "pixel_values";
  spec.shape = {1, 3, 16, 16};
  o.example_inputs.input_specs = {spec};
  out = Calibrate(o);
  EXPECT_OK(out);
  std::remove(o.output_path.c_str());
  std::remove(o.report_path.c_str());
  o.example_inputs.input_specs.clear();
  o.example_inputs.example_inputs_path = absl::StrCat(dir, "/missing.pt");
  out = Calibrate(o);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "missing.pt"))
      << out.status();
  ExpectNoOutput(o);
}

}  // namespace
}  // namespace tracecut::pipelines
