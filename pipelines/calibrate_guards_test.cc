// Calibration never fails silently: a module that no calibration token
// reaches (an MoE expert the router starves) is quantized round-to-nearest
// from its own weights and reported; NaN / Inf in a model's weights or in a
// computed quantization parameter is an error naming the tensor, and nothing
// is written.

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/script.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "pipelines/calibrate.h"
#include "pipelines/recipe.h"
#include "quantization/quantize.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::CheckQuantResultsFinite;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::quantization::QuantizeRtn;
using ::tracecut::quantization::QuantScheme;
using ::tracecut::quantization::RtnResult;
namespace {

using ::tracecut::util::testing::StatusIs;

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

using ::tracecut::util::testing::Runfile;
using ::tracecut::util::testing::TempDir;

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

constexpr char kMoeRecipe[] = R"pb(
  modifiers {
    gptq {
      scheme { bits: 4 group_size: 16 }
      targets: "Linear"
      ignore: "lm_head"
    }
  }
  sequential_targets: "MoeDecoderLayer"
)pb";

CalibrateOptions Options(const std::string& model, const std::string& dir,
                         const char* recipe_text) {
  CalibrateOptions o;
  o.model_path = model;
  absl::StatusOr<recipe::Recipe> r = ParseRecipe(recipe_text, "test");
  EXPECT_OK(r);
  if (r.ok()) o.recipe = *r;
  o.synthetic_samples = 8;
  o.batch_size = 4;
  o.output_path = absl::StrCat(dir, "/model.pt");
  o.report_path = absl::StrCat(dir, "/report.json");
  o.report_run_section = false;
  return o;
}

TEST(CalibrateGuardsTest, StarvedExpertIsQuantizedRoundToNearestAndReported) {
  const std::string model = Runfile("tests/fixtures/moe_starved.pt");
  CalibrateOptions o = Options(model, TempDir("moe"), kMoeRecipe);
  o.calibrate_all_experts = false;  // The routed tokens only.
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_OK(out);

  torch::jit::Module original = torch::jit::load(model);
  QuantScheme scheme;
  scheme.bits = 4;
  scheme.group_size = 16;
  const util::Json* summary = util::FindMember(out->report, "summary");
  ASSERT_NE(summary, nullptr);
  const util::Json* uncalibrated =
      util::FindMember(*summary, "uncalibrated_modules");
  ASSERT_NE(uncalibrated, nullptr);
  EXPECT_EQ(uncalibrated->size(), 6u);  // 3 Linears x 2 layers.
  for (int layer = 0; layer < 2; ++layer) {
    for (const char* linear : {"w1", "w2", "w3"}) {
      const std::string prefix =
          absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.");
      // The starved expert: RTN of its own weights, never zeroed.
      const std::string starved = absl::StrCat(prefix, "3.", linear);
      ASSERT_TRUE(out->results.modules.count(starved)) << starved;
      const ModuleRecord& r = out->results.modules.at(starved);
      EXPECT_EQ(r.weight_method, "rtn") << starved;
      EXPECT_EQ(r.calibration_tokens, 0) << starved;
      EXPECT_TRUE(std::isnan(r.weight_error)) << starved;
      ASSERT_FALSE(r.notes.empty());
      EXPECT_THAT(r.notes[0], HasSubstr("no calibration data; quantized "
                                        "round-to-nearest from its own "
                                        "weights instead of gptq"));
      at::Tensor w0 = original.attr("model")
                          .toModule()
                          .attr("layers")
                          .toModule()
                          .attr(std::to_string(layer))
                          .toModule()
                          .attr("block_sparse_moe")
                          .toModule()
                          .attr("experts")
                          .toModule()
                          .attr("3")
                          .toModule()
                          .attr(linear)
                          .toModule()
                          .attr("weight")
                          .toTensor();
      absl::StatusOr<RtnResult> rtn = QuantizeRtn(w0, scheme);
      ASSERT_OK(rtn);
      absl::StatusOr<at::Tensor> w =
          out->model->GetTensor(absl::StrCat(starved, ".weight"));
      ASSERT_OK(w);
      EXPECT_TRUE(at::equal(*w, rtn->weight)) << starved;
      EXPECT_GT(w->abs().sum().item<double>(), 0) << starved;

      // The experts the router picks: GPTQ on their tokens.
      for (int e = 0; e < 3; ++e) {
        const std::string used = absl::StrCat(prefix, e, ".", linear);
        const ModuleRecord& u = out->results.modules.at(used);
        EXPECT_EQ(u.weight_method, "gptq") << used;
        EXPECT_GT(u.calibration_tokens, 0) << used;
        EXPECT_TRUE(std::isfinite(u.weight_error)) << used;
      }
    }
  }
  bool warned = false;
  for (const std::string& w : out->results.warnings) {
    warned |= w.find(
                  "experts.3.w2: called only with empty inputs (0 "
                  "tokens)") != std::string::npos;
  }
  EXPECT_TRUE(warned);
}

