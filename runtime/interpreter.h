#ifndef TRACECUT_RUNTIME_INTERPRETER_H_
#define TRACECUT_RUNTIME_INTERPRETER_H_

// Runs an IR graph node by node against the module that owns its tensors
// (torch.fx's Interpreter), with hooks around every node and every
// call_module for observers and calibration.
//
//   ASSIGN_OR_RETURN(Interpreter interp, Interpreter::Create(gm));
//   interp.AddModuleHook([&](const ir::Node& node,
//                            const torch::jit::Module& module,
//                            absl::Span<const c10::IValue> inputs,
//                            const c10::IValue* output) {
//     if (output == nullptr) observer.Record(node.target(), inputs[0]);
//   });
//   ASSIGN_OR_RETURN(c10::IValue y, interp.Run({x}));
//
// Everything that needs a lookup (operators, overloads, argument plans,
// attribute slots, submodule methods) is resolved once in Create; Run only
// moves values. A value is released right after its last reader runs.
//
// Any ir::Graph works, not only a GraphModule's own: a partition subgraph
// whose get_attr / call_module targets are paths in the same root module
// runs with Create(subgraph, gm.module()) and RunNamed (inputs by
// placeholder name).
//
// Lifetimes: the graph must outlive the Interpreter and must not change
// while it exists (the plan points into it). The module is held by handle:
// tensor updates (GraphModule::SetTensor) are seen by later runs.
//
// Thread safety: Run/RunNamed are const and may run concurrently; adding or
// removing hooks must not overlap a run.

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"

namespace tracecut::runtime {

// Called before each node (output == nullptr) and after it (output set).
// `inputs` are the values the node consumes, in order: for call_function
// every schema argument (defaults filled in), for call_module the forward
// arguments without self, for getitem (container, index), for output the
// returned value; empty for placeholder and get_attr. The spans are valid
// only during the call.
using NodeHook = std::function<void(const ir::Node& node,
                                    absl::Span<const c10::IValue> inputs,
                                    const c10::IValue* output)>;

// Like NodeHook, for call_module nodes only, with the submodule being run.
using ModuleHook = std::function<void(
    const ir::Node& node, const torch::jit::Module& module,
    absl::Span<const c10::IValue> inputs, const c10::IValue* output)>;

// What one run did; pass a pointer to Run to fill it.
struct RunStats {
  int64_t nodes_run = 0;
  // Most intermediate values alive at once (held by the interpreter,
  // counted after each node, before releasing what it was last to read).
  int64_t peak_live_values = 0;
  // Values released before the end of the run because nobody reads them
  // any more.
  int64_t values_released = 0;
};

class Interpreter {
 public:
  // Plans `gm.graph()` against `gm.module()`.
  static absl::StatusOr<Interpreter> Create(const GraphModule& gm);
  // Plans `graph` against `root` (get_attr / call_module targets are paths
  // in `root`). Errors name the node: unknown operator or overload, wrong
  // number of arguments, unknown kwarg, bad attribute path, unsupported
  // node.
  static absl::StatusOr<Interpreter> Create(const ir::Graph& graph,
                                            const torch::jit::Module& root);

  Interpreter(Interpreter&&) noexcept;
  Interpreter& operator=(Interpreter&&) noexcept;
  ~Interpreter();

  // Runs with one input per placeholder, in graph order. Returns the output
  // node's value (a tuple when it returns a Tuple argument). Errors name the
  // failing node and give the first line of LibTorch's message.
  absl::StatusOr<c10::IValue> Run(std::vector<c10::IValue> inputs,
                                  RunStats* stats = nullptr) const;

  // Runs with inputs keyed by placeholder target (the input name), falling
  // back to the placeholder's node name. Every placeholder must be given;
  // unknown names are errors.
  absl::StatusOr<c10::IValue> RunNamed(
      absl::flat_hash_map<std::string, c10::IValue> inputs,
      RunStats* stats = nullptr) const;

  // Hooks run in the order they were added. Around a call_module node the
  // order nests: node hooks (before), module hooks (before), the module,
  // module hooks (after), node hooks (after). A hook that throws fails the
  // run with an error naming the node.
  using HookId = int64_t;
  HookId AddNodeHook(NodeHook hook);
  HookId AddModuleHook(ModuleHook hook);
  // Returns false when no hook has this id.
  bool RemoveHook(HookId id);
  void ClearHooks();

  // Makes the graph compute on `device`: every device argument written into
  // the graph (torch.export records `device=cpu` in factory calls such as
  // arange, full or zeros, and in `to` / `_to_copy`) and every tensor
  // constant becomes `device`'s. The CPU changes nothing: the graph runs as
  // recorded. The module's tensors are not moved (the caller moves what the
  // graph reads). Must not overlap a run.
  void PlaceOn(c10::Device device);

  const ir::Graph& graph() const;
  // Placeholders in input order.
  const std::vector<const ir::Node*>& placeholders() const;

 private:
  struct Plan;
  explicit Interpreter(std::unique_ptr<Plan> plan);

  std::unique_ptr<Plan> plan_;
};

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_INTERPRETER_H_
