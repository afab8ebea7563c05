#ifndef TRACECUT_MODIFIERS_WEIGHT_QUANT_MODIFIER_H_
#define TRACECUT_MODIFIERS_WEIGHT_QUANT_MODIFIER_H_

// Weight quantization modifiers for Linear modules: the shared machinery
// (WeightQuantModifier) and round-to-nearest (RtnModifier). GPTQ is in
// gptq_modifier.h.
//
//   WeightQuantOptions options;
//   options.modules.ignore = {"lm_head"};
//   options.scheme.bits = 4;
//   options.scheme.group_size = 128;
//   modifiers.push_back(std::make_unique<RtnModifier>(options));
//
// During a subgraph's calibration pass a WeightQuantModifier accumulates,
// per selected Linear, the second moment H = 2/n sum x x^T of its inputs
// (gptq.h's HessianAccumulator). At the end of the subgraph it quantizes the
// weight of every selected Linear the subgraph called, writes the
// fake-quantized weight back in place (RunContext::UpdateTensor), and
// records scale / zero point and the relative output error on the
// calibration inputs, sqrt(tr(dW H dW^T) / tr(W H W^T)) = ||dW X|| / ||W X||.
//
// Selected modules that are not Linear (by short type) are skipped with a
// warning, except Hugging Face's Conv1D (GPT-2), a Linear whose weight is
// stored transposed, which is quantized as that Linear; a selection without
// any Linear is an error. A weight tied to
// another parameter (OPT's lm_head and embed_tokens) is quantized for both,
// with a warning. A selected Linear that no calibration token reached
// (never called, or called with empty inputs, like an MoE expert the router
// never picks) is quantized round-to-nearest from its own weights whatever
// the method, never from empty statistics: its record says method "rtn",
// calibration_tokens 0 and why, its output error is NaN (not measured), and
// the run warns.
//
// Note [Shared Hessians]: Linears that read the output of the same node
// (q/k/v on the attention's normed input; gate/up) get the same inputs in
// every batch, so they share one HessianAccumulator: it is accumulated once
// per batch (by the first of them called) instead of once per Linear, with
// the same floating-point operations, so every H is bit-identical to the
// unshared one. A Linear called twice on it in one batch (a module reused
// on the same input) leaves the group with its own copy. Not for fused MoE
// experts (one call, per-expert inputs) or data-parallel runs (the ranks'
// sums are reduced in place, per module). GPTQ then factors H once for
// the group and, for typed schemes with per-row parameters (channel or
// group strategies), solves the group as one weight: GPTQ treats rows
// independently, so stacking q/k/v (or gate/up) along the output dimension
// gives each the same result up to floating-point summation order, in one
// column loop instead of one per Linear (the loop's per-column work is
// small, so its count, not its width, sets the time).
//
// Note [Static input activations]: a compressed-tensors scheme whose input
// activations are static (FP8: a per-tensor fp8 scale; NVFP4: the global
// scale of its "local" dynamic groups) is calibrated as llm-compressor's
// QuantizationModifier and GPTQModifier do it: the observer the scheme names
// (static_minmax: min / max over every batch; minmax: their moving average)
// sees each call's input in the checkpoint's dtype during the calibration
// pass, and the parameters are taken with the weight's at the subgraph's
// end, recorded as ModuleRecord::input. Activations are not fake-quantized
// in either pass (llm-compressor disables quantization while it
// calibrates). A module no token reached (an MoE expert the router never
// picks) takes the range its namesakes in the subgraph saw (the other
// experts' `w1`, on the same block input), with a warning; without one the
// run stops, naming it. Data-parallel: the ranks' statistics are reduced
// as llm-compressor reduces them (min / max; minmax: the mean over the
// ranks that saw tokens).
//
// Note [KV cache]: with a kv_cache_scheme, the keys and values entering
// each scaled_dot_product_attention call (after the rotary embedding, as a
// KV cache stores them; repeating GQA heads changes no per-tensor range)
// are observed like static inputs, by the attention module the call
// belongs to, and its k_scale / v_scale recorded at the subgraph's end
// (llm-compressor's QuantizedKVCache hooks; vLLM reads the scales from the
// attention module). Per tensor, or per KV head (attn_head: the repeated
// GQA heads of the call taken once each). Data-parallel runs reduce the
// ranges over the ranks as static inputs are.

