// Writes ToDot() of every varied test graph, clustered and not, into the
// directory given as the only argument, for dot_render_test.sh to render
// with Graphviz.

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "ir/dot.h"
#include "ir/testing/test_graphs.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  using tracecut::ir::DotOptions;
  using tracecut::ir::Node;
  for (const auto& c : tracecut::ir::test_graphs::VariedGraphs()) {
    DotOptions clustered;
    clustered.cluster_labels = {"first", "second \"quoted\""};
    int i = 0;
    for (Node* n : c.graph->nodes()) clustered.clusters[n->name()] = i++ % 4;
    clustered.show_scope = true;
    for (const auto& [suffix, options] :
         {std::make_pair("", DotOptions()),
          std::make_pair("_clustered", clustered)}) {
      std::string path = std::string(argv[1]) + "/" + c.name + suffix + ".dot";
      std::ofstream out(path);
      out << tracecut::ir::ToDot(*c.graph, options);
      if (!out) {
        std::fprintf(stderr, "cannot write %s\n", path.c_str());
        return 1;
      }
    }
  }
  return 0;
}
