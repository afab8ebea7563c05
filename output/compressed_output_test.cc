// WriteCompressedTensors on the traced Llama fixture after round-to-nearest
// W4 g16: what it stores, read back and unpacked here, against the weights
// the modifier computed. Loading by transformers and vLLM's format is
// //tests/hf:compressed_tensors_test; the streamed writer's output is
// compared with this one by //pipelines:weight_stream_test.

#include "output/compressed_output.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "checkpoint/layout.h"
#include "checkpoint/safetensors.h"
#include "modifiers/testing/traced_llama.h"
#include "modifiers/weight_quant_modifier.h"
#include "quantization/quant_args.h"
#include "util/files.h"
#include "util/json.h"
#include "util/progress.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::output {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::modifiers::testing::TraceLlamaFixture;
using ::tracecut::modifiers::testing::WholeModel;
using ::tracecut::util::testing::StatusIs;
using ::tracecut::util::testing::TempDir;

constexpr char kDown[] = "model.layers.0.mlp.down_proj";
constexpr int kGroup = 16;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The fixture with every Linear but lm_head quantized by round-to-nearest,
// symmetric int4, groups of 16 (as `tracecut calibrate` leaves it).
struct Quantized {
  runtime::GraphModule gm;
  CalibrationResults results;
};

Quantized QuantizeFixture() {
  Quantized q{TraceLlamaFixture(), {}};
  util::Progress progress = util::Progress::Silent();
  modifiers::RunContext ctx(&q.gm, &q.results, /*num_batches=*/1, &progress);
  modifiers::WeightQuantOptions o;
  o.modules.targets = {"Linear"};
  o.modules.ignore = {"lm_head"};
  o.scheme.bits = 4;
  o.scheme.symmetric = true;
  o.scheme.group_size = kGroup;
  modifiers::RtnModifier rtn(o);
  const modifiers::SubgraphInfo info = WholeModel(ctx);
  EXPECT_OK(rtn.OnRunStart(ctx));
  EXPECT_OK(rtn.OnSubgraphStart(ctx, info));
  EXPECT_OK(rtn.OnSubgraphEnd(ctx, info));
  EXPECT_OK(rtn.OnRunEnd(ctx));
  return q;
}

at::Tensor Get(const checkpoint::SafetensorsFile& f, const std::string& name) {
  absl::StatusOr<at::Tensor> t = f.Get(name);
  EXPECT_OK(t);
  return t.ok() ? *t : at::Tensor();
}

// compressed-tensors' pack_to_int32 undone for 4 bits: eight codes per
// int32, the first in the lowest bits, offset by 8.
at::Tensor UnpackInt4(const at::Tensor& packed, int64_t columns) {
  std::vector<at::Tensor> nibbles;
  for (int j = 0; j < 8; ++j) {
    nibbles.push_back(
        at::bitwise_and(at::bitwise_right_shift(packed, 4 * j), 0xF));
  }
  // [rows, words, 8] -> [rows, words * 8]: code 8w + j is word w's nibble j.
  at::Tensor codes = at::stack(nibbles, 2).reshape({packed.size(0), -1});
  return codes.slice(1, 0, columns) - 8;
}

