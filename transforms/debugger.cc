#include "transforms/debugger.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "runtime/compare.h"
#include "runtime/device.h"
#include "runtime/device_placement.h"
#include "runtime/interpreter.h"
#include "runtime/torch_status.h"
#include "transforms/instrumentation.h"
#include "transforms/per_subgraph_internal.h"
#include "util/json.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::transforms {
namespace {

using Values = absl::flat_hash_map<std::string, c10::IValue>;

// Runs `graph` (a subgraph) against `root` on `inputs`; its outputs.
absl::StatusOr<std::vector<c10::IValue>> RunSubgraph(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Values& inputs, c10::Device device) {
  ASSIGN_OR_RETURN(runtime::Interpreter interp,
                   runtime::Interpreter::Create(graph, root));
  interp.PlaceOn(device);
  ASSIGN_OR_RETURN(c10::IValue out, interp.RunNamed(inputs));
  std::vector<c10::IValue> outputs;
  if (out.isTuple()) {
    outputs = out.toTupleRef().elements().vec();
  } else {
    outputs.push_back(std::move(out));
  }
  // Detach from anything a later run may write in place.
  RETURN_IF_ERROR(runtime::TorchCall("copying subgraph outputs", [&] {
    for (c10::IValue& v : outputs) v = v.deepcopy();
  }));
  return outputs;
}

// `actual` against `expected`, output k under the name of the subgraph's
// k-th output. Values that cannot be compared (a pass changed a shape or
// the number of outputs) fail with infinite errors and `mismatch` says why.
struct Comparison {
  runtime::CompareResult result;
  std::string mismatch;
};
Comparison Compare(const std::vector<c10::IValue>& actual,
                   const std::vector<c10::IValue>& expected,
                   const std::vector<std::string>& names,
                   const runtime::CompareOptions& options) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  runtime::Comparator comparator(options);
  absl::Status status = absl::OkStatus();
  if (actual.size() != expected.size()) {
    status = absl::FailedPreconditionError(
        absl::StrCat(actual.size(), " outputs vs ", expected.size()));
  }
  for (size_t k = 0; status.ok() && k < actual.size(); ++k) {
    status = comparator.Add(actual[k], expected[k],
                            k < names.size() ? absl::StrCat("%", names[k])
                                             : absl::StrCat("[", k, "]"));
  }
  Comparison c{comparator.result(), ""};
  if (!status.ok()) {
    c.mismatch = std::string(status.message());
    c.result.passed = false;
    c.result.max_abs_error = kInf;
    c.result.max_rel_error = kInf;
  }
  return c;
}

// DebugPipeline with `inputs` and gm's tensors on options.compare.device.
absl::StatusOr<DebugReport> DebugOnDevice(
    const runtime::GraphModule& gm, PassPipeline& pipeline,
    const std::vector<c10::IValue>& inputs, const DebugOptions& options) {
  const c10::Device device = options.compare.device;
  RETURN_IF_ERROR(runtime::ValidateCompareOptions(options.compare));
  ASSIGN_OR_RETURN(partition::Partition original,
                   partition::PartitionGraph(gm.graph(), options.partition));
  if (inputs.size() != original.model_inputs.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model takes ", original.model_inputs.size(),
                     " inputs, got ", inputs.size()));
  }
  // Each subgraph's inputs from one untransformed run.
  std::vector<Values> cached(original.subgraphs.size());
  {
    Values values;
    for (size_t i = 0; i < inputs.size(); ++i) {
      values[original.model_inputs[i]] = inputs[i];
    }
    for (const partition::Subgraph& s : original.subgraphs) {
      Values& in = cached[s.index];
      for (const std::string& name : s.input_names) in[name] = values.at(name);
      ASSIGN_OR_RETURN(runtime::Interpreter interp,
                       runtime::Interpreter::Create(*s.graph, gm.module()));
      interp.PlaceOn(device);
      ASSIGN_OR_RETURN(
          c10::IValue out,
          util::Annotate(interp.RunNamed(in), internal::SubgraphLabel(s)));
      const auto& elements = out.toTupleRef().elements();
      for (size_t k = 0; k < s.output_names.size(); ++k) {
        values[s.output_names[k]] = elements[k];
      }
    }
  }

  ASSIGN_OR_RETURN(runtime::GraphModule work, gm.Clone());
  partition::Partition parts = internal::ClonePartition(original);
  const int64_t base = NextApplicationId(gm.graph());
  DebugReport report;
  report.rtol = options.compare.rtol;
  report.atol = options.compare.atol;
  for (partition::Subgraph& s : parts.subgraphs) {
    report.subgraphs.push_back(
        {s.index, s.module_paths, s.input_names, s.output_names});
    const Values& in = cached[s.index];
    ASSIGN_OR_RETURN(std::vector<c10::IValue> reference,
                     RunSubgraph(*s.graph, work.module(), in, device));
    std::vector<c10::IValue> previous = reference;
    auto compare = [&](const std::vector<c10::IValue>& actual,
                       const std::vector<c10::IValue>& expected) {
      return Compare(actual, expected, s.output_names, options.compare);
    };
    // Measures each pass on this subgraph right after it ran.
    AfterPassCallback measure([&](const PassRun& r,
                                  const runtime::GraphModule& sub,
                                  bool changed) -> absl::Status {
      DebugStep step;
      step.subgraph = s.index;
      step.pass = r.name;
      step.changed = changed;
      step.preserves_computation = r.pass->preserves_computation();
      step.touched_nodes = TouchedNodes(sub.graph(), r.name, r.app);
      if (changed) {
        ASSIGN_OR_RETURN(
            std::vector<c10::IValue> after,
            util::Annotate(RunSubgraph(sub.graph(), sub.module(), in, device),
                           absl::StrCat("running after ", r.name)));
        const Comparison e = compare(after, previous);
        const Comparison c = compare(after, reference);
        step.max_abs = e.result.max_abs_error;
        step.max_rel = e.result.max_rel_error;
        step.elements = e.result.elements;
        step.violations = e.result.violations;
        step.worst = e.result.worst;
        step.mismatch = e.mismatch;
        step.exceeds = !e.result.passed;
        step.cumulative_max_abs = c.result.max_abs_error;
        step.cumulative_max_rel = c.result.max_rel_error;
        previous = std::move(after);
      } else {
        const Comparison c = compare(previous, reference);
        step.cumulative_max_abs = c.result.max_abs_error;
        step.cumulative_max_rel = c.result.max_rel_error;
      }
      if (step.exceeds && report.first_exceeding < 0) {
        report.first_exceeding = static_cast<int>(report.steps.size());
      }
      report.steps.push_back(std::move(step));
      return absl::OkStatus();
    });
    ScopedInstrumentation scope(pipeline, measure);
    RETURN_IF_ERROR(internal::RunOnSubgraph(pipeline, work, s, base).status());
  }
  return report;
}

}  // namespace

