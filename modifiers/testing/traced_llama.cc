#include "modifiers/testing/traced_llama.h"

#include <vector>

#include "tracer/testing/traced_fixture.h"

namespace tracecut::modifiers::testing {

runtime::GraphModule TraceLlamaFixture() {
  return tracer::testing::TraceFixture("tests/fixtures/llama.pt").gm;
}

SubgraphInfo WholeModel(const RunContext& ctx) {
  SubgraphInfo info;
  info.label = "(whole model)";
  for (const LeafModule& leaf : ctx.leaf_modules()) {
    info.leaf_modules.push_back(leaf.path);
  }
  return info;
}

ModuleCall CallOf(const LeafModule& leaf,
                  const std::vector<c10::IValue>& inputs, int64_t batch) {
  ModuleCall call;
  call.path = leaf.path;
  call.type = leaf.type;
  call.inputs = inputs;
  call.batch = batch;
  return call;
}

}  // namespace tracecut::modifiers::testing
