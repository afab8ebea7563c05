#include "quantization/compressors.h"

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantization/fake_quant.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "util/testing/status_matchers.h"

// Bit-exactness against compressed-tensors' compressors is
// //tests/quantization:ct_conformance_test.

namespace tracecut::quantization {
namespace {

using ::testing::HasSubstr;
using util::testing::IsOk;
using util::testing::StatusIs;

QuantizationScheme Preset(const char* name) {
  absl::StatusOr<QuantizationScheme> s = PresetScheme(name, {"Linear"});
  EXPECT_THAT(s, IsOk());
  return *s;
}

TEST(Compressors, FormatOfEveryShippedScheme) {
  const std::map<std::string, std::string> want = {
      {"W4A16", "pack-quantized"},       {"W4A16_ASYM", "pack-quantized"},
      {"W8A16", "pack-quantized"},       {"W8A8", "int-quantized"},
      {"INT8", "int-quantized"},         {"W4AFP8", "int-quantized"},
      {"FP8", "float-quantized"},        {"FP8_DYNAMIC", "float-quantized"},
      {"FP8_BLOCK", "float-quantized"},  {"NVFP4A16", "nvfp4-pack-quantized"},
      {"NVFP4", "nvfp4-pack-quantized"}, {"MXFP4A16", "mxfp4-pack-quantized"},
      {"MXFP4", "mxfp4-pack-quantized"}, {"MXFP8", "mxfp8-quantized"},
      {"UNQUANTIZED", "dense"}};
  for (const auto& [preset, format] : want) {
    EXPECT_EQ(FormatName(InferFormat(Preset(preset.c_str()))), format)
        << preset;
  }
  QuantizationScheme fp8_weights_only = Preset("FP8_DYNAMIC");
  fp8_weights_only.input_activations.reset();
  EXPECT_EQ(InferFormat(fp8_weights_only), CompressionFormat::kNaiveQuantized);
  EXPECT_EQ(ModelFormat({CompressionFormat::kDense}),
            CompressionFormat::kDense);
  EXPECT_EQ(ModelFormat({CompressionFormat::kDense,
                         CompressionFormat::kFloatQuantized}),
            CompressionFormat::kFloatQuantized);
  EXPECT_EQ(ModelFormat({CompressionFormat::kNvfp4PackQuantized,
                         CompressionFormat::kFloatQuantized}),
            CompressionFormat::kMixedPrecision);
  EXPECT_THAT(ParseFormat("int4-packed"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown compressed-tensors format")));
}

TEST(Compressors, RefusesAFormatThatCannotStoreTheScheme) {
  const QuantizationScheme fp8 = Preset("FP8_DYNAMIC");
  at::Tensor w = at::randn({8, 32});
  absl::StatusOr<QParams> q = WeightQParams(w, *fp8.weights);
  ASSERT_THAT(q, IsOk());
  EXPECT_THAT(CompressWeight(w, *q, fp8, CompressionFormat::kPackQuantized),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("format pack-quantized cannot store float8 "
                                 "sym channel")));
}

TEST(Compressors, PackedIntCodesUnpackToTheCodes) {
  at::manual_seed(0);
  for (int bits : {2, 3, 4, 5, 8}) {
    SCOPED_TRACE(bits);
    const int64_t lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
    at::Tensor codes = at::randint(lo, hi + 1, {3, 70}, at::kChar);
    absl::StatusOr<at::Tensor> packed = PackToInt32(codes, bits);
    ASSERT_THAT(packed, IsOk());
    EXPECT_EQ(packed->size(1), (70 * bits + 31) / 32);
    // Bit k*b.. of each row's stream is code k, offset to unsigned.
    at::Tensor words = packed->to(at::kLong).bitwise_and(0xFFFFFFFFLL);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t k = 0; k < 70; ++k) {
        int64_t v = 0;
        for (int b = 0; b < bits; ++b) {
          const int64_t bit = k * bits + b;
          v |= ((words[r][bit / 32].item<int64_t>() >> (bit % 32)) & 1) << b;
        }
        ASSERT_EQ(v + lo, codes[r][k].item<int8_t>()) << r << "," << k;
      }
    }
  }
}

TEST(Compressors, Fp4PairsPackLowNibbleFirstWithTheSignInBit3) {
  at::Tensor x = at::tensor({0.5f, -6.0f, 1.5f, -0.0f}).reshape({1, 4});
  absl::StatusOr<at::Tensor> packed = PackFp4ToUint8(x);
  ASSERT_THAT(packed, IsOk());
  ASSERT_EQ(packed->sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ((*packed)[0][0].item<uint8_t>(), 0x1 | (0xF << 4));
  EXPECT_EQ((*packed)[0][1].item<uint8_t>(), 0x3 | (0x8 << 4));
}

TEST(Compressors, Nvfp4StoresFp8ScalesAndTheGlobalScale) {
  at::manual_seed(1);
  const QuantizationScheme s = Preset("NVFP4A16");
  at::Tensor w = at::randn({4, 64}).to(at::kBFloat16);
  absl::StatusOr<QParams> q = WeightQParams(w, *s.weights);
  ASSERT_THAT(q, IsOk());
  auto stored = CompressWeight(w, *q, s, InferFormat(s));
  ASSERT_THAT(stored, IsOk());
  std::map<std::string, at::Tensor> m(stored->begin(), stored->end());
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m["weight_packed"].scalar_type(), at::kByte);
  EXPECT_EQ(m["weight_packed"].sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(m["weight_scale"].scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_EQ(m["weight_global_scale"].scalar_type(), at::kFloat);
}

}  // namespace
}  // namespace tracecut::quantization
