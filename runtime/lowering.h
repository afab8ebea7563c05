#ifndef TRACECUT_RUNTIME_LOWERING_H_
#define TRACECUT_RUNTIME_LOWERING_H_

// Lowering: a GraphModule's IR back to TorchScript. The graph becomes the
// `forward` method of a copy of the module, which LibTorch and Python torch
// can run, save and load like any scripted module.
//
//   ASSIGN_OR_RETURN(torch::jit::Module m, LowerToTorchScript(gm));
//   m.forward({x});
//   RETURN_IF_ERROR(SaveTorchScript(gm, "out/model.pt"));
//
// How IR maps to TorchScript (docs/ir_conventions.md, in reverse):
// placeholder -> forward input; get_attr / call_module -> prim::GetAttr
// chains from self (one per path prefix, shared); call_module ->
// prim::CallMethod forward; call_function -> the operator's node, inputs
// matched against the target's schema (defaults filled, types checked,
// output types from the schema); constants -> prim::Constant; lists ->
// prim::ListConstruct; tuples -> prim::TupleConstruct; getitem ->
// prim::TupleIndex, the multi-output node's output, or aten::__getitem__;
// output -> the return value.

#include <ATen/core/jit_type.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/graph_module.h"

namespace tracecut::runtime {

struct LoweringOptions {
  // One TorchScript type per placeholder, in order. Empty: the module's
  // current forward signature when its arguments (without self) match the
  // placeholders by name (their defaults are kept too), otherwise each
  // placeholder's type is taken from the first schema argument it feeds,
  // and Tensor when that says nothing.
  std::vector<c10::TypePtr> input_types;
  // Lean export: remove from the lowered copy the modules, tensors and
  // methods its graph does not use (runtime/prune_unused.h, Note [Lean
  // exports]). The GraphModule keeps everything, so reversing passes on it
  // stays exact. `tracecut transform` saves with this on.
  bool prune_unused = false;
  // Keep the module tree: each module call whose nodes can be outlined
  // becomes that module's forward, called by its parent's, so that tracing
  // the saved model again gives the same scopes (Note [Keeping the module
  // hierarchy] in lowering.cc). Off: one flat forward on the root calling
  // leaves only. Only LowerToTorchScript (which owns a copy) outlines.
  bool keep_hierarchy = true;
};

// The TorchScript graph for `gm`'s IR, with `self` (of type `self_type`,
// whose attributes the get_attr / call_module paths must resolve in) as its
// first input. Errors name the IR node that could not be lowered.
absl::StatusOr<std::shared_ptr<torch::jit::Graph>> BuildTorchScriptGraph(
    const GraphModule& gm, const c10::ClassTypePtr& self_type,
    const LoweringOptions& options = {});

// A module whose `forward` runs `gm`'s graph. It is a copy of gm.module()
// with fresh module objects and ClassTypes (gm.module() keeps its own
// forward and types) holding the same tensors: in-place changes to a tensor
// show in both, replacing an attribute (SetTensor) shows only where it was
// done. Clone the GraphModule first for an independent module. Other
// methods of the module are kept; with options.prune_unused, only what the
// graph and those methods use is.
absl::StatusOr<torch::jit::Module> LowerToTorchScript(
    const GraphModule& gm, const LoweringOptions& options = {});

struct SaveOptions {
  // Also write gm.extra_files() (e.g. "config.json") into the archive.
  bool include_extra_files = true;
  // More files to write; they win over gm.extra_files() on a name clash.
  torch::jit::ExtraFilesMap extra_files;
  LoweringOptions lowering;
};

// Lowers `gm` and saves it as a TorchScript archive at `path`, atomically:
// the archive is written to a temporary file in the same directory and
// renamed over `path`, so a failure leaves no partial file (and an existing
// file at `path` untouched). Errors name the path: NOT_FOUND for a missing
// directory, PERMISSION_DENIED for one we cannot write.
absl::Status SaveTorchScript(const GraphModule& gm, const std::string& path,
                             const SaveOptions& options = {});

// Saves any module atomically, as SaveTorchScript does.
absl::Status SaveModuleAtomically(
    const torch::jit::Module& module, const std::string& path,
    const torch::jit::ExtraFilesMap& extra_files = {});

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_LOWERING_H_
