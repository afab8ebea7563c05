// WeightQuantModifier in a data-parallel run (Note [Distributed weight
// quantization]).

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "modifiers/weight_quant_modifier.h"
#include "runtime/collective.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

// Note [Distributed weight quantization]
//
// Every rank calls CompressDistributed with the same sorted module list (the
// selected leaves of the finished subgraph), whatever its shard reached:
//   1. one all-reduce of [tokens, samples, called, input batches, input
//      observed] per module; static input activations' statistics reduced
//      (Note [Static input activations] in weight_quant_modifier.h);
//   2. owners: modules with tokens, balanced by Hessian size (AssignOwners);
//   3. each module's partial sum S_r = sum x x^T is reduced (summed) to its
//      owner, which takes H = 2/n * sum_r S_r and solves it with the
//      single-process code (Compress) — owners solve in parallel;
//   4. in module order, the owner broadcasts its record (scale, zero point,
//      g_idx, global scale, scheme, input parameters, errors, notes and
//      warnings) and the quantized weight; the other ranks store both, so
//      every rank continues with the same weights.
// Modules without tokens on any rank are quantized round-to-nearest from
// their own weights on every rank (no communication: the same on all).
// Everything depends only on the world size and the data, never on timing:
// the reduction order of c10d's Gloo collectives is fixed for a world size.

