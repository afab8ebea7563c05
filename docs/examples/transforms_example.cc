// docs/api.md, "transforms": run a pipeline of passes on a copy of a traced
// model, check the copy computes the same, and undo the passes.
//
//   transforms_example MODEL.pt [OUT_DIR]

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
#include "runtime/compare.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "transforms/change_truediv_to_mul_by_inverse.h"
#include "transforms/merge_linears.h"
#include "transforms/pass_pipeline.h"
#include "util/status_macros.h"

namespace {

namespace ir = tracecut::ir;
namespace runtime = tracecut::runtime;
namespace tracer = tracecut::tracer;
namespace transforms = tracecut::transforms;

absl::Status Example(const std::string& model_path,
                     const std::string& out_dir) {
  ASSIGN_OR_RETURN(tracer::LoadedModel model, tracer::LoadModel(model_path));
  ASSIGN_OR_RETURN(tracer::TraceOptions options,
                   tracer::WithModelFiles(model, tracer::TraceOptions()));
  ASSIGN_OR_RETURN(runtime::GraphModule gm,
                   tracer::Trace(model.module, options));
  ASSIGN_OR_RETURN(tracer::ExampleInputs inputs,
                   tracer::ResolveExampleInputs(model.module, options));

  // [START transforms]
  transforms::PassPipeline pipeline("fuse");
  pipeline.AddPass<transforms::ChangeTrueDivToMulByInverse>();
  pipeline.AddPass<transforms::MergeLinears>();  // q/k/v, gate/up.
  // Runs on a copy, with the verifier after every pass that changed it.
  ASSIGN_OR_RETURN(runtime::GraphModule fused, pipeline.Apply(gm));
  std::cout << pipeline.TimingReport();

  // Same outputs, up to rounding.
  ASSIGN_OR_RETURN(runtime::Interpreter before,
                   runtime::Interpreter::Create(gm));
  ASSIGN_OR_RETURN(runtime::Interpreter after,
                   runtime::Interpreter::Create(fused));
  ASSIGN_OR_RETURN(c10::IValue expected, before.Run(inputs.values));
  ASSIGN_OR_RETURN(c10::IValue actual, after.Run(inputs.values));
  ASSIGN_OR_RETURN(runtime::CompareResult diff,
                   runtime::CompareValues(actual, expected));  // rtol, atol
  if (!diff.passed) return absl::InternalError(diff.FailureSummary("output"));
  RETURN_IF_ERROR(runtime::SaveTorchScript(fused, out_dir + "/fused.pt"));

  // Every pass here is reversible: undo them, bit for bit.
  ASSIGN_OR_RETURN(bool undone, pipeline.Reverse(fused));
  if (!undone || !ir::StructurallyEqual(fused.graph(), gm.graph())) {
    return absl::InternalError("Reverse did not restore the graph");
  }
  // [END transforms]
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: transforms_example MODEL.pt [OUT_DIR]\n";
    return 2;
  }
  // Under `bazel test`, OUT_DIR defaults to the test's scratch directory.
  const char* tmp = std::getenv("TEST_TMPDIR");
  absl::Status status =
      Example(argv[1], argc == 3 ? argv[2] : (tmp != nullptr ? tmp : "."));
  if (!status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  return 0;
}