TEST(CompressedOutputTest, PackedWeightsDequantizeToTheCalibratedWeights) {
  Quantized q = QuantizeFixture();
  const std::string out = TempDir("compressed_output") + "/out";
  ASSERT_OK(WriteCompressedTensors(q.gm, q.results, {.output_dir = out}));

  ASSERT_OK_AND_ASSIGN(
      auto file, checkpoint::SafetensorsFile::Open(out + "/model.safetensors"));
  ASSERT_OK_AND_ASSIGN(at::Tensor calibrated,
                       q.gm.GetTensor(absl::StrCat(kDown, ".weight")));
  const std::string p = kDown;
  EXPECT_FALSE(file->Has(p + ".weight"));
  const at::Tensor packed = Get(*file, p + ".weight_packed");
  const at::Tensor scale = Get(*file, p + ".weight_scale");
  const at::Tensor shape = Get(*file, p + ".weight_shape");
  ASSERT_EQ(packed.scalar_type(), at::kInt);
  ASSERT_EQ(shape.numel(), 2);
  EXPECT_EQ(shape[0].item<int64_t>(), calibrated.size(0));
  EXPECT_EQ(shape[1].item<int64_t>(), calibrated.size(1));
  ASSERT_EQ(
      scale.sizes().vec(),
      (std::vector<int64_t>{calibrated.size(0), calibrated.size(1) / kGroup}));
  const at::Tensor codes = UnpackInt4(packed, calibrated.size(1));
  EXPECT_LE(codes.max().item<int64_t>(), 7);
  EXPECT_GE(codes.min().item<int64_t>(), -8);
  const at::Tensor dequantized =
      codes.to(at::kFloat) *
      scale.to(at::kFloat).repeat_interleave(kGroup, /*dim=*/1);
  EXPECT_TRUE(at::allclose(dequantized, calibrated.to(at::kFloat),
                           /*rtol=*/1e-6, /*atol=*/0));

  // The ignored lm_head is written as it is.
  ASSERT_OK_AND_ASSIGN(at::Tensor head, q.gm.GetTensor("lm_head.weight"));
  EXPECT_TRUE(at::equal(Get(*file, "lm_head.weight"), head));

  ASSERT_OK_AND_ASSIGN(std::string text, util::ReadFile(out + "/config.json"));
  ASSERT_OK_AND_ASSIGN(util::Json config, util::ParseJson(text, "config.json"));
  const util::Json* qc = util::FindMember(config, "quantization_config");
  ASSERT_NE(qc, nullptr);
  EXPECT_EQ(util::FindMember(*qc, "format")->get<std::string>(),
            "pack-quantized");
  const util::Json* groups = util::FindMember(*qc, "config_groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_EQ(groups->size(), 1u);
  const util::Json& weights =
      *util::FindMember(groups->begin().value(), "weights");
  EXPECT_EQ(util::FindMember(weights, "num_bits")->get<int>(), 4);
  EXPECT_EQ(util::FindMember(weights, "group_size")->get<int>(), kGroup);
  EXPECT_TRUE(util::FindMember(weights, "symmetric")->get<bool>());
}

TEST(CompressedOutputTest, TheSameResultsGiveTheSameBytes) {
  Quantized q = QuantizeFixture();
  const std::string dir = TempDir("compressed_output_twice");
  ASSERT_OK(
      WriteCompressedTensors(q.gm, q.results, {.output_dir = dir + "/a"}));
  ASSERT_OK(
      WriteCompressedTensors(q.gm, q.results, {.output_dir = dir + "/b"}));
  for (const char* name : {"/model.safetensors", "/config.json"}) {
    ASSERT_OK_AND_ASSIGN(std::string a, util::ReadFile(dir + "/a" + name));
    ASSERT_OK_AND_ASSIGN(std::string b, util::ReadFile(dir + "/b" + name));
    EXPECT_TRUE(a == b) << name;
  }
}

// compressed-tensors matches a "Linear" target by class ancestry: a module
// of a Linear subclass (as the exporter lists them) left unquantized is on
// the ignore list, or transformers would look for its packed weight; a
// quantized one is not.
TEST(CompressedOutputTest, UnquantizedLinearSubclassesAreIgnored) {
  Quantized q = QuantizeFixture();
  q.gm.mutable_extra_files()["tracecut_model.json"] =
      R"({"linear_subclasses": ["model.embed_tokens",
                                "model.layers.0.mlp.down_proj"]})";
  const std::string out = TempDir("compressed_output_subclasses") + "/out";
  ASSERT_OK(WriteCompressedTensors(q.gm, q.results, {.output_dir = out}));
  ASSERT_OK_AND_ASSIGN(std::string text, util::ReadFile(out + "/config.json"));
  ASSERT_OK_AND_ASSIGN(util::Json config, util::ParseJson(text, "config.json"));
  const util::Json& ignore = config["quantization_config"]["ignore"];
  EXPECT_EQ(std::count(ignore.begin(), ignore.end(),
                       util::Json("model.embed_tokens")),
            1);
  EXPECT_EQ(std::count(ignore.begin(), ignore.end(), util::Json(kDown)), 0);

  q.gm.mutable_extra_files()["tracecut_model.json"] =
      R"({"linear_subclasses": "lm_head"})";
  EXPECT_THAT(
      WriteCompressedTensors(q.gm, q.results,
                             {.output_dir = TempDir("subclasses_bad") + "/o"}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("linear_subclasses")));
}

