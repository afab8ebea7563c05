// WeightQuantModifier's activations: the static input activations of its
// Linears (Note [Static input activations]) and the keys and values of its
// attentions (Note [KV cache]), both in weight_quant_modifier.h.

#include <ATen/ATen.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "modifiers/weight_quant_modifier.h"
#include "quantization/observers.h"
#include "runtime/torch_status.h"
#include "util/json.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {
namespace {

// `range` from what `observer` saw: its parameters (scale in
// `scale_dtype`), overall min / max, observer and args; batches left alone.
absl::Status FinishRange(const quantization::ActivationObserver& observer,
                         c10::ScalarType scale_dtype, ActivationRange& range) {
  ASSIGN_OR_RETURN(quantization::QParams q, observer.Finish(scale_dtype));
  const quantization::MinMax& stats = observer.statistics();
  RETURN_IF_ERROR(runtime::TorchCall("activation range", [&] {
    range.min = stats.min_vals.min().item<double>();
    range.max = stats.max_vals.max().item<double>();
  }));
  range.observer = observer.args().observer.value_or("minmax");
  range.scheme = observer.args().ToString();
  range.scale = q.scale;
  range.zero_point = q.zero_point;
  range.global_scale = q.global_scale;
  return absl::OkStatus();
}

}  // namespace

bool WeightQuantModifier::WantsFunction(const ir::Node& node) const {
  return options_.kv_cache.has_value() &&
         node.op() == ir::OpKind::kCallFunction &&
         node.target() == "aten::scaled_dot_product_attention";
}

absl::Status WeightQuantModifier::OnFunctionCall(RunContext& ctx,
                                                 const FunctionCall& call) {
  const std::string path(call.module_path);
  if (kv_done_.contains(path)) return absl::OkStatus();
  const std::string where =
      absl::StrCat(name(), ": the keys and values of ", path,
                   " in calibration batch ", call.batch);
  if (call.inputs.size() < 3 || !call.inputs[1].isTensor() ||
      !call.inputs[2].isTensor()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": scaled_dot_product_attention without tensor "
                     "keys and values"));
  }
  ASSIGN_OR_RETURN(KvPending * pending,
                   KvPendingOf(path, call.node->scope().type()));
  KvPending& p = *pending;
  const bool per_head = options_.kv_cache->resolved_strategy() ==
                        quantization::Strategy::kAttnHead;
  for (int i : {1, 2}) {
    at::Tensor t = call.inputs[i].toTensor();
    if (per_head && t.dim() == 4 && t.size(1) != kv_heads_) {
      // GQA: the attention's heads repeat each KV head (transformers'
      // repeat_kv, KV-head-major); the cache holds each once.
      if (kv_heads_ <= 0 || t.size(1) % kv_heads_ != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", t.size(1),
                         " attention heads are no multiple of "
                         "the ",
                         kv_heads_, " key/value heads of config.json"));
      }
      t = t.slice(1, 0, t.size(1), t.size(1) / kv_heads_);
    }
    ASSIGN_OR_RETURN(at::Tensor x, runtime::TorchCall(where, [&] {
                       return typed_dtype_.has_value() ? t.to(*typed_dtype_)
                                                       : t;
                     }));
    RETURN_IF_ERROR(util::Annotate((i == 1 ? p.k : p.v)->Observe(x), where));
  }
  ++p.batches;
  return absl::OkStatus();
}

absl::StatusOr<WeightQuantModifier::KvPending*>
WeightQuantModifier::KvPendingOf(const std::string& path,
                                 const std::string& type) {
  KvPending& p = kv_pending_[path];
  if (!p.k.has_value()) {
    p.type = type;
    ASSIGN_OR_RETURN(quantization::ActivationObserver k,
                     quantization::ActivationObserver::CreateForAttention(
                         *options_.kv_cache));
    p.k.emplace(k);
    p.v.emplace(std::move(k));
  }
  return &p;
}