absl::StatusOr<DebugReport> DebugPipeline(
    const runtime::GraphModule& gm, PassPipeline& pipeline,
    const std::vector<c10::IValue>& inputs, const DebugOptions& options) {
  const c10::Device device = options.compare.device;
  if (device.is_cpu()) return DebugOnDevice(gm, pipeline, inputs, options);
  // The passes run on a clone of gm, made after gm's tensors are on the
  // device: both are there, and gm is left as it was.
  return runtime::DevicePlacement::WithModuleOn(
      gm.module(), device, [&]() -> absl::StatusOr<DebugReport> {
        ASSIGN_OR_RETURN(std::vector<c10::IValue> on_device,
                         runtime::ValuesToDevice(inputs, device));
        return DebugOnDevice(gm, pipeline, on_device, options);
      });
}

std::string DebugReport::ToJson() const {
  // Doubles as util::DumpJson writes them: shortest round-trip form, and
  // null where not finite (an infinite error where outputs could not be
  // compared; `mismatch` says why).
  util::Json first = nullptr;
  if (first_exceeding >= 0) {
    const DebugStep& s = steps[first_exceeding];
    std::vector<std::string> paths;
    for (const DebugSubgraph& g : subgraphs) {
      if (g.index == s.subgraph) paths = g.module_paths;
    }
    first = util::Json::object();
    first["subgraph"] = s.subgraph;
    first["pass"] = s.pass;
    first["module_paths"] = paths;
    first["max_abs"] = s.max_abs;
    first["max_rel"] = s.max_rel;
    first["violations"] = s.violations;
    first["elements"] = s.elements;
    first["worst"] = s.worst.has_value() ? util::Json(s.worst->ToString())
                                         : util::Json(nullptr);
    first["mismatch"] =
        s.mismatch.empty() ? util::Json(nullptr) : util::Json(s.mismatch);
  }
  util::Json subs = util::Json::array();
  for (const DebugSubgraph& g : subgraphs) {
    util::Json sub = util::Json::object();
    sub["index"] = g.index;
    sub["module_paths"] = g.module_paths;
    sub["input_names"] = g.input_names;
    sub["output_names"] = g.output_names;
    subs.push_back(std::move(sub));
  }
  util::Json rows = util::Json::array();
  for (const DebugStep& s : steps) {
    util::Json row = util::Json::object();
    row["subgraph"] = s.subgraph;
    row["pass"] = s.pass;
    row["changed"] = s.changed;
    row["preserves_computation"] = s.preserves_computation;
    row["max_abs"] = s.max_abs;
    row["max_rel"] = s.max_rel;
    row["violations"] = s.violations;
    row["cumulative_max_abs"] = s.cumulative_max_abs;
    row["cumulative_max_rel"] = s.cumulative_max_rel;
    row["exceeds"] = s.exceeds;
    row["touched_nodes"] = s.touched_nodes;
    rows.push_back(std::move(row));
  }
  util::Json report = util::Json::object();
  report["rtol"] = rtol;
  report["atol"] = atol;
  report["first_exceeding"] = std::move(first);
  report["subgraphs"] = std::move(subs);
  report["steps"] = std::move(rows);
  return util::DumpJson(report, 2) + "\n";
}

}  // namespace tracecut::transforms