// transformers turns experts written one Linear per expert back into its
// fused parameters for some schemes only: the others get a warning naming
// the scheme and an expert.
TEST(CompressedOutputTest, FusedExpertsWarnOfSchemesTransformersCannotReload) {
  ASSERT_OK_AND_ASSIGN(checkpoint::Layout layout,
                       checkpoint::Layout::FromModelJson(R"({
        "checkpoint_layout": {"mlp.experts.gate_up_proj": [
          {"name": "moe.experts.0.w1.weight", "offsets": [0, 0, 0],
           "sizes": [1, 3, 4]},
          {"name": "moe.experts.1.w1.weight", "offsets": [1, 0, 0],
           "sizes": [1, 3, 4]}]}})",
                                                         "m"));
  auto preset = [](const char* name) {
    absl::StatusOr<quantization::QuantizationScheme> scheme =
        quantization::PresetScheme(name, {"Linear"});
    EXPECT_OK(scheme);
    ModuleRecord r;
    r.weight_method = "rtn";
    r.weight_quantization = util::DumpJson(util::Json{
        {"scheme", scheme->ToJson()}, {"ignore", util::Json::array()}});
    return r;
  };
  auto integer = [](const char* scheme) {
    ModuleRecord r;
    r.weight_method = "gptq";
    r.weight_scheme = scheme;
    return r;
  };
  for (const char* loads : {"W4A16", "W8A16", "FP8", "FP8_DYNAMIC"}) {
    CalibrationResults results;
    results.modules["moe.experts.1.w1"] = preset(loads);
    results.modules["model.lm_head"] = preset("NVFP4");  // Not an expert.
    EXPECT_EQ(FusedExpertsLoadWarning(results, layout), std::nullopt) << loads;
  }
  {
    // llm-compressor's GPTQ W4A16 (act order "static"): the same tensors.
    absl::StatusOr<quantization::QuantizationScheme> scheme =
        quantization::PresetScheme("W4A16", {"Linear"});
    ASSERT_OK(scheme);
    scheme->weights->actorder = quantization::ActOrder::kStatic;
    CalibrationResults results;
    ModuleRecord& r = results.modules["moe.experts.1.w1"];
    r.weight_method = "gptq";
    r.weight_quantization = util::DumpJson(util::Json{
        {"scheme", scheme->ToJson()}, {"ignore", util::Json::array()}});
    EXPECT_EQ(FusedExpertsLoadWarning(results, layout), std::nullopt);
  }
  for (const char* fails : {"NVFP4", "W8A8", "W4A16_ASYM", "MXFP4A16"}) {
    CalibrationResults results;
    results.modules["moe.experts.1.w1"] = preset(fails);
    std::optional<std::string> warning =
        FusedExpertsLoadWarning(results, layout);
    ASSERT_TRUE(warning.has_value()) << fails;
    EXPECT_THAT(*warning, AllOf(HasSubstr("mlp.experts.gate_up_proj"),
                                HasSubstr("moe.experts.1.w1: weights "),
                                HasSubstr("vLLM")))
        << fails;
  }
  CalibrationResults results;
  results.modules["moe.experts.0.w1"] = integer("int4 sym g128");
  EXPECT_EQ(FusedExpertsLoadWarning(results, layout), std::nullopt);
  results.modules["moe.experts.0.w1"] = integer("int4 asym g128");
  EXPECT_THAT(FusedExpertsLoadWarning(results, layout),
              Optional(HasSubstr("moe.experts.0.w1: int4 asym g128")));
}

TEST(CompressedOutputTest, WithoutAConfigNothingIsWritten) {
  Quantized q = QuantizeFixture();
  q.gm.mutable_extra_files().erase("config.json");
  const std::string out = TempDir("compressed_output_no_config") + "/out";
  EXPECT_THAT(WriteCompressedTensors(q.gm, q.results, {.output_dir = out}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("config.json")));
  EXPECT_FALSE(Exists(out));
}

}  // namespace
}  // namespace tracecut::output