namespace tracecut::modifiers {

using ::tracecut::quantization::HessianAccumulator;
using ::tracecut::runtime::AssignOwners;
using ::tracecut::runtime::Collective;
using ::tracecut::runtime::ReduceKind;
namespace {

c10::IValue TensorOrNone(const at::Tensor& t) {
  return t.defined() ? c10::IValue(t) : c10::IValue();
}

at::Tensor TensorOf(const c10::IValue& v) {
  return v.isTensor() ? v.toTensor() : at::Tensor();
}

c10::List<std::string> StringList(const std::vector<std::string>& v) {
  c10::List<std::string> out;
  for (const std::string& s : v) out.push_back(s);
  return out;
}

std::vector<std::string> Strings(const c10::IValue& v) {
  std::vector<std::string> out;
  for (const c10::IValue& e : v.toListRef()) out.push_back(e.toStringRef());
  return out;
}

c10::IValue PackRecord(const ModuleRecord& r,
                       const std::vector<std::string>& warnings) {
  return c10::ivalue::Tuple::create({r.type,
                                     static_cast<int64_t>(r.subgraph),
                                     r.weight_method,
                                     r.weight_scheme,
                                     TensorOrNone(r.weight_scale),
                                     TensorOrNone(r.weight_zero_point),
                                     TensorOrNone(r.weight_g_idx),
                                     r.weight_error,
                                     r.rtn_error,
                                     r.gptq_loss,
                                     r.calibration_tokens,
                                     r.compress_seconds,
                                     StringList(r.notes),
                                     StringList(warnings),
                                     r.weight_quantization,
                                     TensorOrNone(r.weight_global_scale),
                                     r.input.observer,
                                     r.input.scheme,
                                     r.input.min,
                                     r.input.max,
                                     r.input.batches,
                                     TensorOrNone(r.input.scale),
                                     TensorOrNone(r.input.zero_point),
                                     TensorOrNone(r.input.global_scale)});
}

// `with_input`: the modifier calibrated the module's input (Note [Static
// input activations]); otherwise r.input is another modifier's (an
// observer's running range) and is left alone.
absl::Status UnpackRecord(const c10::IValue& v, ModuleRecord& r,
                          std::vector<std::string>& warnings, bool with_input) {
  return runtime::TorchCall("a broadcast module record", [&] {
    const auto& e = v.toTupleRef().elements();
    TORCH_CHECK(e.size() == 24, "expected 24 fields, got ", e.size());
    r.type = e[0].toStringRef();
    r.subgraph = static_cast<int>(e[1].toInt());
    r.weight_method = e[2].toStringRef();
    r.weight_scheme = e[3].toStringRef();
    r.weight_scale = TensorOf(e[4]);
    r.weight_zero_point = TensorOf(e[5]);
    r.weight_g_idx = TensorOf(e[6]);
    r.weight_error = e[7].toDouble();
    r.rtn_error = e[8].toDouble();
    r.gptq_loss = e[9].toDouble();
    r.calibration_tokens = e[10].toInt();
    r.compress_seconds = e[11].toDouble();
    r.notes = Strings(e[12]);
    warnings = Strings(e[13]);
    r.weight_quantization = e[14].toStringRef();
    r.weight_global_scale = TensorOf(e[15]);
    if (!with_input) return;
    r.input.observer = e[16].toStringRef();
    r.input.scheme = e[17].toStringRef();
    r.input.min = e[18].toDouble();
    r.input.max = e[19].toDouble();
    r.input.batches = e[20].toInt();
    r.input.scale = TensorOf(e[21]);
    r.input.zero_point = TensorOf(e[22]);
    r.input.global_scale = TensorOf(e[23]);
  });
}

// Reduces `o`'s statistics (of `shape`) over the ranks as llm-compressor's
// _act_sync_dict does: static_minmax by min / max (what one process sees),
// minmax (a moving average) by the mean over the `observed` ranks that have
// statistics. A rank without any contributes the neutral value and takes
// the result in `dtype`.
absl::Status ReduceObserver(Collective& c, quantization::ActivationObserver& o,
                            std::vector<int64_t> shape, int64_t observed,
                            c10::ScalarType dtype, const std::string& what) {
  const bool mean = o.args().observer.value_or("minmax") == "minmax";
  const bool have = o.has_statistics();
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  at::Tensor lo, hi;
  RETURN_IF_ERROR(runtime::TorchCall(what, [&]() -> absl::Status {
    if (have) {
      const quantization::MinMax& s = o.statistics();
      if (s.min_vals.numel() != n) {
        return absl::InternalError(absl::StrCat(
            what, " has ", s.min_vals.numel(), " values, expected ", n));
      }
      dtype = s.min_vals.scalar_type();
      lo = s.min_vals.to(at::kFloat).reshape({n}).clone();
      hi = s.max_vals.to(at::kFloat).reshape({n}).clone();
    } else {
      const float inf = std::numeric_limits<float>::infinity();
      lo = at::full({n}, mean ? 0.0F : inf, at::kFloat);
      hi = at::full({n}, mean ? 0.0F : -inf, at::kFloat);
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(
      c.AllReduce(lo, mean ? ReduceKind::kSum : ReduceKind::kMin, what));
  RETURN_IF_ERROR(
      c.AllReduce(hi, mean ? ReduceKind::kSum : ReduceKind::kMax, what));
  return runtime::TorchCall(what, [&] {
    if (mean) {
      lo = lo / static_cast<double>(observed);
      hi = hi / static_cast<double>(observed);
    }
    o.set_statistics(
        {lo.reshape(shape).to(dtype), hi.reshape(shape).to(dtype)});
  });
}

}  // namespace

bool WeightQuantModifier::Distributed() const {
  return options_.collective != nullptr && options_.collective->distributed();
}

absl::Status WeightQuantModifier::CompressDistributed(
    RunContext& ctx, const std::vector<std::string>& paths, int subgraph) {
  Collective& c = *options_.collective;
  const std::string where =
      subgraph >= 0 ? absl::StrCat("subgraph ", subgraph) : "the end";
  for (const auto& [path, pending] : pending_) {
    if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
      return absl::InternalError(absl::StrCat(
          name(), ": ", path, " was called in ", where,
          " but is not among its leaf modules; ranks would disagree"));
    }
  }
  const int64_t k = static_cast<int64_t>(paths.size());
  // 1. Token and sample counts.
  at::Tensor counts = at::zeros({std::max<int64_t>(k, 1), 5}, at::kLong);
  auto acc = counts.accessor<int64_t, 2>();
  for (int64_t i = 0; i < k; ++i) {
    auto it = pending_.find(paths[i]);
    if (it == pending_.end()) continue;
    const Pending& p = it->second;
    acc[i][0] = p.tokens;
    acc[i][1] = p.hessian != nullptr ? p.hessian->num_samples() : 0;
    acc[i][2] = 1;
    acc[i][3] = p.input_batches;
    acc[i][4] = p.input.has_value() && p.input->has_statistics() ? 1 : 0;
  }
  RETURN_IF_ERROR(
      c.AllReduce(counts, ReduceKind::kSum,
                  absl::StrCat(name(), " token counts of ", where)));
  acc = counts.accessor<int64_t, 2>();

  // 2. Owners, by Hessian size.
  std::vector<int64_t> costs(k, 0);
  std::vector<int64_t> columns(k, 0);
  for (int64_t i = 0; i < k; ++i) {
    ASSIGN_OR_RETURN(at::Tensor w,
                     ctx.model().GetTensor(absl::StrCat(paths[i], ".weight")));
    columns[i] = w.size(transposed_.count(paths[i]) > 0 ? 0 : 1);
    if (acc[i][0] > 0) costs[i] = columns[i] * columns[i];
  }
  const std::vector<int> owner = AssignOwners(costs, c.world_size());
  if (static_input_.has_value()) {
    RETURN_IF_ERROR(ReduceInputs(paths, columns, counts, subgraph));
    CollectSiblingInputs();
  }

  // 3. Sums to owners; owners solve.
  const bool with_h = NeedsHessian() || options_.measure_error;
  std::vector<at::Tensor> sums(k);
  for (int64_t i = 0; i < k; ++i) {
    if (acc[i][0] == 0 || !with_h) continue;
    auto it = pending_.find(paths[i]);
    at::Tensor s;
    if (it != pending_.end() && it->second.hessian != nullptr) {
      s = it->second.hessian->hessian().to(at::kCPU).contiguous();
    } else {
      ASSIGN_OR_RETURN(s, runtime::TorchCall("", [&] {
                         return at::zeros({columns[i], columns[i]}, at::kFloat);
                       }));
    }
    RETURN_IF_ERROR(c.ReduceSum(
        s, owner[i], absl::StrCat("the input statistics of ", paths[i])));
    if (owner[i] == c.rank()) sums[i] = std::move(s);
    if (it != pending_.end()) it->second.hessian.reset();  // Memory back.
  }
  std::vector<std::vector<std::string>> warnings(k);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t tokens = acc[i][0];
    auto it = pending_.find(paths[i]);
    if (tokens > 0 && owner[i] != c.rank()) continue;
    Pending p;
    p.subgraph = it != pending_.end() ? it->second.subgraph : subgraph;
    p.tokens = tokens;
    if (it != pending_.end()) {
      p.input = std::move(it->second.input);
      p.input_batches = it->second.input_batches;
    }
    if (tokens > 0 && with_h) {
      p.hessian = std::make_unique<HessianAccumulator>(
          HessianAccumulator::FromSum(sums[i], acc[i][1], tokens));
      sums[i] = at::Tensor();
    }
    const size_t before = ctx.results().warnings.size();
    RETURN_IF_ERROR(Compress(ctx, paths[i], acc[i][2] > 0 ? &p : nullptr));
    const auto& all = ctx.results().warnings;
    warnings[i].assign(all.begin() + before, all.end());
  }

  // 4. Results from their owners, in module order.
  for (int64_t i = 0; i < k; ++i) {
    if (acc[i][0] == 0) continue;
    const std::string& path = paths[i];
    const bool mine = owner[i] == c.rank();
    ModuleRecord& r = ctx.results().Module(path);
    c10::IValue packed;
    if (mine) packed = PackRecord(r, warnings[i]);
    RETURN_IF_ERROR(c.BroadcastIValue(
        packed, owner[i], absl::StrCat("the ", name(), " result of ", path)));
    const std::string weight_path = absl::StrCat(path, ".weight");
    ASSIGN_OR_RETURN(at::Tensor w, ctx.model().GetTensor(weight_path));
    at::Tensor buffer;
    ASSIGN_OR_RETURN(buffer, runtime::TorchCall("", [&] {
                       return mine ? w.detach().contiguous()
                                   : w.detach().clone().contiguous();
                     }));
    at::Tensor bytes = buffer.view({-1}).view(at::kByte);
    RETURN_IF_ERROR(c.Broadcast(
        bytes, owner[i], absl::StrCat("the quantized weight of ", path)));
    if (mine) continue;
    std::vector<std::string> w_notes;
    RETURN_IF_ERROR(
        UnpackRecord(packed, r, w_notes, static_input_.has_value()));
    for (std::string& note : w_notes) ctx.Warn(std::move(note));
    RETURN_IF_ERROR(ctx.UpdateTensor(weight_path, buffer));
    done_.insert(path);
  }
  pending_.clear();
  if (subgraph >= 0) c.MaybeInjectFault(subgraph);
  return absl::OkStatus();
}

absl::Status WeightQuantModifier::ReduceInputs(
    const std::vector<std::string>& paths, const std::vector<int64_t>& columns,
    const at::Tensor& counts, int subgraph) {
  Collective& c = *options_.collective;
  const quantization::QuantizationArgs& args = *static_input_;
  const auto acc = counts.accessor<int64_t, 2>();
  for (size_t i = 0; i < paths.size(); ++i) {
    if (acc[i][4] == 0) continue;  // No rank observed it.
    const std::string& path = paths[i];
    const int64_t n =
        args.resolved_strategy() == quantization::Strategy::kTensorGroup
            ? columns[i] / *args.group_size
            : 1;
    Pending& p = pending_[path];
    if (!p.input.has_value()) {
      p.subgraph = subgraph;
      ASSIGN_OR_RETURN(quantization::ActivationObserver observer,
                       quantization::ActivationObserver::Create(args));
      p.input.emplace(std::move(observer));
    }
    RETURN_IF_ERROR(ReduceObserver(
        c, *p.input, {n}, acc[i][4], typed_dtype_.value_or(at::kFloat),
        absl::StrCat("the input activation range of ", path)));
    p.input_batches = acc[i][3];
  }
  return absl::OkStatus();
}

absl::Status WeightQuantModifier::ReduceKvCache() {
  if (!options_.kv_cache.has_value()) return absl::OkStatus();
  Collective& c = *options_.collective;
  std::vector<std::string> paths;
  for (const auto& [path, type] : kv_attentions_) {
    if (!kv_done_.contains(path)) paths.push_back(path);
  }
  if (paths.empty()) return absl::OkStatus();
  // [batches, ranks that observed it] per attention.
  at::Tensor counts =
      at::zeros({static_cast<int64_t>(paths.size()), 2}, at::kLong);
  auto acc = counts.accessor<int64_t, 2>();
  for (size_t i = 0; i < paths.size(); ++i) {
    auto it = kv_pending_.find(paths[i]);
    if (it == kv_pending_.end()) continue;
    acc[i][0] = it->second.batches;
    acc[i][1] = 1;
  }
  RETURN_IF_ERROR(c.AllReduce(counts, ReduceKind::kSum,
                              absl::StrCat(name(), " KV-cache batch counts")));
  acc = counts.accessor<int64_t, 2>();
  // Per KV head: [heads, 1, 1], as the observer keeps them.
  const bool per_head = options_.kv_cache->resolved_strategy() ==
                        quantization::Strategy::kAttnHead;
  const std::vector<int64_t> shape = per_head
                                         ? std::vector<int64_t>{kv_heads_, 1, 1}
                                         : std::vector<int64_t>{1};
  for (size_t i = 0; i < paths.size(); ++i) {
    if (acc[i][1] == 0) continue;  // In a later subgraph.
    const std::string& path = paths[i];
    ASSIGN_OR_RETURN(KvPending * pending,
                     KvPendingOf(path, kv_attentions_.at(path)));
    KvPending& p = *pending;
    for (auto [observer, which] :
         {std::pair(&*p.k, "keys"), std::pair(&*p.v, "values")}) {
      RETURN_IF_ERROR(ReduceObserver(
          c, *observer, shape, acc[i][1], typed_dtype_.value_or(at::kFloat),
          absl::StrCat("the ", which, " range of ", path)));
    }
    p.batches = acc[i][0];
  }
  return absl::OkStatus();
}

}  // namespace tracecut::modifiers
