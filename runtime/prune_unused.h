#ifndef TRACECUT_RUNTIME_PRUNE_UNUSED_H_
#define TRACECUT_RUNTIME_PRUNE_UNUSED_H_

// Lean exports: removes from a lowered module what its graph does not use,
// so that a saved transformed model holds only what it runs.
//
// Transformation passes leave what they replace registered on purpose (the
// fusion passes keep the original Conv2d and BatchNorm2d next to the fused
// Conv2d, so that Reverse is exact). Saved as is, a fused ResNet-18 holds
// every original module twice over. LowerToTorchScript with
// LoweringOptions::prune_unused (SaveTorchScript passes it through) calls
// PruneUnused on its copy; the GraphModule itself never changes.
//
//   ASSIGN_OR_RETURN(torch::jit::Module m, LowerToTorchScript(gm));
//   ASSIGN_OR_RETURN(std::vector<std::string> removed, PruneUnused(gm, m));
//
// Note [Lean exports] -- what is kept:
//  * A call_module target keeps its whole subtree, methods and all: its own
//    forward runs it (and calibration's weight_scale / weight_zero_point /
//    input_scale buffers sit on such leaf modules, unread by the graph).
//  * A get_attr target keeps that attribute; one that names a module keeps
//    its whole subtree (a call_method may run any of its methods).
//  * The root's methods that the original forward calls (directly or not;
//    torchvision's `_forward_impl`) are removed: the graph is what they
//    computed. Its other methods (@torch.jit.export ones, hooks) stay, with
//    everything they reach from self; when one of them uses self other than
//    through attributes and method calls, nothing is removed. An exported
//    method that forward also calls counts as forward's (TorchScript keeps
//    no mark of which methods were exported).
//  * A module that lowering outlined (LoweringOptions::keep_hierarchy) stays
//    with the forward lowering gave it; it reads only what the graph reads.
//  * Every other module on the way from the root to something kept stays,
//    with only the submodules and tensors that something kept lies in or
//    under, and its non-tensor attributes (`training`, ints, strings). It
//    loses its methods: the graph has inlined what they did, and they would
//    read what was removed. Such a module cannot be called on its own in the
//    saved file; the root's forward does not call it.
//  * Everything else (modules and tensors the graph does not reach) goes.
// Module types that several instances share lose an attribute only when no
// instance needs it, and a type that some whole-kept instance has is not
// pruned at all. Types with forward hooks or __getstate__ / __setstate__,
// and modules held through interface-typed attributes, are kept whole.

#include <torch/csrc/jit/api/module.h>

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "runtime/graph_module.h"

namespace tracecut::runtime {

// Prunes `lowered` in place, as above. `lowered` must be what
// LowerToTorchScript(gm) returned (its forward runs gm's graph, and nothing
// else shares its types): its module objects and ClassTypes are changed,
// gm is not. Returns the dotted paths of the removed attributes (modules and
// tensors), sorted.
// `outlined`: paths of the modules whose forward lowering replaced
// (LoweringOptions::keep_hierarchy); they stay, with that forward.
absl::StatusOr<std::vector<std::string>> PruneUnused(
    const GraphModule& gm, torch::jit::Module& lowered,
    const std::vector<std::string>& outlined = {});

// The methods of `type` that only its forward uses (directly or not): what
// it calls, less what its other methods and hooks call.
absl::flat_hash_set<std::string> OldForwardMethods(const c10::ClassType& type);

// True for types whose instances must keep all their methods: forward hooks
// run around forward, __getstate__ / __setstate__ read what they like.
bool HasHooksOrState(const c10::ClassType& type);

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_PRUNE_UNUSED_H_
