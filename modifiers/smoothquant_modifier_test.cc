// SmoothQuant's scales against the formula and its default mappings. The
// modifier in calibration runs is pipelines/smoothquant_calibrate_test.cc;
// parity with llm-compressor is tests/cli/smoothquant_parity_test.py.

#include "modifiers/smoothquant_modifier.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

TEST(SmoothQuantScalesTest, FollowLlmCompressorsFormula) {
  // Channel 2: no weight (the activation range itself); channel 3: no
  // activation range (clamped to 1e-5).
  at::Tensor act_min = at::tensor({-1.0f, -4.0f, -2.0f, 0.5f});
  at::Tensor act_max = at::tensor({3.0f, 4.0f, 1.0f, 0.5f});
  at::Tensor w1 = at::tensor({0.5f, -0.25f, 0.0f, 1.0f,  //
                              -2.0f, 0.5f, 0.0f, 0.1f})
                      .view({2, 4});
  at::Tensor w2 = at::tensor({1.0f, 1.5f, 0.0f, -0.5f}).view({1, 4});
  const double alpha = 0.8;
  ASSERT_OK_AND_ASSIGN(at::Tensor s,
                       SmoothQuantScales(act_min, act_max, {w1, w2}, alpha));
  const double act[] = {4, 8, 3, 0};
  const double w[] = {2 * 2.0, 2 * 1.5, 0, 2 * 1.0};
  for (int j = 0; j < 4; ++j) {
    double want =
        w[j] > 0 ? std::pow(act[j], alpha) / std::pow(w[j], 1 - alpha) : act[j];
    want = std::max(want, 1e-5);
    EXPECT_NEAR(s[j].item<double>(), want, 1e-6 * want) << "channel " << j;
  }
}

TEST(SmoothQuantScalesTest, DefaultMappingsByArchitecture) {
  EXPECT_EQ(DefaultSmoothQuantMappings("LlamaForCausalLM").size(), 2u);
  EXPECT_EQ(DefaultSmoothQuantMappings("SomethingNew").size(), 2u);
  std::vector<SmoothQuantMapping> moe =
      DefaultSmoothQuantMappings("MixtralForCausalLM");
  ASSERT_EQ(moe.size(), 1u);
  EXPECT_EQ(moe[0].smooth_layer, "re:.*input_layernorm$");
  EXPECT_EQ(DefaultSmoothQuantMappings("Phi3ForCausalLM")[0].balance_layers,
            std::vector<std::string>({"re:.*qkv_proj"}));
}

}  // namespace
}  // namespace tracecut::modifiers
