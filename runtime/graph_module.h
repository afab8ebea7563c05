#ifndef TRACECUT_RUNTIME_GRAPH_MODULE_H_
#define TRACECUT_RUNTIME_GRAPH_MODULE_H_

// GraphModule = an IR graph + the TorchScript module that owns the
// parameters, buffers and leaf submodules the graph refers to (torch.fx's
// GraphModule). get_attr / call_module targets are dotted paths into
// `module()`.
//
//   ASSIGN_OR_RETURN(GraphModule gm, tracer::Trace(module, options));
//   for (ir::Node* n : gm.graph().nodes()) ...

#include <torch/script.h>

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::runtime {

// Copies of a module tree's tensors that share nothing with them (not even
// autograd history), each tensor copied once. Tensors sharing a storage
// (tied weights: the .pt2 importer gives a module reading another's weight a
// detached alias of it) get views of one copy of that storage, so the copies
// stay tied; so does a tensor whose elements overlap (an expanded one, such
// as a deferred checkpoint tensor's one-element stand-in), which is then not
// materialised at full size.
class TensorCopier {
 public:
  // Counts the storages of `m`'s tensor attributes.
  explicit TensorCopier(const torch::jit::Module& m);
  at::Tensor Copy(const at::Tensor& t);

 private:
  absl::flat_hash_map<const c10::StorageImpl*, int> users_;
  absl::flat_hash_map<const c10::StorageImpl*, at::Tensor> storages_;
  absl::flat_hash_map<const c10::TensorImpl*, at::Tensor> copies_;
};

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
  // copies, so mutating the copy never touches this one. Module objects and
  // their ClassTypes are fresh too (types shared between instances stay
  // shared within the copy). A tensor that several attributes hold (tied
  // weights) is copied once and stays tied in the copy; requires_grad and
  // the parameter/buffer distinction are kept.
  absl::StatusOr<GraphModule> Clone() const;

  // The tensor at a dotted attribute path ("layers.0.fc.weight"). Errors
  // (NOT_FOUND, INVALID_ARGUMENT when the attribute is not a tensor) name the
  // path and the module that lacks the attribute.
  absl::StatusOr<torch::Tensor> GetTensor(absl::string_view path) const;
  // Replaces, or adds as a buffer, the tensor at a dotted path whose parent
  // module exists. Replacing keeps the parameter/buffer kind; the attribute
  // must hold a tensor. Adding to a module whose ClassType other instances
  // in the tree share (typical in traced models: every Linear of one shape
  // has one type) first gives that module (and, as needed, its ancestors) a
  // private type, so the other instances are unaffected; that module object
  // is replaced by a copy sharing the same tensors.
  absl::Status SetTensor(absl::string_view path, const torch::Tensor& value);
  // The submodule at a dotted path ("" is the root).
  absl::StatusOr<torch::jit::Module> GetSubmodule(absl::string_view path) const;

  // Files stored next to the model in its .pt archive (e.g. a Hugging Face
  // "config.json"); whoever loads the model fills them in, and
  // SaveTorchScript writes them back. Copied by Clone.
  const torch::jit::ExtraFilesMap& extra_files() const { return extra_files_; }
  torch::jit::ExtraFilesMap& mutable_extra_files() { return extra_files_; }

 private:
  torch::jit::Module module_;
  std::unique_ptr<ir::Graph> graph_;
  torch::jit::ExtraFilesMap extra_files_;
};

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_GRAPH_MODULE_H_
