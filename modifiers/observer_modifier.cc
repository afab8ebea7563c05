#include "modifiers/observer_modifier.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/collective.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::modifiers {

using ::tracecut::quantization::ComputeQuantParams;
using ::tracecut::quantization::QuantParams;
using ::tracecut::quantization::QuantScheme;
using ::tracecut::runtime::Collective;
using ::tracecut::runtime::ReduceKind;
namespace {

// The first tensor in a module's output (tuples: the first element that is
// one).
const at::Tensor* OutputTensor(const c10::IValue& v) {
  if (v.isTensor()) return &v.toTensor();
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (const at::Tensor* t = OutputTensor(e)) return t;
    }
  }
  return nullptr;
}

}  // namespace

absl::string_view ObserverKindName(ObserverKind kind) {
  switch (kind) {
    case ObserverKind::kMinMax:
      return "minmax";
    case ObserverKind::kMovingAverageMinMax:
      return "moving-average-minmax";
  }
  return "?";
}

absl::string_view ObservedTensorName(ObservedTensor tensor) {
  switch (tensor) {
    case ObservedTensor::kInput:
      return "input";
    case ObservedTensor::kOutput:
      return "output";
    case ObservedTensor::kWeight:
      return "weight";
  }
  return "?";
}

absl::StatusOr<QuantParams> RangeParams(double lo, double hi,
                                        const QuantScheme& scheme) {
  return runtime::TorchCall(
      "activation range", [&]() -> absl::StatusOr<QuantParams> {
        at::Tensor range =
            at::tensor({static_cast<float>(lo), static_cast<float>(hi)},
                       at::kFloat)
                .view({1, 2});
        QuantParams p = quantization::internal::MinMaxParams(
            range, scheme, /*per_tensor=*/true);
        p.scale = p.scale.reshape({1}).contiguous();
        p.zero_point = p.zero_point.reshape({1}).contiguous();
        return p;
      });
}

Observer::Observer(ObserverOptions options) : options_(std::move(options)) {
  if (options_.observe != ObservedTensor::kWeight) {
    options_.scheme.group_size = -1;
    options_.scheme.per_tensor = true;
  }
}

std::string Observer::name() const {
  return absl::StrCat(ObserverKindName(options_.kind), "-",
                      ObservedTensorName(options_.observe), "-observer");
}

ActivationRange& Observer::RangeOf(ModuleRecord& record) const {
  return options_.observe == ObservedTensor::kOutput ? record.output
                                                     : record.input;
}

bool Observer::WantsModule(absl::string_view path,
                           absl::string_view type) const {
  return selected_.count(std::string(path)) > 0;
}

absl::Status Observer::OnRunStart(RunContext& ctx) {
  RETURN_IF_ERROR(options_.scheme.Validate());
  if (!(options_.averaging_constant > 0 && options_.averaging_constant <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": averaging_constant must be in (0, 1], got ",
                     options_.averaging_constant));
  }
  ASSIGN_OR_RETURN(std::vector<const LeafModule*> leaves,
                   options_.modules.Select(ctx, name()));
  selected_.clear();
  for (const LeafModule* leaf : leaves) {
    if (options_.observe == ObservedTensor::kWeight) {
      absl::StatusOr<at::Tensor> w =
          ctx.model().GetTensor(absl::StrCat(leaf->path, ".weight"));
      if (!w.ok() || w->dim() != 2 || !w->is_floating_point()) {
        ctx.Warn(absl::StrCat(name(), ": ", leaf->path,
                              " has no 2-D floating weight; skipped"));
        continue;
      }
    }
    selected_.insert(leaf->path);
  }
  if (selected_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": no selected module has a 2-D weight"));
  }
  pending_.clear();
  return absl::OkStatus();
}

