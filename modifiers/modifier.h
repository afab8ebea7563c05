#ifndef TRACECUT_MODIFIERS_MODIFIER_H_
#define TRACECUT_MODIFIERS_MODIFIER_H_

// The calibration hook API: a Modifier is told when a run starts, when each
// subgraph starts, about every call of a leaf module it asked for (inputs
// and output), when a subgraph's calibration pass is over (its chance to
// compress what it saw) and when the run ends. llm-compressor's Modifier
// lifecycle (on_initialize, calibrate_module hooks, sequential_epoch_end,
// on_finalize), natively.
//
//   class CountCalls : public Modifier {
//    public:
//     std::string name() const override { return "count-calls"; }
//     bool WantsModule(absl::string_view path,
//                      absl::string_view type) const override {
//       return partition::ModulePatternMatches("Linear", path, type);
//     }
//     absl::Status OnModuleCall(RunContext& ctx,
//                               const ModuleCall& call) override {
//       ++calls_[std::string(call.path)];
//       return absl::OkStatus();
//     }
//     ...
//   };
//
// Order of callbacks in one run (see pipeline.h for the pipelines):
//
//   OnRunStart
//   for each subgraph:                     (the whole model for `basic`)
//     OnSubgraphStart
//     [transforms first, when the run has other modifiers too:
//      OnModuleCall x (batches x calls)    a pass with transforms' hooks
//      OnSubgraphEnd of the transforms]    transform the weights here
//     OnModuleCall  x (batches x calls)    calibration pass, hooks active
//     (and OnFunctionCall for the function nodes it asked for)
//     OnSubgraphEnd                        compress here
//     (propagation pass: no callbacks)
//   OnRunEnd
//
// Note [Transforms first]: a transform (IsTransform(): SmoothQuant, AWQ)
// changes weights without changing what the model computes, to make it
// quantize better. Quantizers must see the transformed model (GPTQ's Hessian
// from the smoothed activations), so in a run with both, each subgraph gets
// a calibration pass for the transforms, their OnSubgraphEnd, and then the
// calibration pass of the others. llm-compressor runs each modifier over the
// whole model in turn (its default "independent" pipeline); per subgraph,
// the transforms here see the inputs earlier quantized subgraphs propagate.
//
// Note [Propagated changes]: with propagate_error, a subgraph whose
// weights a modifier changed runs its batches again (the propagation pass)
// so that later subgraphs calibrate on the error so far, as
// llm-compressor's sequential pipeline propagates what GPTQ writes into its
// weights. Round-to-nearest is not propagated (PropagatesChanges() false):
// llm-compressor's QuantizationModifier applies it only when calibration
// ends (its passes run with quantization disabled), so later subgraphs'
// statistics (AWQ, SmoothQuant, static activation scales) come from
// unquantized activations there; doing the same gives its numbers (the
// SmoothQuant + W8A8 parity test: layer 1 within 2.4e-7 instead of 1e-2)
// and saves a pass.
//
// A resumed run calls OnRunStart, then RestoreState with what SaveState
// returned after the last finished subgraph, and continues with the next
// subgraph.
//
// Modifiers record what they compute (quantization parameters, errors,
// timings) in the run's CalibrationResults, which the pipeline checkpoints,
// exports as buffers of the saved model and turns into the report. Weights
// change through RunContext::UpdateTensor, so checkpoints know what to save.
//
// Callbacks return absl::Status; the first error stops the run and is
// returned by the pipeline. Callbacks run on the pipeline's thread, with
// autograd off.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "util/progress.h"

