#ifndef TRACECUT_MODIFIERS_TESTING_TRACED_LLAMA_H_
#define TRACECUT_MODIFIERS_TESTING_TRACED_LLAMA_H_

// The generated Llama fixture (tests/fixtures:llama.pt) traced, for driving
// a modifier's hooks by hand in unit tests: no pipeline, the test plays it.

#include <string>
#include <vector>

#include "modifiers/modifier.h"
#include "runtime/graph_module.h"

namespace tracecut::modifiers::testing {

// With the fixture's config.json among its extra files. Fails the test
// (ADD_FAILURE) when the fixture cannot be traced.
runtime::GraphModule TraceLlamaFixture();

// One subgraph holding every leaf module of `ctx`.
SubgraphInfo WholeModel(const RunContext& ctx);

// A call of `leaf` in batch `batch` with `inputs` (which must outlive it).
ModuleCall CallOf(const LeafModule& leaf,
                  const std::vector<c10::IValue>& inputs, int64_t batch);

}  // namespace tracecut::modifiers::testing

#endif  // TRACECUT_MODIFIERS_TESTING_TRACED_LLAMA_H_
