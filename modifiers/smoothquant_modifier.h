#ifndef TRACECUT_MODIFIERS_SMOOTHQUANT_MODIFIER_H_
#define TRACECUT_MODIFIERS_SMOOTHQUANT_MODIFIER_H_

// SmoothQuant (https://arxiv.org/abs/2211.10438) as a calibration modifier,
// computed as llm-compressor 0.14's SmoothQuantModifier computes it
// (llmcompressor/modifiers/transform/smoothquant/base.py). It moves
// activation outliers into the weights so that activations quantize better:
//
//   for a smooth layer (an RMSNorm / LayerNorm) and the Linears it feeds
//   (its balance layers), per input channel j
//     act_j = max_j - min_j of the smooth layer's output over all
//             calibration tokens
//     w_j   = 2 * max over balance layers of max_i |W[i, j]|
//     s_j   = act_j^alpha / w_j^(1 - alpha)   (act_j where w_j == 0),
//             at least 1e-5
//   balance weights W[:, j] *= s_j; smooth weight (and bias) [j] /= s_j.
//
// The model computes the same (up to float rounding): norm(x) / s feeds
// W * s. Mappings name the smooth layer and its balance layers by pattern
// (ir/module_pattern.h); a smooth layer matched at path P pairs with the
// balance-pattern matches under P's parent (model.layers.3.input_layernorm
// with model.layers.3.self_attn.{q,k,v}_proj). Without mappings, those of
// the model's architecture (config.json) are used: Llama's (q/k/v <-
// input_layernorm, gate/up <- post_attention_layernorm) for Llama, Mistral,
// Qwen2/3, Gemma and any architecture llm-compressor has no entry for;
// attention only for Mixtral and Qwen MoE; Phi-3's fused qkv_proj and
// gate_up_proj.
//
// In a run: the per-channel range is collected during each subgraph's
// calibration pass (from the balance layers' input, which is the smooth
// layer's output: checked, all balance layers of a mapping must see the
// same range), and the weights change at the subgraph's end, before the
// propagation pass. Data-parallel runs all-reduce the minima and maxima
// (min / max over ranks) first, so every rank smooths alike.
//
//   SmoothQuantOptions options;
//   options.smoothing_strength = 0.8;
//   modifiers.push_back(std::make_unique<SmoothQuantModifier>(options));

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "modifiers/modifier.h"
#include "runtime/collective.h"

namespace tracecut::modifiers {

struct SmoothQuantMapping {
  std::vector<std::string> balance_layers;  // Patterns.
  std::string smooth_layer;                 // Pattern.
};

struct SmoothQuantOptions {
  double smoothing_strength = 0.5;  // alpha, in [0, 1].
  // Empty: the architecture's (above).
  std::vector<SmoothQuantMapping> mappings;
  // A mapping is skipped only when its smooth layer and all its balance
  // layers are ignored (as llm-compressor does).
  std::vector<std::string> ignore;
  runtime::Collective* collective =
      nullptr;  // Not owned; null: this process alone.
};

// The default mappings for a Hugging Face architecture name
// ("LlamaForCausalLM"); Llama's for an unknown or empty one.
std::vector<SmoothQuantMapping> DefaultSmoothQuantMappings(
    absl::string_view architecture);

// s as above from the channel minima / maxima of the smooth layer's output
// [C] and the balance layers' weights [out_k, C], in their dtypes as
// llm-compressor computes it.
absl::StatusOr<at::Tensor> SmoothQuantScales(
    const at::Tensor& act_min, const at::Tensor& act_max,
    const std::vector<at::Tensor>& balance_weights, double alpha);

class SmoothQuantModifier : public Modifier {
 public:
  explicit SmoothQuantModifier(SmoothQuantOptions options);

  std::string name() const override { return "smoothquant"; }
  bool IsTransform() const override { return true; }
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override;
  absl::Status OnRunStart(RunContext& ctx) override;
  absl::Status OnModuleCall(RunContext& ctx, const ModuleCall& call) override;
  absl::Status OnSubgraphEnd(RunContext& ctx,
                             const SubgraphInfo& subgraph) override;
  absl::Status OnRunEnd(RunContext& ctx) override;
  // The smooth layers done (a list of paths).
  absl::StatusOr<c10::IValue> SaveState() const override;
  absl::Status RestoreState(const c10::IValue& state) override;

  // Resolved mappings: smooth layer path -> balance layer paths (module
  // order). Filled by OnRunStart.
  const std::map<std::string, std::vector<std::string>>& resolved() const {
    return resolved_;
  }

 private:
  struct Range {
    at::Tensor min;  // [C], the activation's dtype.
    at::Tensor max;
  };
  absl::Status Smooth(RunContext& ctx, const std::string& smooth);
  // The range the balance layers of `smooth` read (its weight `sw`), reduced
  // over the ranks, and forgotten here; none when no token reached them.
  absl::StatusOr<std::optional<Range>> TakeRange(const std::string& smooth,
                                                 const at::Tensor& sw);
  bool Distributed() const;

  SmoothQuantOptions options_;
  std::map<std::string, std::vector<std::string>> resolved_;
  std::map<std::string, std::string> smooth_of_;  // Balance -> smooth path.
  std::map<std::string, Range> ranges_;           // By balance path.
  std::set<std::string> done_;                    // Smooth paths.
};

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_SMOOTHQUANT_MODIFIER_H_
