// docs/api.md, "tracer" and "runtime": trace a TorchScript model into the
// IR, run the graph node by node with a hook on every leaf-module call, and
// save it back as TorchScript.
//
//   tracer_example MODEL.pt [OUT_DIR]

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/status_macros.h"

namespace {

namespace ir = tracecut::ir;
namespace runtime = tracecut::runtime;
namespace tracer = tracecut::tracer;

absl::Status Example(const std::string& model_path,
                     const std::string& out_dir) {
  // [START trace]
  // The model and the files embedded in it (config.json, example inputs).
  ASSIGN_OR_RETURN(tracer::LoadedModel model, tracer::LoadModel(model_path));
  tracer::TraceOptions options;
  options.leaf_policy.AddType("LlamaRMSNorm");  // Keep as a call_module.
  ASSIGN_OR_RETURN(options, tracer::WithModelFiles(model, std::move(options)));
  ASSIGN_OR_RETURN(runtime::GraphModule gm,
                   tracer::Trace(model.module, options));

  std::map<std::string, int> ops;
  for (const ir::Node* node : gm.graph().nodes()) {
    ++ops[std::string(ir::OpKindName(node->op()))];
  }
  for (const auto& [op, count] : ops) std::cout << op << ": " << count << "\n";
  for (const std::string& assumption : gm.graph().meta().assumptions) {
    std::cout << "assumed: " << assumption << "\n";  // Shape decisions.
  }
  // [END trace]

  // [START run]
  // The inputs the tracer ran the model on, to run the graph on.
  ASSIGN_OR_RETURN(tracer::ExampleInputs inputs,
                   tracer::ResolveExampleInputs(model.module, options));
  ASSIGN_OR_RETURN(runtime::Interpreter interp,
                   runtime::Interpreter::Create(gm));
  int calls = 0;
  interp.AddModuleHook(
      [&](const ir::Node& node, const torch::jit::Module& module,
          absl::Span<const c10::IValue> args, const c10::IValue* output) {
        if (output != nullptr) ++calls;  // After the call; before: nullptr.
      });
  ASSIGN_OR_RETURN(c10::IValue out, interp.Run(inputs.values));
  std::cout << calls << " leaf-module calls\n";

  // Back to TorchScript, loadable by LibTorch and Python torch.
  RETURN_IF_ERROR(runtime::SaveTorchScript(gm, out_dir + "/traced.pt"));
  // [END run]
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: tracer_example MODEL.pt [OUT_DIR]\n";
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