// llm-compressor's default: the recipe and the flag leave it unset.
TEST(CalibrateGuardsTest, CalibrateAllExpertsFeedsEveryExpertEveryToken) {
  const std::string model = Runfile("tests/fixtures/moe_starved.pt");
  CalibrateOptions o = Options(model, TempDir("all_experts"), kMoeRecipe);
  ASSERT_FALSE(o.recipe.has_calibrate_all_experts());
  ASSERT_FALSE(o.calibrate_all_experts.has_value());
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_OK(out);
  const int64_t tokens = 8 * 16;  // synthetic_samples x synthetic_seq_len.
  for (int layer = 0; layer < 2; ++layer) {
    for (int e = 0; e < 4; ++e) {
      for (const char* linear : {"w1", "w2", "w3"}) {
        const std::string path =
            absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.",
                         e, ".", linear);
        const ModuleRecord& r = out->results.modules.at(path);
        EXPECT_EQ(r.weight_method, "gptq") << path;
        EXPECT_EQ(r.calibration_tokens, tokens) << path;
        EXPECT_TRUE(std::isfinite(r.weight_error)) << path;
      }
    }
  }
  EXPECT_TRUE(out->report.at("summary").at("uncalibrated_modules").empty());
}

// The option changes what the experts' modifiers see, not what the model
// computes: an observer on a Linear after the MoE block sees the same inputs.
TEST(CalibrateGuardsTest, CalibrateAllExpertsLeavesTheLayerOutputsAlone) {
  constexpr char kObserve[] = R"pb(
    modifiers { observer { kind: MINMAX targets: "Linear" } }
    sequential_targets: "MoeDecoderLayer"
  )pb";
  const std::string model = Runfile("tests/fixtures/moe_starved.pt");
  CalibrationResults seen[2];
  for (int all = 0; all < 2; ++all) {
    CalibrateOptions o =
        Options(model, TempDir(absl::StrCat("observe", all)), kObserve);
    o.calibrate_all_experts = all == 1;
    absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
    ASSERT_OK(out);
    seen[all] = out->results;
  }
  for (const char* path : {"model.layers.1.block_sparse_moe.gate", "lm_head"}) {
    const ModuleRecord& a = seen[0].modules.at(path);
    const ModuleRecord& b = seen[1].modules.at(path);
    EXPECT_EQ(a.input.min, b.input.min) << path;
    EXPECT_EQ(a.input.max, b.input.max) << path;
  }
  // ... while the starved expert's observer saw tokens only with the option.
  const std::string starved = "model.layers.0.block_sparse_moe.experts.3.w1";
  EXPECT_EQ(seen[0].modules.count(starved)
                ? seen[0].modules.at(starved).input.batches
                : 0,
            0);
  EXPECT_GT(seen[1].modules.at(starved).input.batches, 0);
}

TEST(CalibrateGuardsTest, CalibrateAllExpertsRefusesWhatItCannotDo) {
  const std::string model = Runfile("tests/fixtures/moe_starved.pt");
  struct Case {
    const char* pattern;
    const char* error;
  } cases[] = {
      {"re:.*[.]mixture[.][0-9]+", "no module of the model matches"},
      {"re:model[.]layers[.][0-9]+[.]block_sparse_moe",
       "takes its tokens from"},
  };
  for (const Case& c : cases) {
    std::string recipe =
        absl::StrCat(kMoeRecipe, " calibrate_all_experts: true",
                     " expert_modules: \"", c.pattern, "\"");
    CalibrateOptions o = Options(model, TempDir("refuse"), recipe.c_str());
    absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
    ASSERT_FALSE(out.ok()) << c.pattern;
    EXPECT_THAT(out.status().message(), HasSubstr(c.error)) << c.pattern;
    EXPECT_FALSE(Exists(o.output_path));
  }
}