#include <ATen/core/Tensor.h>

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "modifiers/fused_experts.h"
#include "modifiers/modifier.h"
#include "quantization/gptq.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "quantization/quantize.h"
#include "runtime/collective.h"
#include "runtime/graph_module.h"

namespace tracecut::modifiers {

struct WeightQuantOptions {
  ModuleSelector modules;
  quantization::QuantScheme scheme;
  // A compressed-tensors scheme (quantization/quant_args.h) instead of
  // `scheme`: its weights args decide the quantization (bit-exact with
  // compressed-tensors, in the checkpoint's dtype, scales in the weight's
  // dtype); dynamic activation args are recorded for the output, static
  // input ones calibrated (Note [Static input activations]).
  std::optional<quantization::QuantizationScheme> typed;
  // compressed-tensors' kv_cache_scheme (static, per tensor or head): the keys
  // and values entering each attention are calibrated (Note [KV cache]).
  std::optional<quantization::QuantizationArgs> kv_cache;
  // Accumulate input statistics to report each module's output error. GPTQ
  // needs them anyway; for RTN this is the only use.
  bool measure_error = true;
  // MoE experts fused into 3-D parameters (fused_experts.h) calibrate on all
  // the tokens of their block, not only those routed to them: the recipe's
  // calibrate_all_experts for experts that are no modules of their own.
  bool all_expert_tokens = false;
  // The output stores each row as whole groups (compressed-tensors reshapes
  // it so on load): a group_size larger than a module's input features is
  // refused before any work, not when the output is written.
  bool whole_groups = false;
  // Data-parallel calibration (distributed.h; not owned): each rank
  // accumulates the sums of its shard, every module gets an owner rank that
  // solves it from the sum over all ranks and broadcasts the result
  // (weight_quant_distributed.cc). Null or a world of one: this process
  // alone.
  runtime::Collective* collective = nullptr;
};

// The quantized weight of one module and its parameters.
struct WeightQuantOutcome {
  at::Tensor weight;  // Fake-quantized, the weight's dtype and shape.
  at::Tensor scale;
  at::Tensor zero_point;
  at::Tensor global_scale;  // Typed tensor_group schemes (NVFP4) only.
  at::Tensor g_idx;         // Undefined unless GPTQ act_order with groups.
  double loss = 0;          // Method-specific; NaN when none.
  // tr((W - weight) H (W - weight)^T) when the method knows it without a
  // product (GPTQ, Note [Output error from the errors]); else NaN.
  double known_error = std::numeric_limits<double>::quiet_NaN();
  // The same for a baseline on the same inputs (GPTQ: round-to-nearest's),
  // measured with OutputErrorNumerator as soon as the baseline weight is
  // made, so that it is released before GPTQ's solve; NaN when none.
  double known_baseline_error = std::numeric_limits<double>::quiet_NaN();
  std::string warning;
};

// An integer of the model's config.json ("num_key_value_heads"); none
// without one.
std::optional<int64_t> ConfigInt(const runtime::GraphModule& model,
                                 const std::string& key);

// The dtype a model's config.json names ("dtype" or "torch_dtype":
// bfloat16, float16, float32); none without one.
std::optional<c10::ScalarType> ConfigDtype(const runtime::GraphModule& model);

// tr((W - Wq) H (W - Wq)^T) in fp32, as RelativeOutputErrors computes it.
absl::StatusOr<double> OutputErrorNumerator(const at::Tensor& weight,
                                            const at::Tensor& quantized,
                                            const at::Tensor& hessian);

// sqrt(tr(dW H dW^T) / tr(W H W^T)) with dW = W - Wq for each Wq of
// `quantized`, in fp32; 0 when both traces are 0. tr(W H W^T) is computed
// once. `known` (tr(dW H dW^T) for each Wq) and `known_trace` (tr(W H
// W^T)) hold what the method knows without a product (finite values; that
// Wq may then be undefined), so that its [out, in] x [in, in] product is
// skipped: on large Linears (in = 5632: ~65 GFLOP) each costs as much as a
// third of GPTQ's solve. The others are OutputErrorNumerator's (about half
// a product).
absl::StatusOr<std::vector<double>> RelativeOutputErrors(
    const at::Tensor& weight, const std::vector<at::Tensor>& quantized,
    const at::Tensor& hessian, const std::vector<double>& known = {},
    double known_trace = std::numeric_limits<double>::quiet_NaN());

class WeightQuantModifier : public Modifier {
 public:
  explicit WeightQuantModifier(WeightQuantOptions options);

  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override;
  absl::Status OnRunStart(RunContext& ctx) override;
  absl::Status OnModuleCall(RunContext& ctx, const ModuleCall& call) override;
  bool WantsFunction(const ir::Node& node) const override;
  absl::Status OnFunctionCall(RunContext& ctx,
                              const FunctionCall& call) override;
  absl::Status OnSubgraphEnd(RunContext& ctx,
                             const SubgraphInfo& subgraph) override;
  absl::Status OnRunEnd(RunContext& ctx) override;
  // Which modules are done (a list of paths).
  absl::StatusOr<c10::IValue> SaveState() const override;
  absl::Status RestoreState(const c10::IValue& state) override;
  // Inputs a Linear did not accumulate because a sibling's shared Hessian
  // holds them already (Note [Shared Hessians]), over the run.
  int64_t shared_hessian_reads() const { return shared_hessian_reads_; }
  // Linears solved together with others sharing their Hessian
  // (QuantizeTogether), over the run.
  int64_t solved_together() const { return solved_together_; }

