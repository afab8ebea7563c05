#include "partition/check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/graph.h"
#include "ir/status_macros.h"
#include "partition/subgraph.h"
#include "runtime/interpreter.h"
#include "runtime/torch_status.h"

namespace tracecut::partition {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string Where(const std::string& path) {
  return path.empty() ? std::string("value") : path;
}

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

double ScalarError(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return 0.0;
  if (std::isnan(a) || std::isnan(b)) return kInf;
  if (a == b) return 0.0;  // Equal infinities too.
  return std::fabs(a - b);
}

absl::StatusOr<double> TensorError(const at::Tensor& a, const at::Tensor& b,
                                   const std::string& path) {
  if (!a.sizes().equals(b.sizes())) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(path), ": shape ", Shape(a), " vs ", Shape(b)));
  }
  if (a.numel() == 0) return 0.0;
  at::Tensor x = a.detach().to(at::kCPU, at::kDouble);
  at::Tensor y = b.detach().to(at::kCPU, at::kDouble);
  at::Tensor same = x.eq(y).logical_or(x.isnan().logical_and(y.isnan()));
  at::Tensor diff = (x - y).abs().masked_fill(same, 0.0);
  diff = diff.masked_fill(diff.isnan(), kInf);
  return diff.max().item<double>();
}

absl::StatusOr<double> Error(const c10::IValue& a, const c10::IValue& b,
                             const std::string& path) {
  if (a.isTensor() && b.isTensor()) {
    return TensorError(a.toTensor(), b.toTensor(), path);
  }
  if ((a.isTuple() || a.isList()) && (b.isTuple() || b.isList())) {
    std::vector<c10::IValue> x =
        a.isTuple() ? a.toTupleRef().elements().vec() : a.toListRef().vec();
    std::vector<c10::IValue> y =
        b.isTuple() ? b.toTupleRef().elements().vec() : b.toListRef().vec();
    if (x.size() != y.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(path), ": ", x.size(), " elements vs ", y.size()));
    }
    double worst = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSIGN_OR_RETURN(double e,
                       Error(x[i], y[i], absl::StrCat(path, "[", i, "]")));
      worst = std::max(worst, e);
    }
    return worst;
  }
  auto number = [](const c10::IValue& v) -> std::optional<double> {
    if (v.isInt()) return static_cast<double>(v.toInt());
    if (v.isDouble()) return v.toDouble();
    if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
    return std::nullopt;
  };
  std::optional<double> na = number(a);
  std::optional<double> nb = number(b);
  if (na && nb) return ScalarError(*na, *nb);
  if (a.isNone() && b.isNone()) return 0.0;
  if (a.isString() && b.isString() && a.toStringRef() == b.toStringRef()) {
    return 0.0;
  }
  if (a.isDevice() && b.isDevice() && a.toDevice() == b.toDevice()) {
    return 0.0;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      Where(path), ": cannot compare ", a.tagKind(), " with ", b.tagKind()));
}

std::string Sub(int index) { return absl::StrCat("subgraph ", index); }

// Runs the subgraphs; `on_outputs(s, values)` sees each subgraph's outputs.
template <typename OnOutputs>
absl::StatusOr<c10::IValue> Run(const Partition& partition,
                                const torch::jit::Module& root,
                                const std::vector<c10::IValue>& inputs,
                                PartitionRunStats* stats,
                                OnOutputs&& on_outputs) {
  if (inputs.size() != partition.model_inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition run: ", inputs.size(), " inputs for ",
                     partition.model_inputs.size(), " model inputs"));
  }
  RETURN_IF_ERROR(VerifySchedule(partition));
  absl::flat_hash_map<std::string, c10::IValue> values;
  for (size_t i = 0; i < inputs.size(); ++i) {
    values[partition.model_inputs[i]] = inputs[i];
  }
  int64_t peak = static_cast<int64_t>(values.size());
  auto gather = [&](const std::vector<std::string>& names) {
    std::vector<c10::IValue> args;
    args.reserve(names.size());
    for (const std::string& name : names) args.push_back(values.at(name));
    return args;
  };
  for (const Subgraph& s : partition.subgraphs) {
    absl::StatusOr<runtime::Interpreter> interp =
        runtime::Interpreter::Create(*s.graph, root);
    if (!interp.ok()) {
      return absl::Status(
          interp.status().code(),
          absl::StrCat(Sub(s.index), ": ", interp.status().message()));
    }
    absl::StatusOr<c10::IValue> out = interp->Run(gather(s.input_names));
    if (!out.ok()) {
      return absl::Status(
          out.status().code(),
          absl::StrCat(Sub(s.index), ": ", out.status().message()));
    }
    if (!out->isTuple() ||
        out->toTupleRef().elements().size() != s.output_names.size()) {
      return absl::InternalError(absl::StrCat(
          Sub(s.index), ": expected a tuple of ", s.output_names.size(),
          " outputs, got ", out->tagKind()));
    }
    c10::ArrayRef<c10::IValue> elements =
        out->toTupleRef().elements().asArrayRef();
    for (size_t k = 0; k < elements.size(); ++k) {
      values[s.output_names[k]] = elements[k];
    }
    RETURN_IF_ERROR(on_outputs(s, elements));
    peak = std::max(peak, static_cast<int64_t>(values.size()));
    for (const std::string& name : s.last_use) values.erase(name);
  }
  ASSIGN_OR_RETURN(runtime::Interpreter tail,
                   runtime::Interpreter::Create(*partition.output_graph, root));
  if (stats != nullptr) stats->peak_cached_values = peak;
  return tail.Run(gather(partition.model_outputs));
}

}  // namespace

