// AWQ's formulas (grid, scales, weight means) and its default mappings by
// architecture (awq_modifier.h).

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "modifiers/awq_modifier.h"
#include "quantization/quant_args.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::tracecut::quantization::QuantizationArgs;
using ::tracecut::quantization::Strategy;

absl::StatusOr<std::vector<AwqMapping>> AwqDefaultMappings(
    absl::string_view architecture) {
  // MoE layers with fused experts: every expert's gate and up projection
  // and the router read post_attention_layernorm (the router is scaled, not
  // quantized, so routing is unchanged); each expert's down projection
  // reads its up projection. The per-expert Linears are named as the
  // checkpoint names them (Qwen3-MoE: experts.N.gate_proj / up_proj /
  // down_proj; Mixtral: block_sparse_moe.experts.N.w1 / w3 / w2). A dense
  // layer among them gets Llama's.
  if (architecture == "MixtralForCausalLM" ||
      architecture == "Qwen3MoeForCausalLM") {
    return std::vector<AwqMapping>{
        {"re:.*input_layernorm$",
         {"re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$"}},
        {"re:.*v_proj$", {"re:.*o_proj$"}},
        {"re:.*post_attention_layernorm$",
         {"re:.*mlp\\.gate$", "re:.*experts\\.\\d+\\.(gate_proj|w1)$",
          "re:.*experts\\.\\d+\\.(up_proj|w3)$", "re:.*mlp\\.gate_proj$",
          "re:.*mlp\\.up_proj$"}},
        {"re:.*(up_proj|w3)$", {"re:.*(down_proj|w2)$"}}};
  }
  // Other MoE models: shared experts (Qwen2-MoE, DeepSeek) or experts
  // tracecut does not split per expert need mappings of their own.
  static constexpr absl::string_view kMoe[] = {
      "Qwen2MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
      "Llama4ForCausalLM", "GptOssForCausalLM"};
  for (absl::string_view moe : kMoe) {
    if (architecture == moe) {
      return absl::InvalidArgumentError(absl::StrCat(
          "awq: no default mappings for ", architecture,
          " (mixture of experts) yet; give mappings (smooth_layer and "
          "balance_layers) in the recipe"));
    }
  }
  if (architecture == "Phi3ForCausalLM" || architecture == "Phi3VForCausalLM") {
    // Fused q/k/v and gate/up projections.
    return std::vector<AwqMapping>{
        {"re:.*input_layernorm$", {"re:.*qkv_proj$"}},
        {"re:.*qkv_proj$", {"re:.*o_proj$"}},
        {"re:.*post_attention_layernorm$", {"re:.*gate_up_proj$"}},
        {"re:.*gate_up_proj$", {"re:.*down_proj$"}}};
  }
  // BERT and RoBERTa encoders: post-norm, and their MLP has a GELU between
  // its projections, so only the value -> attention output mapping.
  if (absl::StartsWith(architecture, "Bert") ||
      absl::StartsWith(architecture, "Roberta") ||
      absl::StartsWith(architecture, "XLMRoberta")) {
    return std::vector<AwqMapping>{{"re:.*attention\\.self\\.value$",
                                    {"re:.*attention\\.output\\.dense$"}}};
  }
  // Post-norm layers (the norms apply to the attention's and MLP's
  // outputs): only the Linear-to-Linear mappings. llm-compressor has these
  // for Olmo, Olmo3 and Exaone4; Olmo2 is the same layout.
  if (architecture == "OlmoForCausalLM" || architecture == "Olmo2ForCausalLM" ||
      architecture == "Olmo3ForCausalLM" ||
      architecture == "Exaone4ForCausalLM") {
    return std::vector<AwqMapping>{{"re:.*v_proj$", {"re:.*o_proj$"}},
                                   {"re:.*up_proj$", {"re:.*down_proj$"}}};
  }
  // Gemma 2 and 3: the MLP reads pre_feedforward_layernorm (whose
  // x * (1 + weight) the smoothing handles); Gemma 3's input_layernorm is
  // left out, as llm-compressor leaves it.
  const bool gemma3 = architecture == "Gemma3ForCausalLM" ||
                      architecture == "Gemma3ForConditionalGeneration";
  if (architecture == "Gemma2ForCausalLM" || gemma3) {
    std::vector<AwqMapping> m;
    if (!gemma3) {
      m.push_back({"re:.*input_layernorm$",
                   {"re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$"}});
    }
    m.push_back({"re:.*v_proj$", {"re:.*o_proj$"}});
    m.push_back({"re:.*pre_feedforward_layernorm$",
                 {"re:.*gate_proj$", "re:.*up_proj$"}});
    m.push_back({"re:.*up_proj$", {"re:.*down_proj$"}});
    return m;
  }
  return std::vector<AwqMapping>{
      {"re:.*input_layernorm$",
       {"re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$"}},
      {"re:.*v_proj$", {"re:.*o_proj$"}},
      {"re:.*post_attention_layernorm$", {"re:.*gate_proj$", "re:.*up_proj$"}},
      {"re:.*up_proj$", {"re:.*down_proj$"}}};
}

