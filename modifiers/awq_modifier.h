#ifndef TRACECUT_MODIFIERS_AWQ_MODIFIER_H_
#define TRACECUT_MODIFIERS_AWQ_MODIFIER_H_

// AWQ, activation-aware weight quantization (https://arxiv.org/abs/2306.00978),
// as a transform before the recipe's weight quantizer, computed as
// llm-compressor 0.14's AWQModifier computes it
// (llmcompressor/modifiers/transform/awq/base.py):
//
//   for a smooth layer (a norm, or a Linear such as v_proj) and the Linears
//   that read its output (its balance layers), per input channel j
//     x_j = mean |X[:, j]| over every calibration token of the balance
//           layers' input
//     w_j = mean over the balance layers' rows of |W[i, j]| / max |W| of
//           the quantization group (or channel) holding W[i, j]
//   on a grid of ratios r in [0, 1], candidate scales
//     s = x^r / (w^(1 - r) + 1e-4)     ("duo scaling"), or s = x^r,
//     clamped to >= 1e-4 and divided by sqrt(max(s) min(s));
//   each candidate quantizes the balance weights as Q(W s) / s (the
//   quantizer's scheme, compressed-tensors' grid: quantization/) and
//   measures the mean squared error of the balance layers' parent module's
//   output (their lowest common ancestor: self_attn for q/k/v, mlp for
//   gate/up, o_proj itself for v_proj -> o_proj) against the unquantized
//   one, over all calibration batches; the best s is applied:
//   W[:, j] *= s_j on the balance layers and / s_j on the smooth layer's
//   weight (its output rows for a Linear) and bias. The model computes the
//   same, up to float rounding; the quantizer that follows sees weights
//   whose important channels quantize better.
//
// In a run: the activation means are summed during each subgraph's
// transform pass (from the first balance layer's input); at the subgraph's
// end each mapping in turn replays the subgraph (RunContext::
// ReplaySubgraph) once per grid point with the candidate weights, up to the
// parent module's last leaf call, whose output is the parent's output (a
// Linear ends self_attn and mlp in the architectures the defaults are for).
// Data-parallel runs all-reduce the activation sums and each candidate's
// error, so every rank picks the same scales.
//
// Fused MoE experts (fused_experts.h) take part by their per-expert
// checkpoint paths: an MoE router (a module that is no leaf, computing
// x W^T) is a balance layer that is only scaled; every expert's gate/up
// projection is observed on the experts module's input (all tokens) and
// measured on the MoE block's output; an expert's down projection, which
// no call can be replayed to, is searched on the Hessian of its inputs
// (H = sum of x^T x, its error tr(D H D^T) / (tokens x rows) for D =
// Q(W s) / s - W), and all of a layer's experts are applied together with
// the experts module's output checked unchanged. Not in data-parallel runs.
//
//   AwqOptions options;
//   options.weights = ...;  // the quantizer's weight args
//   options.quantized = ModuleSelector{{"Linear"}, {"lm_head"}};
//   modifiers.push_back(std::make_unique<AwqModifier>(std::move(options)));

#include <ATen/core/Tensor.h>

#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "modifiers/fused_experts.h"
#include "modifiers/modifier.h"
#include "quantization/quant_args.h"
#include "runtime/collective.h"