 protected:
  // During QuantizeWeight: how many other Linears will be quantized with the
  // same Hessian after this one (Note [Shared Hessians]), so that what is
  // derived from it alone can be kept for them.
  int64_t hessian_readers_left() const { return hessian_readers_left_; }
  // "rtn", "gptq": the method recorded per module.
  virtual std::string method() const = 0;
  // Whether quantizing needs the inputs' H (GPTQ) or only uses it for the
  // error (RTN).
  virtual bool NeedsHessian() const = 0;
  // Quantizes one weight [out, in]; `hessian` is undefined when none was
  // accumulated.
  virtual absl::StatusOr<WeightQuantOutcome> QuantizeWeight(
      absl::string_view path, const at::Tensor& weight,
      const at::Tensor& hessian) = 0;
  // Note [Shared Hessians]: true when QuantizeTogether can solve the
  // Linears that share a Hessian at once (they are then never given to
  // QuantizeWeight); its weights must not need a global scale.
  virtual bool SolvesTogether() const { return false; }
  // The outcomes of the Linears `paths` (weights [out_i, in]) sharing
  // `hessian`, in that order.
  virtual absl::StatusOr<std::vector<WeightQuantOutcome>> QuantizeTogether(
      const std::vector<std::string>& paths,
      const std::vector<at::Tensor>& weights, const at::Tensor& hessian);

  const WeightQuantOptions& options() const { return options_; }

  // Round-to-nearest of `weight` with the scheme: what a module without
  // calibration data gets.
  absl::StatusOr<WeightQuantOutcome> QuantizeWithoutData(
      absl::string_view path, const at::Tensor& weight);
  // Round-to-nearest with options().typed, as compressed-tensors computes
  // it (observer, global scale, fake_quantize).
  absl::StatusOr<WeightQuantOutcome> QuantizeTyped(absl::string_view path,
                                                   const at::Tensor& weight);
  // `weight` in the dtype typed schemes quantize in (the checkpoint's).
  at::Tensor TypedWeight(const at::Tensor& weight) const;

