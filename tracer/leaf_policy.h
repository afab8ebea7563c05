#ifndef TRACECUT_TRACER_LEAF_POLICY_H_
#define TRACECUT_TRACER_LEAF_POLICY_H_

// Which submodules the tracer keeps as call_module nodes (leaves) instead of
// inlining their forward (torch.fx's Tracer.is_leaf_module).
//
//   LeafPolicy policy = LeafPolicy::Default();      // torch.nn built-ins
//   policy.AddType("LlamaRMSNorm")                  // short or qualified type
//       .AddPath("model.layers.*.mlp")              // path or glob
//       .AddPredicate([](absl::string_view path, absl::string_view type) {
//         return absl::EndsWith(type, "Attention");
//       });
//   policy.IsLeaf("model.layers.0.mlp", "transformers...LlamaMLP");  // true
//
// Types are demangled qualified names as ir::Scope holds them
// ("torch.nn.modules.linear.Linear"). The root module is never a leaf; the
// tracer does not ask.

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ir/module_pattern.h"

namespace tracecut::tracer {

class LeafPolicy {
 public:
  using Predicate =
      std::function<bool(absl::string_view path, absl::string_view type)>;

  // torch.nn / torch.ao.nn built-in modules (types under "torch.nn." or
  // "torch.ao.nn.") except the containers Sequential, ModuleList, ModuleDict,
  // ParameterList and ParameterDict; plus Hugging Face's Conv1D (any type
  // whose short name is "Conv1D"), which is linear-like.
  static LeafPolicy Default();
  // torch.fx's default: the torch.nn built-ins above, without Conv1D.
  static LeafPolicy TorchNn();
  // Nothing is a leaf unless added.
  static LeafPolicy None() { return LeafPolicy(); }

  // Patterns are ir::ModulePattern's (the syntax of --targets too).
  // A module type, short ("LlamaRMSNorm") or qualified
  // ("transformers.models.llama.modeling_llama.LlamaRMSNorm"); '*' in it
  // matches any characters ("*RMSNorm").
  LeafPolicy& AddType(std::string type);
  // A module path ("model.layers.0.mlp") or a glob of one
  // ("model.layers.*.mlp": '*' within a segment, '**' across).
  LeafPolicy& AddPath(std::string pattern);
  // What --leaf=TYPE_OR_PATH gives: matches either a type or a path.
  LeafPolicy& AddTypeOrPath(std::string pattern);
  LeafPolicy& AddPredicate(Predicate predicate);

  bool IsLeaf(absl::string_view path, absl::string_view type) const;

  // True when `type` is a torch.nn built-in leaf of the default policy.
  static bool IsTorchNnLeafType(absl::string_view type);

 private:
  bool torch_nn_ = false;
  std::vector<ir::ModulePattern> types_;
  std::vector<ir::ModulePattern> paths_;
  std::vector<Predicate> predicates_;
};

}  // namespace tracecut::tracer

#endif  // TRACECUT_TRACER_LEAF_POLICY_H_
