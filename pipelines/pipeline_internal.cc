#include "pipelines/pipeline_internal.h"

#include <ATen/ATen.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::internal {

using ::tracecut::modifiers::ActivationRange;
using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::FunctionCall;
using ::tracecut::modifiers::LeafModule;
using ::tracecut::modifiers::Modifier;
using ::tracecut::modifiers::ModuleCall;
using ::tracecut::modifiers::RunContext;
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
  // Modifiers that want function calls get them through a node hook, which
  // is only added for them (Attach).
  for (Modifier* m : modifiers) {
    for (const ir::Node* node : ctx.model().graph().nodes()) {
      if (node->op() == ir::OpKind::kCallFunction && m->WantsFunction(*node)) {
        function_modifiers_.push_back(m);
        break;
      }
    }
  }
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

std::vector<Interpreter::HookId> HookDispatcher::Attach(
    Interpreter& interp, int subgraph, const AllExpertsRunner* routed) {
  std::vector<Interpreter::HookId> ids;
  if (!function_modifiers_.empty()) {
    ids.push_back(interp.AddNodeHook(
        [this, subgraph](const ir::Node& node,
                         absl::Span<const c10::IValue> inputs,
                         const c10::IValue* output) {
          if (output == nullptr || !status_.ok() ||
              node.op() != ir::OpKind::kCallFunction) {
            return;
          }
          for (Modifier* m : function_modifiers_) {
            if (!m->WantsFunction(node)) continue;
            FunctionCall call;
            call.node = &node;
            call.module_path = node.scope().path();
            call.inputs = inputs;
            call.output = output;
            call.batch = batch_;
            call.subgraph = subgraph;
            absl::Status s = m->OnFunctionCall(ctx_, call);
            if (!s.ok()) {
              status_ = std::move(s);
              throw HookAbort();
            }
          }
        }));
  }
  ids.push_back(interp.AddModuleHook(
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
      }));
  return ids;
}

absl::Status RecordsToHost(CalibrationResults& results) {
  return runtime::TorchCall("moving results to the host", [&] {
    const c10::Device host(c10::kCPU);
    auto to_host = [&](at::Tensor& t) {
      if (t.defined() && !t.device().is_cpu()) t = t.to(host);
    };
    for (auto& [path, r] : results.modules) {
      for (at::Tensor* t : {&r.weight_scale, &r.weight_zero_point,
                            &r.weight_g_idx, &r.weight_global_scale}) {
        to_host(*t);
      }
      for (ActivationRange* range :
           {&r.input, &r.output, &r.k_cache, &r.v_cache}) {
        to_host(range->scale);
        to_host(range->zero_point);
        to_host(range->global_scale);
      }
    }
  });
}

}  // namespace tracecut::pipelines::internal
