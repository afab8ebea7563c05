#ifndef TRACECUT_RUNTIME_GRAPH_MODULE_H_
#define TRACECUT_RUNTIME_GRAPH_MODULE_H_

// GraphModule = an IR graph + the TorchScript module that owns the
// parameters, buffers and leaf submodules the graph refers to (torch.fx's
// GraphModule). get_attr / call_module targets are dotted paths into
// `module()`.
//
//   ASSIGN_OR_RETURN(GraphModule gm, tracer::Trace(module, options));
//   for (ir::Node* n : gm.graph().nodes()) ...

#include <memory>
#include <string>

#include <torch/script.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::runtime {

class GraphModule {
 public:
  GraphModule(torch::jit::Module module, std::unique_ptr<ir::Graph> graph)
      : module_(std::move(module)), graph_(std::move(graph)) {}
  GraphModule(GraphModule&&) = default;
  GraphModule& operator=(GraphModule&&) = default;

  ir::Graph& graph() { return *graph_; }
  const ir::Graph& graph() const { return *graph_; }
  torch::jit::Module& module() { return module_; }
  const torch::jit::Module& module() const { return module_; }

  // A deep copy: cloned graph and a module whose parameters and buffers are
  // copies, so mutating the copy never touches this one.
  absl::StatusOr<GraphModule> Clone() const;

  // The tensor at a dotted attribute path ("layers.0.fc.weight").
  absl::StatusOr<torch::Tensor> GetTensor(absl::string_view path) const;
  // Replaces, or adds as a buffer, the tensor at a dotted path whose parent
  // module exists.
  absl::Status SetTensor(absl::string_view path, const torch::Tensor& value);
  // The submodule at a dotted path ("" is the root).
  absl::StatusOr<torch::jit::Module> GetSubmodule(absl::string_view path) const;

 private:
  torch::jit::Module module_;
  std::unique_ptr<ir::Graph> graph_;
};

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_GRAPH_MODULE_H_