namespace tracecut::modifiers {

// One subgraph as the modifiers see it.
struct SubgraphInfo {
  int index = 0;  // 0-based, execution order.
  int count = 1;  // Subgraphs in the run.
  // "model.layers.3" (first target instance), "(head)", "(whole model)".
  std::string label;
  // Sequential-target instances it runs; empty for the head and for the
  // whole model.
  std::vector<std::string> module_paths;
  // call_module targets it calls (distinct, graph order).
  std::vector<std::string> leaf_modules;
};

// One call of a leaf module during a calibration pass. Pointers and spans
// are valid only during the callback.
struct ModuleCall {
  const ir::Node* node = nullptr;  // The call_module node.
  absl::string_view path;          // Its target ("model.layers.0.mlp.up_proj").
  absl::string_view type;          // Demangled qualified module type.
  const torch::jit::Module* module = nullptr;
  absl::Span<const c10::IValue> inputs;  // forward's arguments, no self.
  const c10::IValue* output = nullptr;
  int64_t batch = 0;
  int subgraph = 0;
};

// One call of a function node a modifier asked for (WantsFunction), such as
// an attention's scaled_dot_product_attention. Valid only during the
// callback.
struct FunctionCall {
  const ir::Node* node = nullptr;
  // The innermost module the node belongs to ("model.layers.0.self_attn").
  absl::string_view module_path;
  absl::Span<const c10::IValue> inputs;  // Every schema argument.
  const c10::IValue* output = nullptr;
  int64_t batch = 0;
  int subgraph = 0;
};

// The range an observer saw for one activation and its parameters.
//
// Observer modifiers (observer_modifier.h) record tracecut's integer
// parameters: scale fp32 [1], zero point int32 [1]. A weight quantizer with a
// compressed-tensors scheme whose input activations are static (FP8, NVFP4)
// records them as compressed-tensors keeps them: observer "static_minmax" or
// "minmax", the scale in the weight's dtype and the zero point in zp_dtype
// (per tensor), or only the global scale (fp32 [1]; NVFP4's "local"
// dynamic activations).
struct ActivationRange {
  // "minmax", "moving-average-minmax", "static_minmax"; empty: none.
  std::string observer;
  // QuantScheme::ToString() or QuantizationArgs::ToString().
  std::string scheme;
  double min = 0;
  double max = 0;
  int64_t batches = 0;
  at::Tensor scale;
  at::Tensor zero_point;
  at::Tensor global_scale;
};

// What the modifiers found for one module. Fields a modifier did not fill
// keep their defaults (undefined tensors, NaN errors).
struct ModuleRecord {
  std::string type;   // Demangled qualified type.
  int subgraph = -1;  // Where it was calibrated.

  // Weight quantization (RTN / GPTQ).
  // "rtn", "gptq" (weights changed), "observer" (parameters only); empty:
  // none.
  std::string weight_method;
  std::string weight_scheme;     // QuantScheme::ToString().
  at::Tensor weight_scale;       // fp32 [rows or 1, groups] (see below).
  at::Tensor weight_zero_point;  // int32, same shape.
  at::Tensor weight_g_idx;       // int32 [in], GPTQ act_order with groups.
  // Quantized with a compressed-tensors scheme (quantization/quant_args.h):
  // {"scheme": its QuantizationScheme JSON with the modifier's targets,
  //  "ignore": [the modifier's ignore]}; empty for tracecut's integer
  // schemes. The scale is then in the weight's dtype and the zero point in
  // the scheme's zp_dtype, as compressed-tensors keeps them.
  std::string weight_quantization;
  at::Tensor weight_global_scale;  // fp32 [1]; tensor_group (NVFP4) only.
  // Relative output error on the calibration inputs X this module saw:
  // ||(W - Wq) X|| / ||W X|| (bias left out), from X's second moment.
  double weight_error = std::numeric_limits<double>::quiet_NaN();
  // GPTQ only: the same error for round-to-nearest on the same inputs.
  double rtn_error = std::numeric_limits<double>::quiet_NaN();
  // GPTQ only: its own loss (gptq.h Note [GPTQ in tracecut] 7).
  double gptq_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t calibration_tokens = 0;
  double compress_seconds = 0;

  // Activation observation (observer_modifier.h): the module's input and
  // output.
  ActivationRange input;
  ActivationRange output;

  // KV-cache quantization (an attention module; weight_quant_modifier.h Note
  // [KV cache]): the ranges of the keys and values entering its attention,
  // their scales in the checkpoint's dtype, and the kv_cache_scheme
  // (compressed-tensors QuantizationArgs JSON).
  ActivationRange k_cache;
  ActivationRange v_cache;
  std::string kv_cache_scheme;

  std::vector<std::string> notes;
};

// Time spent per subgraph and pass.
struct SubgraphTiming {
  int index = 0;
  std::string label;
  double calibrate_seconds = 0;
  double compress_seconds = 0;
  double propagate_seconds = 0;
};

// Everything a run found; checkpointed after every subgraph.
struct CalibrationResults {
  std::string pipeline;                         // "sequential", ...
  std::map<std::string, ModuleRecord> modules;  // By module path.
  std::vector<SubgraphTiming> subgraphs;        // Finished ones.
  std::vector<std::string> warnings;

