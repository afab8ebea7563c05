#ifndef TRACECUT_TOOLS_CLI_GRAPH_JSON_H_
#define TRACECUT_TOOLS_CLI_GRAPH_JSON_H_

// JSON forms of a graph for machine-readable CLI output (no LibTorch).
//
// GraphToJson: the whole graph, for `--format=json`:
//   {"nodes": [{"name": "linear", "op": "call_function",
//               "target": "aten::linear", "args": [{"ref": "x"}, ...],
//               "kwargs": {}, "scope": [{"path": "", "type": "..."}, ...],
//               "outputs": [{"shape": [2, 16], "dtype": "float32",
//                            "device": "cpu"}],
//               "source": {"file": "...", "line": 12, "text": "..."}}, ...],
//    "assumptions": [...], "meta": {...}}
// Arguments: null/true/1/1.5/"str" as themselves; {"ref": name},
// {"dtype": "float32"}, {"device": "cpu"}, {"tuple": [...]}, lists as
// arrays; non-finite doubles as {"double": "nan"|"inf"|"-inf"}.
//
// GraphSummaryJson: what `trace --json` prints: node counts per op kind
// (all six, in op-kind order), call_module targets (graph order, distinct),
// assumptions and HF meta.

#include "ir/graph.h"
#include "util/json.h"

namespace tracecut::cli {

util::Json ArgumentToJson(const ir::Argument& arg);
util::Json GraphToJson(const ir::Graph& graph);
util::Json GraphSummaryJson(const ir::Graph& graph);

}  // namespace tracecut::cli

#endif  // TRACECUT_TOOLS_CLI_GRAPH_JSON_H_
