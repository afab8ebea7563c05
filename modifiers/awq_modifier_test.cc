// AWQ's grid, scales, weight means and default mappings against
// llm-compressor's formulas. The modifier in a calibration run is
// pipelines/awq_calibrate_test.cc; parity with llm-compressor is
// tests/cli/awq_parity_test.py.

#include "modifiers/awq_modifier.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

quantization::QuantizationArgs Int4Group32Asym() {
  quantization::QuantizationArgs a;
  a.num_bits = 4;
  a.symmetric = false;
  a.strategy = quantization::Strategy::kGroup;
  a.group_size = 32;
  EXPECT_OK(a.Resolve("weights"));
  return a;
}

TEST(AwqGridTest, PointsInLlmCompressorsOrder) {
  std::vector<std::pair<double, bool>> on = AwqGrid(AwqDuoScaling::kOn, 20);
  ASSERT_EQ(on.size(), 20u);
  EXPECT_EQ(on[0], std::make_pair(0.0, false));  // The identity first.
  EXPECT_EQ(on[1], std::make_pair(0.0, true));
  EXPECT_EQ(on[19], std::make_pair(1.0, true));
  EXPECT_DOUBLE_EQ(on[2].first, 1.0 / 18);
  std::vector<std::pair<double, bool>> both = AwqGrid(AwqDuoScaling::kBoth, 20);
  ASSERT_EQ(both.size(), 20u);
  EXPECT_EQ(both[0], std::make_pair(0.0, false));
  EXPECT_EQ(both[1], std::make_pair(0.0, true));
  EXPECT_DOUBLE_EQ(both[2].first, 1.0 / 9);
  std::vector<std::pair<double, bool>> off = AwqGrid(AwqDuoScaling::kOff, 5);
  ASSERT_EQ(off.size(), 5u);
  EXPECT_DOUBLE_EQ(off[1].first, 0.25);
  EXPECT_FALSE(off[4].second);
}

TEST(AwqScalesTest, FollowLlmCompressorsFormula) {
  at::Tensor x = at::tensor({0.5f, 2.0f, 8.0f, 0.0f});
  at::Tensor w = at::tensor({0.25, 0.5, 1.0, 0.75}, at::kDouble);
  const double r = 0.4;
  ASSERT_OK_AND_ASSIGN(at::Tensor duo, AwqScales(x, w, r, /*duo=*/true));
  EXPECT_EQ(duo.scalar_type(), at::kDouble);
  std::vector<double> want(4);
  double lo = 1e300, hi = 0;
  for (int j = 0; j < 4; ++j) {
    const double xj = x[j].item<float>();
    want[j] = std::max(static_cast<float>(std::pow(xj, r)) /
                           (std::pow(w[j].item<double>(), 1 - r) + 1e-4),
                       1e-4);
    lo = std::min(lo, want[j]);
    hi = std::max(hi, want[j]);
  }
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(duo[j].item<double>(), want[j] / std::sqrt(lo * hi),
                1e-6 * want[j])
        << j;
  }
  // Without duo scaling: x^r alone, in x's dtype; x = 0 clamps to 1e-4.
  ASSERT_OK_AND_ASSIGN(at::Tensor plain, AwqScales(x, {}, r, /*duo=*/false));
  EXPECT_EQ(plain.scalar_type(), at::kFloat);
  EXPECT_NEAR(plain[2].item<float>() / plain[3].item<float>(),
              std::pow(8.0, r) / 1e-4, 1e-2);
}

TEST(AwqWeightMeansTest, MagnitudesRelativeToTheirGroup) {
  // Two rows of 4 columns in groups of 2: each |w| over its group's max.
  at::Tensor w = at::tensor({1.0f, -2.0f, 3.0f, 0.0f,  //
                             -4.0f, 4.0f, 1.0f, 1.0f})
                     .view({2, 4});
  quantization::QuantizationArgs a = Int4Group32Asym();
  a.group_size = 2;
  ASSERT_OK_AND_ASSIGN(at::Tensor m, AwqWeightMeans({w}, a));
  EXPECT_EQ(m.scalar_type(), at::kDouble);
  const double e = 1e-6;
  const double want[] = {
      (1 / (2 + e) + 4 / (4 + e)) / 2, (2 / (2 + e) + 4 / (4 + e)) / 2,
      (3 / (3 + e) + 1 / (1 + e)) / 2, (0 / (3 + e) + 1 / (1 + e)) / 2};
  // The normalization runs in the weight's dtype (fp32), the sum in fp64.
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(m[j].item<double>(), want[j], 1e-7);
}

TEST(AwqDefaultMappingsTest, EachArchitectureGetsItsOwn) {
  ASSERT_OK_AND_ASSIGN(std::vector<AwqMapping> llama,
                       AwqDefaultMappings("LlamaForCausalLM"));
  ASSERT_EQ(llama.size(), 4u);
  EXPECT_EQ(llama[1].smooth_layer, "re:.*v_proj$");
  EXPECT_EQ(llama[1].balance_layers,
            std::vector<std::string>({"re:.*o_proj$"}));
  // Gemma's MLP reads pre_feedforward_layernorm; post-norm models smooth
  // no norm.
  ASSERT_OK_AND_ASSIGN(std::vector<AwqMapping> gemma2,
                       AwqDefaultMappings("Gemma2ForCausalLM"));
  ASSERT_EQ(gemma2.size(), 4u);
  EXPECT_EQ(gemma2[2].smooth_layer, "re:.*pre_feedforward_layernorm$");
  ASSERT_OK_AND_ASSIGN(std::vector<AwqMapping> gemma3,
                       AwqDefaultMappings("Gemma3ForCausalLM"));
  EXPECT_EQ(gemma3.size(), 3u);
  ASSERT_OK_AND_ASSIGN(std::vector<AwqMapping> olmo2,
                       AwqDefaultMappings("Olmo2ForCausalLM"));
  ASSERT_EQ(olmo2.size(), 2u);
  EXPECT_EQ(olmo2[0].smooth_layer, "re:.*v_proj$");
  EXPECT_EQ(olmo2[1].smooth_layer, "re:.*up_proj$");
  // Fused experts: the router and every expert's gate/up read
  // post_attention_layernorm; each expert's down reads its up.
  for (const char* moe : {"MixtralForCausalLM", "Qwen3MoeForCausalLM"}) {
    ASSERT_OK_AND_ASSIGN(std::vector<AwqMapping> m, AwqDefaultMappings(moe));
    ASSERT_EQ(m.size(), 4u) << moe;
    EXPECT_THAT(m[2].balance_layers,
                testing::IsSupersetOf({"re:.*mlp\\.gate$",
                                       "re:.*experts\\.\\d+\\.(up_proj|w3)$"}))
        << moe;
    EXPECT_EQ(m[3].smooth_layer, "re:.*(up_proj|w3)$") << moe;
  }
  // BERT: post-norm, a GELU inside the MLP: value -> attention output only.
  ASSERT_OK_AND_ASSIGN(std::vector<AwqMapping> bert,
                       AwqDefaultMappings("BertModel"));
  ASSERT_EQ(bert.size(), 1u);
  EXPECT_EQ(bert[0].smooth_layer, "re:.*attention\\.self\\.value$");
  // Shared experts are not covered.
  EXPECT_THAT(
      AwqDefaultMappings("Qwen2MoeForCausalLM").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give mappings")));
}

}  // namespace
}  // namespace tracecut::modifiers