// Left at its default, what calibrate_all_experts cannot do falls back to
// the routed tokens: silently for a model without experts, with a warning
// for experts that cannot run on their own.
TEST(CalibrateGuardsTest, CalibrateAllExpertsByDefaultFallsBackToRoutedTokens) {
  const std::string model = Runfile("tests/fixtures/moe_starved.pt");
  CalibrateOptions o =
      Options(model, TempDir("fallback"),
              absl::StrCat(kMoeRecipe, " expert_modules: ",
                           "\"re:model[.]layers[.][0-9]+[.]block_sparse_moe\"")
                  .c_str());
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_OK(out);
  EXPECT_THAT(out->results.warnings,
              Contains(AllOf(HasSubstr("tokens routed to them"),
                             HasSubstr("takes its tokens from"))));
  // The starved expert got no token, as without the option.
  EXPECT_EQ(
      out->results.modules.at("model.layers.0.block_sparse_moe.experts.3.w1")
          .weight_method,
      "rtn");

  CalibrateOptions dense =
      Options(Runfile("tests/fixtures/llama.pt"), TempDir("dense"), kMoeRecipe);
  dense.recipe.clear_sequential_targets();
  absl::StatusOr<CalibrateOutcome> plain = Calibrate(dense);
  ASSERT_OK(plain);
  for (const std::string& w : plain->results.warnings) {
    EXPECT_THAT(w, Not(HasSubstr("experts"))) << w;
  }
}

// llama.pt with one value of an embedding row replaced: rows no calibration
// sample uses are checked too.
std::string PoisonedLlama(const std::string& dir, double value) {
  torch::jit::ExtraFilesMap extra{{"config.json", ""},
                                  {"tracecut_inputs.json", ""}};
  torch::jit::Module m =
      torch::jit::load(Runfile("tests/fixtures/llama.pt"), at::kCPU, extra);
  at::Tensor emb = m.attr("model")
                       .toModule()
                       .attr("embed_tokens")
                       .toModule()
                       .attr("weight")
                       .toTensor();
  {
    at::NoGradGuard no_grad;
    emb[emb.size(0) - 1][5] = value;
  }
  std::string path = absl::StrCat(dir, "/poisoned.pt");
  m.save(path, extra);
  return path;
}

constexpr char kLlamaRecipe[] = R"pb(
  modifiers {
    gptq {
      scheme { bits: 4 group_size: 128 }
      targets: "Linear"
      ignore: "lm_head"
    }
  }
  sequential_targets: "LlamaDecoderLayer"
)pb";

TEST(CalibrateGuardsTest, NonFiniteWeightIsAnErrorNamingTheTensor) {
  for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                     -std::numeric_limits<double>::infinity()}) {
    const std::string dir = TempDir(std::isnan(bad) ? "nan" : "inf");
    CalibrateOptions o = Options(PoisonedLlama(dir, bad), dir, kLlamaRecipe);
    o.synthetic_seq_len = 4;
    absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
    ASSERT_THAT(out, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(
        out.status().message(),
        HasSubstr(absl::StrCat("poisoned.pt: parameter "
                               "model.embed_tokens.weight has ",
                               std::isnan(bad) ? "NaN" : "-inf", " at [")));
    EXPECT_FALSE(Exists(o.output_path));
    EXPECT_FALSE(Exists(o.report_path));
    EXPECT_FALSE(Exists(o.output_path + ".run"));
  }
}

TEST(CalibrateGuardsTest, NonFiniteQuantizationResultIsRefused) {
  const std::string dir = TempDir("results");
  CalibrateOptions o =
      Options(Runfile("tests/fixtures/llama.pt"), dir, kLlamaRecipe);
  absl::StatusOr<CalibrateOutcome> out = Calibrate(o);
  ASSERT_OK(out);
  ASSERT_OK(CheckQuantResultsFinite(out->results, *out->model));

  const std::string path = "model.layers.1.mlp.up_proj";
  CalibrationResults results = out->results;
  ModuleRecord& r = results.modules.at(path);
  r.weight_scale = r.weight_scale.clone();
  r.weight_scale[3][0] = std::numeric_limits<double>::quiet_NaN();
  absl::Status s = CheckQuantResultsFinite(results, *out->model);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("module model.layers.1.mlp.up_proj (Linear): "
                        "weight_scale has NaN at [3, 0]"));

  // A quantized weight that went non-finite.
  absl::StatusOr<at::Tensor> w =
      out->model->GetTensor(absl::StrCat(path, ".weight"));
  ASSERT_OK(w);
  {
    at::NoGradGuard no_grad;
    (*w)[0][0] = std::numeric_limits<double>::infinity();
  }
  EXPECT_THAT(CheckQuantResultsFinite(out->results, *out->model).message(),
              HasSubstr("quantized weight has inf at [0, 0]"));
}

}  // namespace
}  // namespace tracecut::pipelines