absl::Status Observer::OnModuleCall(RunContext& ctx, const ModuleCall& call) {
  if (options_.observe == ObservedTensor::kWeight) {
    ModuleRecord& r = ctx.results().Module(call.path);
    if (r.type.empty()) {
      r.type = std::string(call.type);
      r.subgraph = call.subgraph;
    }
    pending_.insert(std::string(call.path));
    return absl::OkStatus();
  }
  const at::Tensor* x = nullptr;
  if (options_.observe == ObservedTensor::kInput) {
    if (!call.inputs.empty() && call.inputs[0].isTensor()) {
      x = &call.inputs[0].toTensor();
    }
  } else if (call.output != nullptr) {
    x = OutputTensor(*call.output);
  }
  const absl::string_view what = ObservedTensorName(options_.observe);
  if (x == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": the ", what, " of ", call.path, " (",
                     ShortType(call.type), ") is not a tensor"));
  }
  if (!x->is_floating_point()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name(), ": the ", what, " of ", call.path, " is ",
        quantization::internal::DescribeTensor(*x), ", not a floating tensor"));
  }
  // No tokens (an MoE expert the router did not pick in this batch):
  // nothing to observe. A module that never sees any is warned about at
  // the end of the run.
  if (x->numel() == 0) return absl::OkStatus();
  double lo = 0, hi = 0;
  RETURN_IF_ERROR(runtime::TorchCall(
      absl::StrCat(name(), " on ", call.path), [&]() -> absl::Status {
        at::Tensor xf = x->detach().to(at::kFloat);
        lo = xf.min().item<float>();
        hi = xf.max().item<float>();
        return absl::OkStatus();
      }));
  if (!std::isfinite(lo) || !std::isfinite(hi)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "non-finite activation: the %s of %s (%s) in calibration batch %d "
        "has %s entries",
        what, call.path, ShortType(call.type), call.batch,
        std::isnan(lo) || std::isnan(hi) ? "NaN" : "infinite"));
  }
  ModuleRecord& record = ctx.results().Module(call.path);
  ActivationRange& r = RangeOf(record);
  if (r.batches == 0) {
    if (record.type.empty()) {
      record.type = std::string(call.type);
      record.subgraph = call.subgraph;
    }
    r.observer = std::string(ObserverKindName(options_.kind));
    r.scheme = options_.scheme.ToString();
    r.min = lo;
    r.max = hi;
  } else if (options_.kind == ObserverKind::kMinMax) {
    r.min = std::min(r.min, lo);
    r.max = std::max(r.max, hi);
  } else {
    const double c = options_.averaging_constant;
    r.min = r.min + c * (lo - r.min);
    r.max = r.max + c * (hi - r.max);
  }
  ++r.batches;
  pending_.insert(std::string(call.path));
  return absl::OkStatus();
}