  ModuleRecord& Module(absl::string_view path) {
    return modules[std::string(path)];
  }
  const ModuleRecord* FindModule(absl::string_view path) const;

  // Lossless conversion to and from an IValue (a string-keyed dict) for
  // checkpoints.
  c10::IValue ToIValue() const;
  static absl::StatusOr<CalibrationResults> FromIValue(const c10::IValue& v);
};

// A leaf module of the model being calibrated.
struct LeafModule {
  std::string path;
  std::string type;  // Demangled qualified type.
};

// What callbacks may read and change.
class RunContext {
 public:
  RunContext(runtime::GraphModule* model, CalibrationResults* results,
             int64_t num_batches, util::Progress* progress);

  runtime::GraphModule& model() { return *model_; }
  CalibrationResults& results() { return *results_; }
  int64_t num_batches() const { return num_batches_; }

  // Distinct call_module targets of the model's graph, graph order.
  const std::vector<LeafModule>& leaf_modules() const { return leaves_; }
  // The leaf at `path`, or nullptr.
  const LeafModule* FindLeaf(absl::string_view path) const;

  // Overwrites the tensor at a dotted path in place (same storage, dtype,
  // shape; the parameter stays a parameter, every alias sees the change) and
  // remembers the path for checkpoints.
  absl::Status UpdateTensor(absl::string_view path, const at::Tensor& value);
  // Paths changed since the last TakeUpdatedTensors (sorted).
  std::set<std::string> TakeUpdatedTensors();
  // How many UpdateTensor calls there were in all (never reset).
  int64_t update_count() const { return update_count_; }

  // A warning for the report (also printed as a progress note).
  void Warn(std::string message);

  // Runs the current subgraph again on every calibration batch (its cached
  // inputs), with the model's weights as they are now, calling `visit`
  // after each leaf module call (`output` set). `visit` returns false to
  // end that batch there: the rest of the subgraph is not run. For
  // transforms that search for weights by the outputs they give (AWQ).
  // Only inside OnSubgraphEnd of the partitioned pipelines (sequential,
  // layer_sequential); FailedPrecondition elsewhere.
  using CallVisitor = std::function<absl::StatusOr<bool>(const ModuleCall&)>;
  absl::Status ReplaySubgraph(const CallVisitor& visit);
  // Set by the pipeline while a subgraph's OnSubgraphEnd callbacks run.
  using Replayer = std::function<absl::Status(const CallVisitor&)>;
  void set_replayer(Replayer replayer) { replayer_ = std::move(replayer); }

  // Whether modifiers measure baselines for the report (GPTQ: each Linear's
  // round-to-nearest output error on the same inputs). It costs about as
  // much as a fifth of GPTQ's solve, so a run that writes no report skips it.
  bool measure_baselines() const { return measure_baselines_; }
  void set_measure_baselines(bool v) { measure_baselines_ = v; }

 private:
  runtime::GraphModule* model_;
  CalibrationResults* results_;
  int64_t num_batches_;
  util::Progress* progress_;
  std::vector<LeafModule> leaves_;
  std::set<std::string> updated_;
  int64_t update_count_ = 0;
  Replayer replayer_;
  bool measure_baselines_ = true;
};

class Modifier {
 public:
  virtual ~Modifier() = default;

  // Kebab-case name ("gptq", "rtn", "minmax-input-observer") for messages
  // and checkpoints.
  virtual std::string name() const = 0;

  // Whether OnModuleCall wants calls of the leaf module at `path` (asked
  // once per module and run).
  virtual bool WantsModule(absl::string_view path,
                           absl::string_view type) const {
    return false;
  }

  // Whether OnFunctionCall wants calls of this call_function node (asked
  // for every node run in a calibration pass: keep it cheap).
  virtual bool WantsFunction(const ir::Node& node) const { return false; }

  // A transform (Note [Transforms first]): its calibration pass and
  // OnSubgraphEnd come before the other modifiers' calibration pass.
  virtual bool IsTransform() const { return false; }

  // Whether later subgraphs see the weights this modifier changes at a
  // subgraph's end (Note [Propagated changes]).
  virtual bool PropagatesChanges() const { return true; }

