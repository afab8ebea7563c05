#include "checkpoint/compressed_tensors.h"

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::checkpoint {
namespace {

// Reverses PackToInt32 along rows: code k is bits k*b .. k*b + b - 1.
torch::Tensor Unpack(const torch::Tensor& packed, int bits, int64_t cols) {
  torch::Tensor out = torch::empty({packed.size(0), cols}, torch::kChar);
  for (int64_t r = 0; r < packed.size(0); ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      uint64_t value = 0;
      for (int i = 0; i < bits; ++i) {
        const int64_t bit = c * bits + i;
        const uint32_t word =
            static_cast<uint32_t>(packed[r][bit / 32].item<int32_t>());
        value |= static_cast<uint64_t>((word >> (bit % 32)) & 1) << i;
      }
      out[r][c] =
          static_cast<int8_t>(static_cast<int>(value) - (1 << (bits - 1)));
    }
  }
  return out;
}

TEST(PackToInt32Test, FourBitsByHand) {
  // Codes -8..7 are 0..15 once offset: nibble k of word 0 holds k.
  torch::Tensor codes = torch::arange(-8, 8, torch::kChar).reshape({1, 16});
  absl::StatusOr<torch::Tensor> packed = PackToInt32(codes, 4);
  ASSERT_OK(packed);
  ASSERT_EQ(packed->sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(static_cast<uint32_t>((*packed)[0][0].item<int32_t>()),
            0x76543210u);
  EXPECT_EQ(static_cast<uint32_t>((*packed)[0][1].item<int32_t>()),
            0xFEDCBA98u);
}

TEST(PackToInt32Test, EveryWidthRoundTripsAcrossWordBoundaries) {
  torch::manual_seed(0);
  for (int bits = 1; bits <= 8; ++bits) {
    const int64_t lo = -(int64_t{1} << (bits - 1));
    const int64_t hi = (int64_t{1} << (bits - 1));
    torch::Tensor codes = torch::randint(lo, hi, {3, 45}, torch::kChar);
    absl::StatusOr<torch::Tensor> packed = PackToInt32(codes, bits);
    ASSERT_OK(packed);
    EXPECT_EQ(packed->size(1), (45 * bits + 31) / 32) << bits;
    EXPECT_TRUE(torch::equal(Unpack(*packed, bits, 45), codes)) << bits;
    // Along dim 0: the transpose of packing the transpose.
    absl::StatusOr<torch::Tensor> by_column = PackToInt32(codes.t(), bits, 0);
    ASSERT_OK(by_column);
    EXPECT_TRUE(torch::equal(by_column->t(), *packed)) << bits;
  }
  EXPECT_FALSE(PackToInt32(torch::zeros({2, 2}, torch::kInt), 4).ok());
  EXPECT_FALSE(PackToInt32(torch::zeros({2, 2}, torch::kChar), 9).ok());
}

// A grouped asymmetric int4 Linear whose weight is exactly its dequantized
// codes.
CtLinear MakeLinear() {
  CtLinear l;
  l.path = "model.layers.0.mlp.down_proj";
  l.args = {4, /*symmetric=*/false, /*group_size=*/4};
  torch::manual_seed(1);
  torch::Tensor codes = torch::randint(-8, 8, {3, 8}, torch::kFloat);
  l.scale = torch::rand({3, 2}) + 0.1;
  l.zero_point = torch::randint(-8, 8, {3, 2}, torch::kInt);
  torch::Tensor group = torch::tensor({0, 0, 0, 0, 1, 1, 1, 1}, torch::kLong);
  l.weight = (codes - l.zero_point.index_select(1, group).to(torch::kFloat)) *
             l.scale.index_select(1, group);
  return l;
}

TEST(CompressLinearTest, WritesThePackedTensorsInOrder) {
  {
    CtLinear l = MakeLinear();
    auto tensors = CompressLinear(l);
    ASSERT_OK(tensors);
    std::vector<std::string> names;
    for (const auto& [name, t] : *tensors) names.push_back(name);
    std::vector<std::string> want = {
        l.path + ".weight_packed", l.path + ".weight_scale",
        l.path + ".weight_shape", l.path + ".weight_zero_point"};
    EXPECT_EQ(names, want);
    EXPECT_EQ((*tensors)[0].second.sizes(), (std::vector<int64_t>{3, 1}));
    EXPECT_TRUE(torch::equal((*tensors)[2].second,
                             torch::tensor({3, 8}, torch::kLong)));
    // Zero points packed along the output dimension: [ceil(3*4/32), 2].
    EXPECT_EQ((*tensors)[3].second.sizes(), (std::vector<int64_t>{1, 2}));
    // Decoding the packed codes gives the weight back.
    torch::Tensor group = torch::tensor({0, 0, 0, 0, 1, 1, 1, 1}, torch::kLong);
    torch::Tensor codes = Unpack((*tensors)[0].second, 4, 8).to(torch::kFloat);
    torch::Tensor zero = Unpack((*tensors)[3].second.t(), 4, 3).t();
    EXPECT_TRUE(torch::equal(zero.to(torch::kInt), l.zero_point));
    torch::Tensor decoded =
        (codes - zero.index_select(1, group).to(torch::kFloat)) *
        l.scale.index_select(1, group);
    EXPECT_TRUE(torch::equal(decoded, l.weight));
  }
}

TEST(CompressLinearTest, SymmetricStoresNoZeroPoint) {
  CtLinear l = MakeLinear();
  l.args.symmetric = true;
  l.zero_point = torch::zeros_like(l.zero_point);
  l.weight = torch::randint(-8, 8, {3, 8}, torch::kFloat) *
             l.scale.repeat_interleave(4, 1);
  auto tensors = CompressLinear(l);
  ASSERT_OK(tensors);
  ASSERT_EQ(tensors->size(), 3u);
  EXPECT_EQ(tensors->back().first, l.path + ".weight_shape");
}

TEST(CompressLinearTest, AWeightThatIsNotItsCodesIsRefused) {
  CtLinear l = MakeLinear();
  l.weight[1][5] += 1e-3;
  auto tensors = CompressLinear(l);
  ASSERT_EQ(tensors.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(tensors.status().message().find(l.path), std::string::npos);
  EXPECT_NE(tensors.status().message().find("flat index 13"), std::string::npos)
      << tensors.status();

  CtLinear shapes = MakeLinear();
  shapes.scale = torch::ones({3, 3});
  EXPECT_EQ(CompressLinear(shapes).status().code(),
            absl::StatusCode::kInvalidArgument);
  CtLinear bits = MakeLinear();
  bits.args.num_bits = 16;
  EXPECT_EQ(CompressLinear(bits).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConfigWithQuantizationTest, OneGroupPerScheme) {
  const CtWeightArgs w4 = {4, true, 128};
  const CtWeightArgs w8 = {8, false, -1};
  absl::StatusOr<std::string> config = ConfigWithQuantization(
      R"({"model_type": "llama", "hidden_size": 64})",
      {{"a.q_proj", w4}, {"a.down_proj", w8}, {"b.q_proj", w4}});
  ASSERT_OK(config);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(*config);
  EXPECT_EQ(j.begin().key(), "model_type");  // Original keys first.
  const auto& q = j["quantization_config"];
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  EXPECT_EQ(q["format"], "pack-quantized");
  const auto& g0 = q["config_groups"]["group_0"];
  EXPECT_EQ(g0["targets"], nlohmann::ordered_json({"a.q_proj", "b.q_proj"}));
  EXPECT_EQ(g0["weights"]["strategy"], "group");
  EXPECT_EQ(g0["weights"]["group_size"], 128);
  const auto& g1 = q["config_groups"]["group_1"];
  EXPECT_EQ(g1["weights"]["strategy"], "channel");
  EXPECT_TRUE(g1["weights"]["group_size"].is_null());
  EXPECT_EQ(g1["weights"]["symmetric"], false);
  EXPECT_FALSE(ConfigWithQuantization("[1]", {}).ok());
  EXPECT_FALSE(ConfigWithQuantization("{", {}).ok());
}

TEST(SerializeSafetensorsTest, ReadsBackAndIsDeterministic) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"b.weight", torch::arange(6, torch::kFloat).reshape({2, 3})},
      {"a.packed", torch::tensor({-1, 7}, torch::kInt)},
      {"a.shape", torch::tensor({2, 3}, torch::kLong)},
      {"c.half", torch::ones({3}, torch::kBFloat16).t()}};
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors(tensors, {{"format", "pt"}});
  ASSERT_OK(bytes);
  EXPECT_EQ(*SerializeSafetensors(tensors, {{"format", "pt"}}), *bytes);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) {
    header = header << 8 | static_cast<uint8_t>((*bytes)[i]);
  }
  EXPECT_EQ(header % 8, 0u);
  auto file = SafetensorsFile::FromBytes(*bytes, "mem.safetensors");
  ASSERT_OK(file);
  for (const auto& [name, t] : tensors) {
    absl::StatusOr<torch::Tensor> got = (*file)->Get(name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_TRUE(torch::equal(*got, t)) << name;
  }
  EXPECT_FALSE(
      SerializeSafetensors({{"x", torch::ones({1})}, {"x", torch::ones({1})}})
          .ok());
  EXPECT_FALSE(
      SerializeSafetensors({{"c", torch::ones({1}, torch::kComplexFloat)}})
          .ok());
}

}  // namespace
}  // namespace tracecut::checkpoint
