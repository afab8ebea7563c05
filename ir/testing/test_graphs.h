#ifndef TRACECUT_IR_TESTING_TEST_GRAPHS_H_
#define TRACECUT_IR_TESTING_TEST_GRAPHS_H_

// A shared corpus of varied, verifiable graphs for round-trip and
// serialization tests (text, proto, and the packages above ir/), so every
// format is checked against the same cases: every argument kind and odd
// value, nested sequences, scopes and meta with odd bytes, graphs edited
// through insertion, RAUW, renames and erasure.
//
//   for (const NamedGraph& c : VariedGraphs()) {
//     SCOPED_TRACE(c.name);
//     ... round trip *c.graph ...
//   }

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::ir::test_graphs {

struct NamedGraph {
  std::string name;
  std::unique_ptr<Graph> graph;
};

// Built through the Graph API only (independent of the text parser), each
// one passes Verify. Fresh graphs on every call.
std::vector<NamedGraph> VariedGraphs();

// The one in VariedGraphs() called `name`; aborts when there is none.
std::unique_ptr<Graph> VariedGraph(absl::string_view name);

// Parses (and verifies) IR text, aborting with the parse error on failure:
// for tests whose input is a literal.
std::unique_ptr<Graph> ParseOrDie(absl::string_view text);

}  // namespace tracecut::ir::test_graphs

#endif  // TRACECUT_IR_TESTING_TEST_GRAPHS_H_