namespace tracecut::modifiers {

struct AwqMapping {
  std::string smooth_layer;                 // Pattern.
  std::vector<std::string> balance_layers;  // Patterns.
};

enum class AwqDuoScaling {
  kOn,    // s = x^r / w^(1-r), plus the identity (r = 0, x^0).
  kOff,   // s = x^r.
  kBoth,  // Half the grid each way.
};

struct AwqOptions {
  // Empty: the architecture's (AwqDefaultMappings).
  std::vector<AwqMapping> mappings;
  AwqDuoScaling duo_scaling = AwqDuoScaling::kOn;
  int n_grid = 20;
  // The weight quantizer's args (resolved), and the modules it quantizes:
  // only those balance layers are quantized in the search, and a mapping
  // none of whose layers it quantizes is skipped.
  quantization::QuantizationArgs weights;
  ModuleSelector quantized;
  runtime::Collective* collective =
      nullptr;  // Not owned; null: this process alone.
  // Fused MoE experts: every expert's projections see all the tokens of a
  // call (the recipe's calibrate_all_experts), not only those routed to it.
  bool all_expert_tokens = false;
};

// llm-compressor's default mappings: Phi-3's for its fused projections
// (qkv_proj <- input_layernorm, o_proj <- qkv_proj, gate_up_proj <-
// post_attention_layernorm, down_proj <- gate_up_proj); Llama's (q/k/v <-
// input_layernorm, o_proj <- v_proj, gate/up <- post_attention_layernorm,
// down_proj <- up_proj) for every other dense architecture, as there;
// Gemma 2 / 3's (gate/up <- pre_feedforward_layernorm; Gemma 3 without
// input_layernorm); post-norm models' (Olmo, Olmo 2, Olmo 3, Exaone 4: only
// o_proj <- v_proj and down_proj <- up_proj); BERT's and RoBERTa's
// (attention.output.dense <- attention.self.value); Mixtral's and Qwen3-MoE's
// (llm-compressor's MoE mappings: gate/up of every expert and the router
// <- post_attention_layernorm, each expert's down <- its up, where the
// experts are fused_experts.h's per-expert Linears). Other MoE
// architectures have none here: InvalidArgument asking for mappings.
absl::StatusOr<std::vector<AwqMapping>> AwqDefaultMappings(
    absl::string_view architecture);

// The (ratio, duo scaling) grid points, in llm-compressor's order.
std::vector<std::pair<double, bool>> AwqGrid(AwqDuoScaling duo, int n_grid);

// The candidate scales for grid point (ratio, duo) from the activation means
// x (fp32 [C]) and the weight means w (fp64 [C]; unused without duo), in
// llm-compressor's dtypes (fp64 with duo scaling, fp32 without).
absl::StatusOr<at::Tensor> AwqScales(const at::Tensor& x_mean,
                                     const at::Tensor& w_mean, double ratio,
                                     bool duo);

// The mean over `weights`' rows of each column's magnitude relative to its
// quantization group's (fp64 [C]).
absl::StatusOr<at::Tensor> AwqWeightMeans(
    const std::vector<at::Tensor>& weights,
    const quantization::QuantizationArgs& args);

class AwqModifier : public Modifier {
 public:
  explicit AwqModifier(AwqOptions options);

  std::string name() const override { return "awq"; }
  bool IsTransform() const override { return true; }
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override;
  absl::Status OnRunStart(RunContext& ctx) override;
  absl::Status OnModuleCall(RunContext& ctx, const ModuleCall& call) override;
  absl::Status OnSubgraphEnd(RunContext& ctx,
                             const SubgraphInfo& subgraph) override;
  absl::Status OnRunEnd(RunContext& ctx) override;
  // The mappings done (their smooth layers' paths).
  absl::StatusOr<c10::IValue> SaveState() const override;
  absl::Status RestoreState(const c10::IValue& state) override;

  struct Resolved {
    std::string smooth;                // Path.
    std::vector<std::string> balance;  // Paths, module order.
    std::string parent;                // Lowest common ancestor.
    std::string loss_leaf;             // The parent's last leaf call.
    // The leaf module whose calls give the activation statistics: the
    // first balance layer that is a leaf, or the experts module of fused
    // per-expert Linears (its hidden states, or an expert's down input).
    std::string observed;
    // One fused expert's down projection: its error from the Hessian of
    // its inputs (no module of its own to replay).
    bool expert_down = false;
  };
  // Filled by OnRunStart, in mapping order.
  const std::vector<Resolved>& resolved() const { return resolved_; }

