#include "pipelines/pipeline_internal.h"

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "util/status_macros.h"

namespace tracecut::pipelines::internal {
namespace {

using runtime::Interpreter;

// Thrown from a module hook to stop a run early once a modifier failed; the
// pipeline returns the modifier's status instead of the interpreter's.
struct HookAbort : std::exception {
  const char* what() const noexcept override { return "modifier failed"; }
};

}  // namespace

std::string NonFiniteKind(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.is_floating_point() || t.numel() == 0) return "";
    if (at::isfinite(t).all().item<bool>()) return "";
    return at::isnan(t).any().item<bool>() ? "NaN" : "infinite";
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      std::string k = NonFiniteKind(e);
      if (!k.empty()) return k;
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      std::string k = NonFiniteKind(e);
      if (!k.empty()) return k;
    }
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      std::string k = NonFiniteKind(e.value());
      if (!k.empty()) return k;
    }
  }
  return "";
}

absl::Status ForEachModifier(absl::Span<Modifier* const> modifiers,
                             const std::function<absl::Status(Modifier*)>& fn) {
  for (Modifier* m : modifiers) RETURN_IF_ERROR(fn(m));
  return absl::OkStatus();
}

HookDispatcher::HookDispatcher(RunContext& ctx,
                               absl::Span<Modifier* const> modifiers)
    : ctx_(ctx) {
  for (const LeafModule& leaf : ctx.leaf_modules()) {
    std::vector<Modifier*> wanted;
    for (Modifier* m : modifiers) {
      if (m->WantsModule(leaf.path, leaf.type)) wanted.push_back(m);
    }
    if (!wanted.empty()) {
      routes_[leaf.path] = Route{&leaf, std::move(wanted)};
    }
  }
}

Interpreter::HookId HookDispatcher::Attach(Interpreter& interp, int subgraph,
                                           const AllExpertsRunner* routed) {
  return interp.AddModuleHook(
      [this, subgraph, routed](
          const ir::Node& node, const torch::jit::Module& module,
          absl::Span<const c10::IValue> inputs, const c10::IValue* output) {
        if (output == nullptr || !status_.ok()) return;
        auto it = routes_.find(node.target());
        if (it == routes_.end()) return;
        if (routed != nullptr && routed->InExpert(node.target())) return;
        ModuleCall call;
        call.node = &node;
        call.path = it->second.leaf->path;
        call.type = it->second.leaf->type;
        call.module = &module;
        call.inputs = inputs;
        call.output = output;
        call.batch = batch_;
        call.subgraph = subgraph;
        for (Modifier* m : it->second.modifiers) {
          absl::Status s = m->OnModuleCall(ctx_, call);
          if (!s.ok()) {
            status_ = std::move(s);
            throw HookAbort();
          }
        }
      });
}

}  // namespace tracecut::pipelines::internal