std::vector<std::pair<double, bool>> AwqGrid(AwqDuoScaling duo, int n_grid) {
  std::vector<std::pair<double, bool>> grid;
  switch (duo) {
    case AwqDuoScaling::kBoth: {
      const int n = n_grid / 2;
      for (int i = 0; i < n; ++i) {
        for (bool d : {false, true}) grid.emplace_back(double(i) / (n - 1), d);
      }
      break;
    }
    case AwqDuoScaling::kOff:
      for (int i = 0; i < n_grid; ++i) {
        grid.emplace_back(double(i) / (n_grid - 1), false);
      }
      break;
    case AwqDuoScaling::kOn:
      // The identity (x^0) first, so that no scaling is a candidate too.
      grid.emplace_back(0.0, false);
      for (int i = 0; i < n_grid - 1; ++i) {
        grid.emplace_back(double(i) / (n_grid - 2), true);
      }
      break;
  }
  return grid;
}

absl::StatusOr<at::Tensor> AwqScales(const at::Tensor& x_mean,
                                     const at::Tensor& w_mean, double ratio,
                                     bool duo) {
  return runtime::TorchCall("awq scales", [&] {
    at::Tensor s = duo ? (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4))
                             .clamp_min(1e-4)
                       : x_mean.pow(ratio).clamp_min(1e-4).view(-1);
    s = s / (s.max() * s.min()).sqrt();
    s.masked_fill_(s.isinf(), 1);
    s.masked_fill_(s.isnan(), 1);
    return s;
  });
}

absl::StatusOr<at::Tensor> AwqWeightMeans(
    const std::vector<at::Tensor>& weights, const QuantizationArgs& args) {
  if (weights.empty()) {
    return absl::InvalidArgumentError("awq: no balance weights to average");
  }
  const Strategy strategy = args.resolved_strategy();
  if (strategy == Strategy::kBlock) {
    return absl::UnimplementedError(
        "awq: block-quantized weights (strategy block) are not supported yet");
  }
  return runtime::TorchCall("awq weight means", [&] {
    at::Tensor sum;
    int64_t rows = 0;
    for (const at::Tensor& weight : weights) {
      int64_t chunk = weight.size(1);  // channel
      if (strategy == Strategy::kTensor) chunk = weight.numel();
      if (strategy == Strategy::kGroup || strategy == Strategy::kTensorGroup) {
        chunk = *args.group_size;
      }
      at::Tensor w = weight.clone().reshape({-1, chunk});
      w.abs_();
      w.div_(std::get<0>(w.max(/*dim=*/1, /*keepdim=*/true)) + 1e-6);
      w = w.reshape(weight.sizes());
      rows += w.size(0);
      at::Tensor s = w.sum(0, /*keepdim=*/false, at::kDouble);
      sum = sum.defined() ? sum + s : s;
    }
    return sum / rows;
  });
}

}  // namespace tracecut::modifiers