absl::Status WeightQuantModifier::RecordKvCache(RunContext& ctx) {
  for (auto& [path, p] : kv_pending_) {
    ModuleRecord& r = ctx.results().Module(path);
    if (r.type.empty()) r.type = p.type;
    r.kv_cache_scheme = util::DumpJson(options_.kv_cache->ToJson());
    for (auto [observer, range] :
         {std::pair(&*p.k, &r.k_cache), std::pair(&*p.v, &r.v_cache)}) {
      if (!observer->has_statistics()) {
        return absl::FailedPreconditionError(absl::StrCat(
            name(), ": no calibration token reached the attention of ", path,
            "; its KV-cache scales cannot be calibrated"));
      }
      RETURN_IF_ERROR(
          FinishRange(*observer, typed_dtype_.value_or(at::kFloat), *range));
      range->batches = p.batches;
    }
    kv_done_.insert(path);
  }
  kv_pending_.clear();
  return absl::OkStatus();
}

absl::Status WeightQuantModifier::ObserveInput(const std::string& path,
                                               const at::Tensor& x,
                                               int64_t batch,
                                               Pending& pending) {
  if (!pending.input.has_value()) {
    ASSIGN_OR_RETURN(quantization::ActivationObserver observer,
                     quantization::ActivationObserver::Create(*static_input_));
    pending.input.emplace(std::move(observer));
  }
  if (x.numel() == 0) return absl::OkStatus();
  const std::string where = absl::StrCat(name(), ": the input of ", path,
                                         " in calibration batch ", batch);
  // llm-compressor observes the activation its model computes, in the
  // checkpoint's dtype; tracecut's runs in fp32.
  ASSIGN_OR_RETURN(at::Tensor value, runtime::TorchCall(where, [&] {
                     return typed_dtype_.has_value() ? x.to(*typed_dtype_) : x;
                   }));
  RETURN_IF_ERROR(util::Annotate(pending.input->Observe(value), where));
  ++pending.input_batches;
  return absl::OkStatus();
}

void WeightQuantModifier::CollectSiblingInputs() {
  sibling_inputs_.clear();
  for (const auto& [path, pending] : pending_) {
    if (!pending.input.has_value() || !pending.input->has_statistics()) {
      continue;
    }
    const quantization::MinMax& stats = pending.input->statistics();
    const std::string key(path.substr(path.rfind('.') + 1));
    auto [it, added] = sibling_inputs_.emplace(key, stats);
    if (added) continue;
    if (!it->second.min_vals.sizes().equals(stats.min_vals.sizes())) continue;
    it->second.min_vals = at::minimum(it->second.min_vals, stats.min_vals);
    it->second.max_vals = at::maximum(it->second.max_vals, stats.max_vals);
  }
}

absl::Status WeightQuantModifier::RecordInput(RunContext& ctx,
                                              const std::string& path,
                                              Pending* pending,
                                              ModuleRecord& r) {
  const quantization::QuantizationArgs& args = *static_input_;
  if (!r.input.observer.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        name(), ": the input activations of ", path,
        " were calibrated already (by another modifier); a module's input "
        "gets one quantization"));
  }
  ASSIGN_OR_RETURN(quantization::ActivationObserver observer,
                   quantization::ActivationObserver::Create(args));
  if (pending != nullptr && pending->input.has_value() &&
      pending->input->has_statistics()) {
    observer = *pending->input;
    r.input.batches = pending->input_batches;
  } else {
    const std::string key(path.substr(path.rfind('.') + 1));
    auto it = sibling_inputs_.find(key);
    if (it == sibling_inputs_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          name(), ": no calibration token reached ", path,
          ", so the scale of its static input activations (", args.ToString(),
          ") cannot be calibrated; calibrate with more data, set "
          "calibrate_all_experts for MoE experts, add it to ignore, or use "
          "a scheme with dynamic activations"));
    }
    observer.set_statistics(it->second);
    std::string why = absl::StrCat(
        "no calibration token reached it: its input activation scale is "
        "taken from the range the other '",
        key, "' modules of its subgraph saw");
    r.notes.push_back(why);
    ctx.Warn(absl::StrCat(name(), ": ", path, ": ", why));
  }
  const c10::ScalarType dtype = r.weight_scale.defined() &&
                                        r.weight_scale.is_floating_point() &&
                                        r.weight_scale.element_size() >= 2
                                    ? r.weight_scale.scalar_type()
                                    : typed_dtype_.value_or(at::kFloat);
  return FinishRange(observer, dtype, r.input);
}

}  // namespace tracecut::modifiers
