#ifndef TRACECUT_IR_DOT_H_
#define TRACECUT_IR_DOT_H_

// Graphviz DOT export of a graph, optionally with nodes grouped into
// coloured clusters (the partitioner's subgraphs).
//
//   DotOptions options;
//   options.clusters = {{"linear", 0}, {"relu", 1}};
//   options.cluster_labels = {"layer 0", "layer 1"};
//   std::string dot = ToDot(graph, options);  // dot -Tsvg renders it.
//
// One DOT node per IR node, labelled with its name and op[target]; one edge
// from each distinct operand to its user. Output is deterministic: nodes in
// graph order, clusters by index. DOT ids are positional ("n0", "n1"), so
// no name reaches one; labels escape quotes and backslashes, keep UTF-8
// (module paths may be non-ASCII) and show control characters and invalid
// UTF-8 as \xNN text.

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ir/graph.h"

namespace tracecut::ir {

struct DotOptions {
  // Written as `digraph "<graph_name>"`.
  std::string graph_name = "tracecut";
  // Node name -> cluster index. Nodes not listed (or with a negative index)
  // are drawn outside every cluster; names not in the graph are ignored.
  absl::flat_hash_map<std::string, int> clusters;
  // Label of cluster i; "cluster i" where missing or empty.
  std::vector<std::string> cluster_labels;
  // Fill colours (any colour Graphviz accepts), used by cluster index
  // modulo the palette size. Empty: DefaultDotPalette().
  std::vector<std::string> palette;
  // Add the innermost module path to each node label.
  bool show_scope = false;
};

// Twelve light colours that keep black text readable (ColorBrewer Set3).
const std::vector<std::string>& DefaultDotPalette();

std::string ToDot(const Graph& graph, const DotOptions& options = {});

}  // namespace tracecut::ir

#endif  // TRACECUT_IR_DOT_H_