 private:
  struct Pending {
    // Shared by the Linears that read the same input (Note [Shared
    // Hessians]).
    std::shared_ptr<quantization::HessianAccumulator> hessian;
    int subgraph = 0;
    int64_t tokens = 0;
    // Note [Static input activations].
    std::optional<quantization::ActivationObserver> input;
    int64_t input_batches = 0;
    // Note [Output energy]: the sum over its calls of |y - bias|^2 (fp64,
    // on the outputs' device) and the weight (TensorImpl, version) that
    // computed them; invalid after a call it cannot use.
    at::Tensor output_energy;
    const void* energy_weight = nullptr;
    int64_t energy_weight_version = -1;
    bool energy_valid = true;
  };
  // A module's weight (as quantized: [out, in]) and statistics, taken from
  // its pending entry (null: it has none) for compressing it.
  struct Prepared {
    at::Tensor original;
    at::Tensor hessian;  // Undefined without inputs.
    // tr(W H W^T) from the outputs (Note [Output energy]), else NaN.
    double weight_trace = std::numeric_limits<double>::quiet_NaN();
    int64_t tokens = 0;
    bool fused = false;       // A fused MoE expert's slice.
    bool transposed = false;  // A Conv1D's.
    absl::Time start;
  };
  absl::StatusOr<Prepared> Prepare(RunContext& ctx, const std::string& path,
                                   Pending* pending);
  // Quantizes the module at `path` and records it (weight_quant_compress.cc).
  absl::Status Compress(RunContext& ctx, const std::string& path,
                        Pending* pending);
  // Every module of pending_, in path order (groups sharing a Hessian
  // together when SolvesTogether()), then clears it.
  absl::Status CompressPending(RunContext& ctx);
  absl::Status CompressTogether(RunContext& ctx,
                                const std::vector<std::string>& paths);
  // Writes `outcome` into the model and its record; `share` of the time
  // since p.start is the module's.
  absl::Status Record(RunContext& ctx, const std::string& path,
                      Pending* pending, const Prepared& p,
                      WeightQuantOutcome outcome, double share);
  // Note [Output energy]: adds the call's output to p's energy.
  absl::Status AddOutputEnergy(const std::string& path, const ModuleCall& call,
                               Pending& p) const;
  // Adds `x`, an input of the selected Linear at `path`, to its
  // statistics.
  absl::Status AddInput(RunContext& ctx, const std::string& path,
                        const at::Tensor& x, const ModuleCall& call);
  bool Distributed() const;
  // Note [Static input activations]: adds `x` to the input observer of
  // `pending`; records the parameters of the module at `path` in `r`.
  absl::Status ObserveInput(const std::string& path, const at::Tensor& x,
                            int64_t batch, Pending& pending);
  absl::Status RecordInput(RunContext& ctx, const std::string& path,
                           Pending* pending, ModuleRecord& r);
  // Note [KV cache]: records the k/v scales of the attentions observed.
  absl::Status RecordKvCache(RunContext& ctx);
  // The input ranges of `pending_`, merged by module name (last path
  // component), for the modules no token reached.
  void CollectSiblingInputs();
  // Data-parallel: reduces the input statistics of `paths` (`counts`: the
  // all-reduced counts of CompressDistributed) over the ranks, into each
  // path's entry of pending_ (created for `subgraph` where this rank has
  // none).
  absl::Status ReduceInputs(const std::vector<std::string>& paths,
                            const std::vector<int64_t>& columns,
                            const at::Tensor& counts, int subgraph);
  // Data-parallel: reduces the k/v statistics of every attention not yet
  // recorded over the ranks, into kv_pending_ (entries created where this
  // rank saw none); attentions no rank reached stay for a later subgraph.
  absl::Status ReduceKvCache();
  // ModuleRecord::weight_quantization of this modifier's modules.
  std::string TypedRecord() const;
  // The group size the scheme asks for; -1 when none.
  int64_t GroupSize() const;
  // Typed tensor_group (NVFP4) schemes: the global scale `path` shares with
  // its fused siblings (q/k/v, gate/up: llm-compressor's
  // FUSED_LAYER_NAMES), from their weights before any of them is
  // quantized; undefined for a module with none.
  absl::StatusOr<at::Tensor> FusedGlobalScale(RunContext& ctx,
                                              const std::string& path);
  void FindFusedGroups(RunContext& ctx);
  // Compresses `paths` (the same list on every rank, sorted) in a
  // data-parallel run; `subgraph` is the finished subgraph (-1 at the end of
  // the run).
  absl::Status CompressDistributed(RunContext& ctx,
                                   const std::vector<std::string>& paths,
                                   int subgraph);

