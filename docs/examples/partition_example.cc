// docs/api.md, "partition": split a traced Llama at its decoder layers,
// print the plan, and check that the subgraphs, run in order, compute what
// the whole model computes.
//
//   partition_example MODEL.pt

#include <iostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "partition/check.h"
#include "partition/partitioner.h"
#include "partition/plan.h"
#include "runtime/graph_module.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/status_macros.h"

namespace {

namespace partition = tracecut::partition;
namespace runtime = tracecut::runtime;
namespace tracer = tracecut::tracer;

absl::Status Example(const std::string& model_path) {
  ASSIGN_OR_RETURN(tracer::LoadedModel model, tracer::LoadModel(model_path));
  ASSIGN_OR_RETURN(tracer::TraceOptions trace_options,
                   tracer::WithModelFiles(model, tracer::TraceOptions()));
  ASSIGN_OR_RETURN(runtime::GraphModule gm,
                   tracer::Trace(model.module, trace_options));
  ASSIGN_OR_RETURN(tracer::ExampleInputs inputs,
                   tracer::ResolveExampleInputs(model.module, trace_options));

  // [START partition]
  partition::PartitionOptions options;
  options.targets = {"LlamaDecoderLayer"};  // Or paths, globs, "re:...".
  ASSIGN_OR_RETURN(partition::Partition p,
                   partition::PartitionGraph(gm.graph(), options));
  for (const partition::Subgraph& s : p.subgraphs) {
    std::cout << "#" << s.index << " "
              << (s.module_paths.empty() ? "(head)" : s.module_paths[0]) << ": "
              << s.node_count << " nodes, reads "
              << absl::StrJoin(s.input_names, ", ") << "\n";
  }
  // The plan as a table (PlanToJson: what `tracecut partition` writes).
  std::cout << partition::PlanToText(partition::BuildPlan(p, options));

  // Run the subgraphs in order and compare with the whole graph.
  // Allclose-style: rtol 1e-4, atol 1e-5 unless given (runtime/compare.h).
  ASSIGN_OR_RETURN(partition::CheckResult check,
                   partition::CheckPartition(gm, p, inputs.values));
  if (!check.passed) {
    const int s = check.first_failing;
    return absl::InternalError(absl::StrCat(
        "subgraph ", s, ": ",
        (s >= 0 ? check.subgraphs[s] : check.output).FailureSummary("output")));
  }
  // [END partition]
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: partition_example MODEL.pt\n";
    return 2;
  }
  absl::Status status = Example(argv[1]);
  if (!status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  return 0;
}
