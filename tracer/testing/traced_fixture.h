#ifndef TRACECUT_TRACER_TESTING_TRACED_FIXTURE_H_
#define TRACECUT_TRACER_TESTING_TRACED_FIXTURE_H_

// A generated fixture model (tests/fixtures) loaded and traced as the
// commands do it, for tests of what consumes a traced model.
//
//   TracedFixture llama = TraceFixture("tests/fixtures/llama.pt");
//   ... llama.gm, llama.inputs ...

#include <torch/script.h>

#include <string>
#include <vector>

#include "runtime/graph_module.h"

namespace tracecut::tracer::testing {

struct TracedFixture {
  torch::jit::Module module;  // As loaded.
  // Carrying the model's extra files and its config.json, as calibrate
  // carries them into its outputs.
  runtime::GraphModule gm;
  std::vector<c10::IValue> inputs;  // The model's example inputs.
};

// `runfile`: a path under the workspace's runfiles. Fails the test
// (ADD_FAILURE, then throws) when it cannot be loaded or traced.
TracedFixture TraceFixture(const std::string& runfile);

}  // namespace tracecut::tracer::testing

#endif  // TRACECUT_TRACER_TESTING_TRACED_FIXTURE_H_
