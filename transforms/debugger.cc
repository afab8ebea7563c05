#include "transforms/debugger.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ir/status_macros.h"
#include "runtime/interpreter.h"
#include "runtime/torch_status.h"
#include "transforms/fusion_math.h"
#include "transforms/per_subgraph.h"
#include "transforms/per_subgraph_internal.h"

namespace tracecut::transforms {
namespace {

using Values = absl::flat_hash_map<std::string, c10::IValue>;

void Flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) Flatten(e, out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) Flatten(e, out);
  }
}

// Runs `graph` (a subgraph) against `root` on `inputs`; its tensors.
absl::StatusOr<std::vector<at::Tensor>> RunSubgraph(
    const ir::Graph& graph, const torch::jit::Module& root,
    const Values& inputs) {
  ASSIGN_OR_RETURN(runtime::Interpreter interp,
                   runtime::Interpreter::Create(graph, root));
  ASSIGN_OR_RETURN(c10::IValue out, interp.RunNamed(inputs));
  std::vector<at::Tensor> tensors;
  Flatten(out, tensors);
  // Detach from anything a later run may write in place.
  for (at::Tensor& t : tensors) t = t.clone();
  return tensors;
}

fusion_math::ErrorStats Compare(const std::vector<at::Tensor>& a,
                                const std::vector<at::Tensor>& b) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.size() != b.size()) return {kInf, kInf};
  fusion_math::ErrorStats worst;
  for (size_t i = 0; i < a.size(); ++i) {
    fusion_math::ErrorStats e = fusion_math::CompareTensors(a[i], b[i]);
    worst.max_abs = std::max(worst.max_abs, e.max_abs);
    worst.max_rel = std::max(worst.max_rel, e.max_rel);
  }
  return worst;
}

std::string Number(double v) {
  if (std::isnan(v)) return "null";
  if (std::isinf(v)) return v > 0 ? "1e999" : "-1e999";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string Names(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  for (const std::string& n : names) quoted.push_back(JsonQuote(n));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

}  // namespace

absl::StatusOr<DebugReport> DebugPipeline(
    const runtime::GraphModule& gm, Pipeline& pipeline,
    const std::vector<c10::IValue>& inputs, const DebugOptions& options) {
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
      absl::StatusOr<c10::IValue> out = interp.RunNamed(in);
      if (!out.ok()) {
        return absl::Status(out.status().code(),
                            absl::StrCat(internal::SubgraphLabel(s), ": ",
                                         out.status().message()));
      }
      const auto& elements = out->toTupleRef().elements();
      for (size_t k = 0; k < s.output_names.size(); ++k) {
        values[s.output_names[k]] = elements[k];
      }
    }
  }

  ASSIGN_OR_RETURN(runtime::GraphModule work, gm.Clone());
  partition::Partition parts = internal::ClonePartition(original);
  const int64_t base = NextApplicationId(gm.graph());
  DebugReport report;
  report.tolerance = options.tolerance;
  report.absolute = options.absolute;
  for (partition::Subgraph& s : parts.subgraphs) {
    report.subgraphs.push_back(
        {s.index, s.module_paths, s.input_names, s.output_names});
    const Values& in = cached[s.index];
    ASSIGN_OR_RETURN(std::vector<at::Tensor> reference,
                     RunSubgraph(*s.graph, work.module(), in));
    std::vector<at::Tensor> previous = reference;
    internal::ObserverScope scope(
        pipeline,
        [&](const PassRecord& r,
            const runtime::GraphModule& sub) -> absl::Status {
          DebugStep step;
          step.subgraph = s.index;
          step.pass = r.name;
          step.changed = r.changed;
          step.preserves_computation = r.preserves_computation;
          step.touched_nodes =
              internal::TouchedNodes(sub.graph(), r.name, r.app);
          if (r.changed) {
            absl::StatusOr<std::vector<at::Tensor>> after =
                RunSubgraph(sub.graph(), sub.module(), in);
            if (!after.ok()) {
              return absl::Status(after.status().code(),
                                  absl::StrCat("running after ", r.name, ": ",
                                               after.status().message()));
            }
            const fusion_math::ErrorStats e = Compare(*after, previous);
            const fusion_math::ErrorStats c = Compare(*after, reference);
            step.max_abs = e.max_abs;
            step.max_rel = e.max_rel;
            step.cumulative_max_abs = c.max_abs;
            step.cumulative_max_rel = c.max_rel;
            previous = *std::move(after);
          } else {
            const fusion_math::ErrorStats c = Compare(previous, reference);
            step.cumulative_max_abs = c.max_abs;
            step.cumulative_max_rel = c.max_rel;
          }
          const double err = options.absolute ? step.max_abs : step.max_rel;
          step.exceeds = !(err <= options.tolerance);
          if (step.exceeds && report.first_exceeding < 0) {
            report.first_exceeding = static_cast<int>(report.steps.size());
          }
          report.steps.push_back(std::move(step));
          return absl::OkStatus();
        });
    RETURN_IF_ERROR(internal::RunOnSubgraph(pipeline, work, s, base).status());
  }
  return report;
}

std::string DebugReport::ToJson() const {
  std::string first = "null";
  if (first_exceeding >= 0) {
    const DebugStep& s = steps[first_exceeding];
    std::vector<std::string> paths;
    for (const DebugSubgraph& g : subgraphs) {
      if (g.index == s.subgraph) paths = g.module_paths;
    }
    first = absl::StrCat("{\"subgraph\": ", s.subgraph,
                         ", \"pass\": ", JsonQuote(s.pass),
                         ", \"module_paths\": ", Names(paths),
                         ", \"max_abs\": ", Number(s.max_abs),
                         ", \"max_rel\": ", Number(s.max_rel), "}");
  }
  std::vector<std::string> subs;
  for (const DebugSubgraph& g : subgraphs) {
    subs.push_back(absl::StrCat(
        "{\"index\": ", g.index, ", \"module_paths\": ", Names(g.module_paths),
        ", \"input_names\": ", Names(g.input_names),
        ", \"output_names\": ", Names(g.output_names), "}"));
  }
  std::vector<std::string> rows;
  for (const DebugStep& s : steps) {
    rows.push_back(absl::StrCat(
        "{\"subgraph\": ", s.subgraph, ", \"pass\": ", JsonQuote(s.pass),
        ", \"changed\": ", s.changed ? "true" : "false",
        ", \"preserves_computation\": ",
        s.preserves_computation ? "true" : "false", ", \"max_abs\": ",
        Number(s.max_abs), ", \"max_rel\": ", Number(s.max_rel),
        ", \"cumulative_max_abs\": ", Number(s.cumulative_max_abs),
        ", \"cumulative_max_rel\": ", Number(s.cumulative_max_rel),
        ", \"exceeds\": ", s.exceeds ? "true" : "false",
        ", \"touched_nodes\": ", Names(s.touched_nodes), "}"));
  }
  return absl::StrCat("{\"tolerance\": ", Number(tolerance),
                      ", \"absolute\": ", absolute ? "true" : "false",
                      ", \"first_exceeding\": ", first, ",\n \"subgraphs\": [",
                      absl::StrJoin(subs, ",\n  "), "],\n \"steps\": [",
                      absl::StrJoin(rows, ",\n  "), "]}\n");
}

}  // namespace tracecut::transforms