absl::StatusOr<double> MaxAbsError(const c10::IValue& a, const c10::IValue& b) {
  return runtime::TorchCall("comparing values",
                            [&] { return Error(a, b, ""); });
}

absl::StatusOr<c10::IValue> RunPartition(const Partition& partition,
                                         const torch::jit::Module& root,
                                         const std::vector<c10::IValue>& inputs,
                                         PartitionRunStats* stats) {
  return Run(partition, root, inputs, stats,
             [](const Subgraph&, c10::ArrayRef<c10::IValue>) {
               return absl::OkStatus();
             });
}

absl::StatusOr<CheckResult> CheckPartition(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Partition& partition, const std::vector<c10::IValue>& inputs) {
  // The whole graph, remembering every value a subgraph outputs.
  absl::flat_hash_set<std::string> wanted;
  for (const Subgraph& s : partition.subgraphs) {
    wanted.insert(s.output_names.begin(), s.output_names.end());
  }
  absl::flat_hash_map<std::string, c10::IValue> reference;
  ASSIGN_OR_RETURN(runtime::Interpreter whole,
                   runtime::Interpreter::Create(graph, root));
  whole.AddNodeHook([&](const ir::Node& node, absl::Span<const c10::IValue>,
                        const c10::IValue* output) {
    if (output != nullptr && wanted.contains(node.name())) {
      reference[node.name()] = *output;
    }
  });
  ASSIGN_OR_RETURN(c10::IValue expected, whole.Run(inputs));

  CheckResult result;
  PartitionRunStats stats;
  auto on_outputs = [&](const Subgraph& s,
                        c10::ArrayRef<c10::IValue> outs) -> absl::Status {
    double worst = 0.0;
    for (size_t k = 0; k < outs.size(); ++k) {
      auto it = reference.find(s.output_names[k]);
      if (it == reference.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Sub(s.index), " outputs %", s.output_names[k],
                         ", which the whole graph does not compute"));
      }
      absl::StatusOr<double> e = MaxAbsError(it->second, outs[k]);
      if (!e.ok()) {
        return absl::Status(
            e.status().code(),
            absl::StrCat(Sub(s.index), " output %", s.output_names[k], ": ",
                         e.status().message()));
      }
      worst = std::max(worst, *e);
    }
    result.subgraph_errors.push_back(worst);
    if (worst > 0.0 && result.first_divergent < 0) {
      result.first_divergent = s.index;
    }
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(c10::IValue actual,
                   Run(partition, root, inputs, &stats, on_outputs));
  absl::StatusOr<double> e = MaxAbsError(expected, actual);
  if (!e.ok()) {
    return absl::Status(e.status().code(),
                        absl::StrCat("model output: ", e.status().message()));
  }
  result.max_abs_error = *e;
  result.peak_cached_values = stats.peak_cached_values;
  return result;
}

absl::StatusOr<CheckResult> CheckPartition(
    const runtime::GraphModule& gm, const Partition& partition,
    const std::vector<c10::IValue>& inputs) {
  return CheckPartition(gm.graph(), gm.module(), partition, inputs);
}

}  // namespace tracecut::partition