 private:
  struct Stats {
    at::Tensor sum;      // fp32 [C]: sum of |x| over tokens.
    int64_t count = 0;   // Tokens.
    at::Tensor hessian;  // fp32 [C, C]: sum of x^T x (expert_down only).
  };
  // The grid point with the least error on the parent's output.
  struct Search {
    double error = std::numeric_limits<double>::infinity();
    double initial_error = std::numeric_limits<double>::quiet_NaN();
    double ratio = -1;  // -1: no grid point gave a finite error.
    bool duo = false;
    at::Tensor scales;
    // Keeps (error, ratio, duo, scales) if it is the best so far.
    void Offer(double e, double r, bool d, const at::Tensor& s);
  };
  // x_mean from `stats`, w_mean of the quantized balance weights (unused
  // without duo scaling).
  absl::StatusOr<std::pair<at::Tensor, at::Tensor>> Means(
      const Stats& stats, const std::vector<at::Tensor>& quantized) const;
  // Q(W s) / s in `dtype`, on the quantizer's grid.
  absl::StatusOr<at::Tensor> Candidate(const at::Tensor& w,
                                       const at::Tensor& scales,
                                       at::ScalarType dtype) const;
  // The first floating-point tensor of a module call's output (a tuple's
  // first element, as llm-compressor takes a parent's output).
  static absl::StatusOr<at::Tensor> OutputTensor(const ModuleCall& call);
  // A smooth or balance layer's weight as a view of the model's tensor
  // (a fused expert's slice of its fused parameter); SetWeight replaces it
  // (fused experts: staged until experts_.Commit).
  absl::StatusOr<at::Tensor> LiveWeight(RunContext& ctx,
                                        const std::string& path);
  absl::Status SetWeight(RunContext& ctx, const std::string& path,
                         const at::Tensor& weight);
  // Whether the quantizer quantizes balance layer `path` (a leaf Linear or
  // a fused expert's projection it selects).
  bool IsQuantized(RunContext& ctx, const std::string& path) const;
  absl::Status Resolve(RunContext& ctx, const std::vector<AwqMapping>& mappings,
                       bool defaults);
  // Sets r.observed and r.expert_down from its balance layers.
  absl::Status ResolveObserved(Resolved& r) const;
  absl::Status AddStats(size_t index, const at::Tensor& x, bool hessian);
  // The activation statistics of mapping `index`, all-reduced over ranks.
  absl::StatusOr<Stats> TakeStats(RunContext& ctx, size_t index,
                                  int64_t channels);
  absl::Status Smooth(RunContext& ctx, const Resolved& mapping);
  // Every expert_down mapping of the experts module `experts`: each
  // expert's scales searched on its Hessian, then applied together and the
  // module's output checked unchanged.
  absl::Status SmoothExpertDowns(RunContext& ctx, const std::string& experts);
  // Tries every grid point on the balance layers (restored by the caller).
  absl::StatusOr<Search> SearchScales(RunContext& ctx, const Resolved& mapping,
                                      const std::vector<at::Tensor>& reference,
                                      const std::vector<at::Tensor>& originals,
                                      const std::vector<bool>& quantized,
                                      const at::Tensor& x_mean,
                                      const at::Tensor& w_mean);
  // The mean squared error of the parent's output against `reference` over
  // all batches (and ranks).
  absl::StatusOr<double> ReplayError(RunContext& ctx, const Resolved& mapping,
                                     const std::vector<at::Tensor>& reference);
  // The best scales applied: W s on the balance layers, / s on the smooth
  // layer, the model's output checked unchanged.
  absl::Status ApplyScales(RunContext& ctx, const Resolved& mapping,
                           const at::Tensor& sw,
                           const std::vector<at::Tensor>& originals,
                           const std::vector<at::Tensor>& reference,
                           const Search& best);
  bool Distributed() const;

  AwqOptions options_;
  std::vector<Resolved> resolved_;
  FusedExperts experts_;
  // Observed leaf path -> mapping indices.
  std::map<std::string, std::vector<size_t>> observers_;
  std::map<std::string, size_t> expert_down_;  // Down Linear -> index.
  std::map<size_t, Stats> stats_;              // By mapping index.
  std::set<std::string> done_;                 // Smooth paths.
};

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_AWQ_MODIFIER_H_
