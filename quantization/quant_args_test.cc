#include "quantization/quant_args.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/json.h"
#include "util/testing/status_matchers.h"

// compressed-tensors' own dumps of every preset are compared in
// //tests/quantization:ct_conformance_test; these tests cover inference,
// refusals and the JSON form on their own.

namespace tracecut::quantization {
namespace {

using ::testing::HasSubstr;
using util::testing::IsOk;
using util::testing::StatusIs;

util::Json Parse(const std::string& text) {
  absl::StatusOr<util::Json> j = util::ParseJson(text);
  EXPECT_THAT(j, IsOk());
  return *j;
}

absl::Status ResolveArgs(const std::string& json) {
  return QuantizationArgs::FromJson(Parse(json), "weights").status();
}

TEST(QuantizationArgs, InfersStrategyAndZeroPointDtype) {
  auto group = QuantizationArgs::FromJson(
      Parse(R"({"num_bits": 4, "group_size": 128, "symmetric": false})"), "w");
  ASSERT_THAT(group, IsOk());
  EXPECT_EQ(group->strategy, Strategy::kGroup);
  EXPECT_EQ(group->zp_dtype, c10::ScalarType::Char);
  auto channel =
      QuantizationArgs::FromJson(Parse(R"({"group_size": -1})"), "w");
  ASSERT_THAT(channel, IsOk());
  EXPECT_EQ(channel->strategy, Strategy::kChannel);
  auto tensor = QuantizationArgs::FromJson(
      Parse(R"({"type": "FLOAT", "num_bits": 8})"), "w");
  ASSERT_THAT(tensor, IsOk());
  EXPECT_EQ(tensor->strategy, Strategy::kTensor);
  EXPECT_EQ(tensor->zp_dtype, c10::ScalarType::Float8_e4m3fn);
  EXPECT_EQ(tensor->ToString(), "float8 sym tensor");
}

TEST(QuantizationArgs, RefusesBadCombinationsNamingTheField) {
  // NVFP4 with group 128.
  EXPECT_THAT(ResolveArgs(R"({"num_bits": 4, "type": "float", "strategy":
          "tensor_group", "group_size": 128, "scale_dtype": "float8_e4m3fn"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.group_size: float 4-bit is NVFP4")));
  // FP8 asymmetric.
  EXPECT_THAT(
      ResolveArgs(R"({"num_bits": 8, "type": "float", "symmetric": false})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("weights.symmetric: float8 must be symmetric")));
  EXPECT_THAT(ResolveArgs(R"({"strategy": "token"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.dynamic:")));
  EXPECT_THAT(ResolveArgs(R"({"strategy": "group"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.group_size: strategy group")));
  EXPECT_THAT(ResolveArgs(R"({"strategy": "channel", "group_size": 64})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.group_size: group_size 64")));
  EXPECT_THAT(ResolveArgs(R"({"strategy": "block"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.block_structure:")));
  EXPECT_THAT(ResolveArgs(R"({"block_structure": [128, 0],
                              "strategy": "block"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.block_structure: must be two")));
  EXPECT_THAT(ResolveArgs(R"({"dynamic": "local", "strategy": "tensor"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.dynamic: \"local\"")));
  EXPECT_THAT(ResolveArgs(R"({"num_bits": 9})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.num_bits:")));
  EXPECT_THAT(ResolveArgs(R"({"num_bits": 6, "type": "float"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.num_bits: float quantization")));
  EXPECT_THAT(ResolveArgs(R"({"group_size": 64, "scale_dtype": "uint8"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.scale_dtype: torch.uint8")));
  EXPECT_THAT(ResolveArgs(R"({"observer": "imatrix"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.observer: unknown observer")));
  EXPECT_THAT(ResolveArgs(R"({"actorder": true, "group_size": 64})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.actorder:")));
  EXPECT_THAT(ResolveArgs(R"({"bits": 4})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weights.bits: unknown field")));
  EXPECT_THAT(ResolveArgs(R"({"scale_dtype": "torch.float7"})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no such torch dtype")));
}

TEST(QuantizationScheme, RefusesWhatWeightsAndActivationsCannotBe) {
  QuantizationScheme s;
  s.targets = {"Linear"};
  s.weights = QuantizationArgs{};
  s.weights->strategy = Strategy::kToken;
  s.weights->dynamic = Dynamic::kDynamic;
  EXPECT_THAT(s.Resolve(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("scheme.weights.dynamic")));
  s.weights->dynamic = Dynamic::kStatic;
  s.weights->strategy = Strategy::kChannel;
  s.input_activations = QuantizationArgs{};
  s.input_activations->strategy = Strategy::kChannel;
  EXPECT_THAT(s.Resolve(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scheme.input_activations.strategy")));
  s.input_activations->strategy = Strategy::kToken;
  s.input_activations->dynamic = Dynamic::kDynamic;
  EXPECT_THAT(s.Resolve(), IsOk());
  s.format = "mixed-precision";
  EXPECT_THAT(s.Resolve(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("scheme.format")));
}

TEST(Presets, EveryPresetResolvesAndRoundTrips) {
  ASSERT_GE(PresetNames().size(), 30u);
  for (const std::string& name : PresetNames()) {
    SCOPED_TRACE(name);
    absl::StatusOr<QuantizationScheme> s = PresetScheme(name, {"Linear"});
    ASSERT_THAT(s, IsOk());
    absl::StatusOr<QuantizationScheme> back =
        QuantizationScheme::FromJson(s->ToJson(), name);
    ASSERT_THAT(back, IsOk());
    EXPECT_TRUE(*back == *s);
    EXPECT_EQ(back->ToJson(), s->ToJson());
  }
}

TEST(Presets, NamesAreCaseInsensitiveAndUnknownOnesListed) {
  absl::StatusOr<QuantizationScheme> s = PresetScheme("nvfp4", {"Linear"});
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->weights->ToString(), "float4 sym tensor_group16");
  EXPECT_EQ(s->input_activations->dynamic, Dynamic::kLocal);
  EXPECT_THAT(PresetScheme("W4A17", {"Linear"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown preset \"W4A17\" (known: "
                                 "UNQUANTIZED, W4A16_ASYM")));
}

TEST(QuantizationConfig, PresetGroupsByNameAndUnknownFields) {
  absl::StatusOr<QuantizationConfig> c = QuantizationConfig::FromJson(
      Parse(R"({"config_groups": {"W8A8": ["Linear"]}, "ignore": ["lm_head"],
                "format": "int-quantized", "version": "0.19"})"),
      "quantization_config");
  ASSERT_THAT(c, IsOk());
  ASSERT_EQ(c->config_groups.size(), 1u);
  EXPECT_EQ(c->config_groups[0].second.weights->strategy, Strategy::kChannel);
  EXPECT_EQ(c->quantization_status, "initialized");
  EXPECT_THAT(QuantizationConfig::FromJson(
                  Parse(R"({"config_groups": {}, "ignored": []})"), "qc"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("qc.ignored: unknown field")));
}

}  // namespace
}  // namespace tracecut::quantization
