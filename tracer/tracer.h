#ifndef TRACECUT_TRACER_TRACER_H_
#define TRACECUT_TRACER_TRACER_H_

// TorchScript -> tracecut IR (torch.fx + HFTracer, natively).
//
//   TraceOptions options;
//   options.leaf_policy.AddType("LlamaRMSNorm");
//   ASSIGN_OR_RETURN(runtime::GraphModule gm, TraceFile("llama.pt", options));
//   std::cout << ir::PrintGraph(gm.graph());
//
// The tracer walks the un-inlined `forward` graph of a clone of the module
// (the caller's module is never touched). Calls of leaf submodules (see
// LeafPolicy) become call_module nodes; other submodule calls and free
// functions are inlined with the module scope pushed. Operators become
// call_function nodes per docs/ir_conventions.md, tensor attributes get_attr
// nodes (one per path), tensor constants `_tensor_constant<N>` buffers on
// the clone's root.
//
// See Note [Shadow execution]: the tracer runs every operator on example
// inputs while it walks, which gives every node its shapes (meta.outputs)
// and decides control flow. By default (TraceOptions::shadow) whatever
// depends on tensor data runs on the `meta` device: shapes without the
// arithmetic, and the clone shares the caller's parameter tensors instead
// of copying them. Shapes, dtypes and decisions are those of a run on the
// real inputs; a trace the meta run cannot do (an operator without a meta
// kernel, .item() of data, data-dependent output shapes) is redone with
// real tensors. A prim::If / prim::Loop whose condition is a
// constant (attributes, self.training, `is None` on an input given as None)
// or depends only on input shapes (x.dim(), x.size(i), len of shapes) is
// resolved: the taken branch is inlined, loops unrolled, and each decision
// that depended on shapes is recorded in graph().meta().assumptions. A
// condition that depends on tensor values is an error naming the module
// path, the node and the source line, suggesting --leaf for that module.
//
// Example inputs come from, per forward argument and in this order:
// TraceOptions::example_inputs, TraceOptions::input_specs (a model's
// embedded tracecut_inputs.json), the argument's default value in the
// forward signature, and Hugging Face-style dummy inputs built from the
// config (hf/inputs.h). All are deterministic.

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/graph_module.h"
#include "tracer/hf/config.h"
#include "tracer/hf/inputs.h"
#include "tracer/leaf_policy.h"
#include "tracer/load.h"

namespace tracecut::tracer {

struct TraceOptions {
  LeafPolicy leaf_policy = LeafPolicy::Default();

  // Example inputs by forward argument name; win over everything else. A
  // None IValue means "not given" for Optional arguments.
  std::map<std::string, c10::IValue> example_inputs;
  // Descriptions of example inputs (what tracecut_inputs.json holds); made
  // into tensors in this order from one generator seeded with `seed`.
  std::vector<hf::InputSpec> input_specs;
  // The model's Hugging Face config: dummy inputs and graph meta
  // ("hf.model_type", "hf.sequential_targets", "hf.ignore").
  std::optional<hf::HfConfig> config;
  // TraceFile only: read this config.json instead of the embedded one.
  std::string config_path;

  // Shape of HF dummy inputs.
  hf::DummyShape dummy_shape;
  uint64_t seed = 1234;
  // Loops with more iterations than this are an error, not unrolled.
  int64_t max_unroll = 100000;

  // How the tracer runs operators (Note [Shadow execution]).
  enum class Shadow {
    // kMeta, and when that fails for any reason, kReal.
    kAuto,
    // Tensors that depend on input or parameter values are meta tensors;
    // the result shares parameter and buffer tensors with `module` (they
    // are copied when the traced graph or a leaf module may write to them).
    // An error where the meta run cannot decide.
    kMeta,
    // Every operator runs on real tensors of a deep copy of the module.
    kReal,
  };
  Shadow shadow = Shadow::kAuto;
};

// Traces `module.forward`. The returned GraphModule owns a clone of
// `module` (with lifted tensor constants added as buffers); `module` is never
// changed. The clone may share parameter and buffer tensors with `module`
// (see TraceOptions::Shadow): write into them through new tensors (as
// GraphModule::SetTensor does), or GraphModule::Clone() first.
absl::StatusOr<runtime::GraphModule> Trace(const torch::jit::Module& module,
                                           const TraceOptions& options);

// `options` completed with what `model` carries: its embedded config
// (unless options.config is set; options.config_path, when set, is read
// instead) and its embedded example inputs (unless options.input_specs is
// set).
absl::StatusOr<TraceOptions> WithModelFiles(const LoadedModel& model,
                                            TraceOptions options);

// A trace error of the model at `path`, as "<path>: <message>"; a message
// that already starts with the path (one about its embedded files,
// "<path>:config.json: ...") is kept as it is, not prefixed twice.
absl::Status TraceErrorOf(const std::string& path, const absl::Status& error);

// LoadModel + WithModelFiles + Trace. The GraphModule's extra_files() are
// the model's embedded files, with config.json replaced by
// options.config_path's text when that is set.
absl::StatusOr<runtime::GraphModule> TraceFile(const std::string& path,
                                               const TraceOptions& options);

// The forward's example inputs as the tracer resolves them (see above), in
// signature order without `self`. Use them to run the original module and a
// traced graph on identical inputs.
struct ExampleInputs {
  std::vector<std::string> names;
  std::vector<c10::IValue> values;
  // Specialisations they imply ("mask is None", "flag == True").
  std::vector<std::string> assumptions;
};
absl::StatusOr<ExampleInputs> ResolveExampleInputs(
    const torch::jit::Module& module, const TraceOptions& options);

// The tensor a spec describes, drawing from `generator` (tokens: randint,
// normal: randn, as the fixture generator's make_inputs does).
absl::StatusOr<torch::Tensor> MakeInputTensor(const hf::InputSpec& spec,
                                              at::Generator& generator);

}  // namespace tracecut::tracer

#endif  // TRACECUT_TRACER_TRACER_H_