absl::Status Observer::CombineRanks(RunContext& ctx,
                                    const SubgraphInfo& subgraph) {
  Collective& c = *options_.collective;
  std::vector<std::string> paths;
  for (const std::string& leaf : subgraph.leaf_modules) {
    if (selected_.count(leaf) > 0) paths.push_back(leaf);
  }
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
  for (const std::string& path : pending_) {
    if (!std::binary_search(paths.begin(), paths.end(), path)) {
      return absl::InternalError(absl::StrCat(
          name(), ": ", path, " was called in subgraph ", subgraph.index,
          " but is not among its leaf modules; ranks would disagree"));
    }
  }
  const int64_t k = static_cast<int64_t>(paths.size());
  const bool weights = options_.observe == ObservedTensor::kWeight;
  const bool minmax = options_.kind == ObserverKind::kMinMax;
  // Per module: [batches, min, max] (weighted sums for moving averages),
  // reduced as [sum; min, -max min] in two collectives.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  at::Tensor sums = at::zeros({std::max<int64_t>(k, 1), 3}, at::kDouble);
  at::Tensor mins = at::full({std::max<int64_t>(k, 1), 2}, kInf, at::kDouble);
  auto s = sums.accessor<double, 2>();
  auto m = mins.accessor<double, 2>();
  for (int64_t i = 0; i < k; ++i) {
    if (pending_.count(paths[i]) == 0) continue;
    if (weights) {
      s[i][0] = 1;
      continue;
    }
    const ActivationRange& r = RangeOf(ctx.results().Module(paths[i]));
    s[i][0] = static_cast<double>(r.batches);
    s[i][1] = r.min * r.batches;
    s[i][2] = r.max * r.batches;
    m[i][0] = r.min;
    m[i][1] = -r.max;
  }
  const std::string what =
      absl::StrCat(name(), " ranges of subgraph ", subgraph.index);
  RETURN_IF_ERROR(c.AllReduce(sums, ReduceKind::kSum, what));
  if (!weights && minmax) {
    RETURN_IF_ERROR(c.AllReduce(mins, ReduceKind::kMin, what));
  }
  s = sums.accessor<double, 2>();
  m = mins.accessor<double, 2>();
  pending_.clear();
  for (int64_t i = 0; i < k; ++i) {
    if (s[i][0] <= 0) continue;
    pending_.insert(paths[i]);
    ModuleRecord& record = ctx.results().Module(paths[i]);
    if (record.type.empty()) {
      if (const LeafModule* leaf = ctx.FindLeaf(paths[i])) {
        record.type = leaf->type;
      }
      record.subgraph = subgraph.index;
    }
    if (weights) continue;
    ActivationRange& r = RangeOf(record);
    r.observer = std::string(ObserverKindName(options_.kind));
    r.scheme = options_.scheme.ToString();
    r.batches = static_cast<int64_t>(s[i][0]);
    if (minmax) {
      r.min = m[i][0];
      r.max = -m[i][1];
    } else {
      r.min = s[i][1] / s[i][0];
      r.max = s[i][2] / s[i][0];
    }
  }
  return absl::OkStatus();
}

absl::Status Observer::OnSubgraphEnd(RunContext& ctx,
                                     const SubgraphInfo& subgraph) {
  if (options_.collective != nullptr && options_.collective->distributed()) {
    RETURN_IF_ERROR(CombineRanks(ctx, subgraph));
  }
  for (const std::string& path : pending_) {
    ModuleRecord& record = ctx.results().Module(path);
    if (options_.observe == ObservedTensor::kWeight) {
      if (!record.weight_method.empty()) {
        record.notes.push_back(
            absl::StrCat(name(), ": weight parameters already set by ",
                         record.weight_method, "; not overwritten"));
        continue;
      }
      ASSIGN_OR_RETURN(at::Tensor w,
                       ctx.model().GetTensor(absl::StrCat(path, ".weight")));
      ASSIGN_OR_RETURN(QuantParams p, ComputeQuantParams(w, options_.scheme));
      record.weight_method = "observer";
      record.weight_scheme = options_.scheme.ToString();
      record.weight_scale = p.scale;
      record.weight_zero_point = p.zero_point;
      continue;
    }
    ActivationRange& r = RangeOf(record);
    ASSIGN_OR_RETURN(QuantParams p, RangeParams(r.min, r.max, options_.scheme));
    r.scale = p.scale;
    r.zero_point = p.zero_point;
  }
  pending_.clear();
  return absl::OkStatus();
}

absl::Status Observer::OnRunEnd(RunContext& ctx) {
  for (const std::string& path : selected_) {
    const ModuleRecord* r = ctx.results().FindModule(path);
    bool seen =
        r != nullptr && (options_.observe == ObservedTensor::kWeight
                             ? !r->weight_method.empty()
                             : (options_.observe == ObservedTensor::kOutput
                                    ? r->output.batches > 0
                                    : r->input.batches > 0));
    if (!seen) {
      ctx.Warn(absl::StrCat(name(), ": ", path,
                            " received no calibration tokens (never called, "
                            "or only with empty inputs); no parameters"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tracecut::modifiers