  WeightQuantOptions options_;
  // The checkpoint's dtype (config.json), which typed schemes quantize in:
  // tracecut traces a bf16 checkpoint in fp32, llm-compressor quantizes it
  // in bf16 (its values convert back exactly).
  std::optional<c10::ScalarType> typed_dtype_;
  std::set<std::string> selected_;
  // Typed tensor_group schemes: each fused module's group (sorted paths),
  // the global scale of each group by its first path, and the one the
  // module being quantized gets (QuantizeTyped).
  std::map<std::string, std::vector<std::string>> fused_;
  std::map<std::string, at::Tensor> fused_scale_;
  at::Tensor global_scale_;
  // Selected Conv1D modules: weight stored [in, out], quantized transposed.
  std::set<std::string> transposed_;
  FusedExperts experts_;
  // The scheme's input activations when they are calibrated (Note [Static
  // input activations]); the merged ranges by module name.
  std::optional<quantization::QuantizationArgs> static_input_;
  std::map<std::string, quantization::MinMax> sibling_inputs_;
  std::map<std::string, Pending> pending_;  // Called, not yet compressed.
  // Note [Shared Hessians]: by the node whose output the Linears read, in
  // the running subgraph.
  struct SharedInput {
    std::shared_ptr<quantization::HessianAccumulator> hessian;
    int64_t first_batch = -1;       // The batch it was made in.
    int64_t batch = -1;             // The batch last added.
    std::set<std::string> readers;  // The Linears that read it in `batch`.
  };
  std::map<const ir::Node*, SharedInput> shared_inputs_;
  int64_t shared_hessian_reads_ = 0;
  int64_t solved_together_ = 0;
  int64_t hessian_readers_left_ = 0;
  // Note [KV cache]: by attention module path.
  struct KvPending {
    std::string type;
    std::optional<quantization::ActivationObserver> k;
    std::optional<quantization::ActivationObserver> v;
    int64_t batches = 0;
  };
  std::map<std::string, KvPending> kv_pending_;
  // The entry of the attention at `path` (of `type`), with its observers.
  absl::StatusOr<KvPending*> KvPendingOf(const std::string& path,
                                         const std::string& type);
  // Every attention of the model (module path -> type): the list each rank
  // reduces in a data-parallel run.
  std::map<std::string, std::string> kv_attentions_;
  int64_t kv_heads_ = 0;  // config.json's, for per-head KV caches.
  std::set<std::string> kv_done_;
  std::set<std::string> done_;
};

// Round-to-nearest with min-max parameters (quantize.h's QuantizeRtn).
class RtnModifier : public WeightQuantModifier {
 public:
  explicit RtnModifier(WeightQuantOptions options)
      : WeightQuantModifier(std::move(options)) {}
  std::string name() const override { return "rtn"; }
  // Round-to-nearest is not propagated (Note [Propagated changes]).
  bool PropagatesChanges() const override { return false; }

 protected:
  std::string method() const override { return "rtn"; }
  bool NeedsHessian() const override { return false; }
  absl::StatusOr<WeightQuantOutcome> QuantizeWeight(
      absl::string_view path, const at::Tensor& weight,
      const at::Tensor& hessian) override;
};

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_WEIGHT_QUANT_MODIFIER_H_