  // Validate options against the model here (e.g. targets that match
  // nothing); the pipeline calls it before anything is written.
  virtual absl::Status OnRunStart(RunContext& ctx) { return absl::OkStatus(); }
  virtual absl::Status OnSubgraphStart(RunContext& ctx,
                                       const SubgraphInfo& subgraph) {
    return absl::OkStatus();
  }
  virtual absl::Status OnModuleCall(RunContext& ctx, const ModuleCall& call) {
    return absl::OkStatus();
  }
  virtual absl::Status OnFunctionCall(RunContext& ctx,
                                      const FunctionCall& call) {
    return absl::OkStatus();
  }
  // The calibration pass over `subgraph` is over: compress.
  virtual absl::Status OnSubgraphEnd(RunContext& ctx,
                                     const SubgraphInfo& subgraph) {
    return absl::OkStatus();
  }
  virtual absl::Status OnRunEnd(RunContext& ctx) { return absl::OkStatus(); }

  // State beyond CalibrationResults that a resumed run needs, taken between
  // subgraphs (None when there is none). Tensors, scalars, strings and
  // lists/dicts of them.
  virtual absl::StatusOr<c10::IValue> SaveState() const {
    return c10::IValue();
  }
  virtual absl::Status RestoreState(const c10::IValue& state) {
    return absl::OkStatus();
  }
};

// Which modules a built-in modifier acts on: those matching a target
// pattern and no ignore pattern (pattern syntax of
// partition::ModulePatternMatches: short or qualified type, path, glob,
// "re:" regex).
struct ModuleSelector {
  std::vector<std::string> targets = {"Linear"};
  std::vector<std::string> ignore;

  bool Matches(absl::string_view path, absl::string_view type) const;
  // The leaves of `ctx` selected; InvalidArgument naming `owner` when the
  // targets match no leaf module (listing the leaf types there are) or a
  // pattern is an invalid regex.
  absl::StatusOr<std::vector<const LeafModule*>> Select(
      const RunContext& ctx, absl::string_view owner) const;
};

// Short module type ("Linear" for "torch.nn.modules.linear.Linear").
std::string ShortType(absl::string_view type);

// A set of names as modifier state (SaveState) and back (RestoreState):
// a list of strings; None reads as empty. DataLoss naming `owner` for
// anything else.
c10::IValue NamesToState(const std::set<std::string>& names);
absl::StatusOr<std::set<std::string>> NamesFromState(const c10::IValue& state,
                                                     absl::string_view owner);

// The module at `path`'s parent path ("" for a top-level module).
std::string ParentModulePath(absl::string_view path);

// The "architectures" entry of the model's embedded config.json
// ("LlamaForCausalLM"), or "" (none, or not readable): what picks a
// transform's default mappings.
std::string ModelArchitecture(const runtime::GraphModule& model);

// Stores what `results` holds as buffers of `model`: for a module at P,
// P.weight_scale, P.weight_zero_point (and P.weight_g_idx) when its weight
// was quantized or observed, P.input_scale / P.input_zero_point (and
// P.input_global_scale) and P.output_scale / P.output_zero_point when those
// were observed; nothing for a quantized module without a P.weight (a
// fused MoE expert's Linear, which is no module). An attribute already
// there (a re-calibrated model) is replaced. Adding buffers
// may replace module objects (GraphModule::SetTensor): create Interpreters
// for `model` after this, not before.
absl::Status ExportQuantParams(const CalibrationResults& results,
                               runtime::GraphModule& model);

// InvalidArgument naming the module, the tensor and the first bad element
// when any quantization parameter in `results` (weight scale / zero point /
// g_idx, input and output scales and zero points) or the weight of a module
// whose weight was quantized holds NaN or infinity. Run before anything is
// written: no checkpoint carries a non-finite value.
absl::Status CheckQuantResultsFinite(const CalibrationResults& results,
                                     const runtime::GraphModule& model);
// The same for the module at `path`, whose weight after calibration is
// `weight` (checked when its weight was quantized).
absl::Status CheckQuantRecordFinite(const std::string& path,
                                    const ModuleRecord& record,
                                    const at::Tensor& weight);

}  // namespace tracecut::modifiers

#endif  // TRACECUT_MODIFIERS_MODIFIER_H_
