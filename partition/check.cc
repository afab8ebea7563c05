#include "partition/check.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
#include "partition/subgraph.h"
#include "runtime/compare.h"
#include "runtime/device.h"
#include "runtime/device_placement.h"
#include "runtime/interpreter.h"
#include "util/status_macros.h"

namespace tracecut::partition {
namespace {

std::string Sub(int index) { return absl::StrCat("subgraph ", index); }

// Runs the subgraphs; `on_outputs(s, values)` sees each subgraph's outputs.
template <typename OnOutputs>
absl::StatusOr<c10::IValue> Run(const Partition& partition,
                                const torch::jit::Module& root,
                                const std::vector<c10::IValue>& inputs,
                                c10::Device device, PartitionRunStats* stats,
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
    interp->PlaceOn(device);
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
  tail.PlaceOn(device);
  if (stats != nullptr) stats->peak_cached_values = peak;
  return tail.Run(gather(partition.model_outputs));
}

// CheckPartition with `inputs` and the model's tensors on options.device.
absl::StatusOr<CheckResult> CheckOnDevice(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Partition& partition, const std::vector<c10::IValue>& inputs,
    const runtime::CompareOptions& options);

}  // namespace

absl::StatusOr<c10::IValue> RunPartition(const Partition& partition,
                                         const torch::jit::Module& root,
                                         const std::vector<c10::IValue>& inputs,
                                         PartitionRunStats* stats) {
  return Run(partition, root, inputs, c10::Device(c10::kCPU), stats,
             [](const Subgraph&, c10::ArrayRef<c10::IValue>) {
               return absl::OkStatus();
             });
}

absl::StatusOr<CheckResult> CheckPartition(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Partition& partition, const std::vector<c10::IValue>& host_inputs,
    const runtime::CompareOptions& options) {
  if (!options.device.is_cpu()) {
    // The model's tensors on the device for both runs, back after them.
    return runtime::DevicePlacement::WithModuleOn(
        root, options.device, [&]() -> absl::StatusOr<CheckResult> {
          ASSIGN_OR_RETURN(
              std::vector<c10::IValue> inputs,
              runtime::ValuesToDevice(host_inputs, options.device));
          return CheckOnDevice(graph, root, partition, inputs, options);
        });
  }
  return CheckOnDevice(graph, root, partition, host_inputs, options);
}

namespace {

absl::StatusOr<CheckResult> CheckOnDevice(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Partition& partition, const std::vector<c10::IValue>& inputs,
    const runtime::CompareOptions& options) {
  // The whole graph, remembering every value a subgraph outputs.
  absl::flat_hash_set<std::string> wanted;
  for (const Subgraph& s : partition.subgraphs) {
    wanted.insert(s.output_names.begin(), s.output_names.end());
  }
  absl::flat_hash_map<std::string, c10::IValue> reference;
  ASSIGN_OR_RETURN(runtime::Interpreter whole,
                   runtime::Interpreter::Create(graph, root));
  whole.PlaceOn(options.device);
  whole.AddNodeHook([&](const ir::Node& node, absl::Span<const c10::IValue>,
                        const c10::IValue* output) {
    if (output != nullptr && wanted.contains(node.name())) {
      reference[node.name()] = *output;
    }
  });
  ASSIGN_OR_RETURN(c10::IValue expected, whole.Run(inputs));

  RETURN_IF_ERROR(runtime::ValidateCompareOptions(options));
  CheckResult result;
  PartitionRunStats stats;
  auto on_outputs = [&](const Subgraph& s,
                        c10::ArrayRef<c10::IValue> outs) -> absl::Status {
    runtime::Comparator comparator(options);
    for (size_t k = 0; k < outs.size(); ++k) {
      auto it = reference.find(s.output_names[k]);
      if (it == reference.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(Sub(s.index), " outputs %", s.output_names[k],
                         ", which the whole graph does not compute"));
      }
      absl::Status compared = comparator.Add(
          outs[k], it->second, absl::StrCat("%", s.output_names[k]));
      if (!compared.ok()) {
        return absl::Status(
            compared.code(),
            absl::StrCat(Sub(s.index), " output ", compared.message()));
      }
    }
    const runtime::CompareResult& r = comparator.result();
    if (r.max_abs_error > 0.0 && result.first_divergent < 0) {
      result.first_divergent = s.index;
    }
    if (!r.passed && result.first_failing < 0) {
      result.first_failing = s.index;
    }
    result.subgraphs.push_back(r);
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(c10::IValue actual, Run(partition, root, inputs,
                                           options.device, &stats, on_outputs));
  absl::StatusOr<runtime::CompareResult> output =
      runtime::CompareValues(actual, expected, options);
  if (!output.ok()) {
    return absl::Status(
        output.status().code(),
        absl::StrCat("model output: ", output.status().message()));
  }
  result.output = *std::move(output);
  result.passed = result.output.passed && result.first_failing < 0;
  result.peak_cached_values = stats.peak_cached_values;
  return result;
}

}  // namespace

absl::StatusOr<CheckResult> CheckPartition(
    const runtime::GraphModule& gm, const Partition& partition,
    const std::vector<c10::IValue>& inputs,
    const runtime::CompareOptions& options) {
  return CheckPartition(gm.graph(), gm.module(), partition, inputs, options);
}

}  // namespace tracecut::partition
