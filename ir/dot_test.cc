#include "ir/dot.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "ir/testing/test_graphs.h"
#include "util/testing/status_matchers.h"

namespace tracecut::ir {
namespace {

using test_graphs::ParseOrDie;
using ::testing::HasSubstr;
using ::testing::Not;

const char kSmall[] = R"(graph {
  %x = placeholder[x]()
  %w = get_attr[fc.weight]()
  %linear = call_function[aten::linear](%x, %w, None)
  %relu = call_module[act](%linear) scope[:"M", act:"torch.nn.ReLU"]
  %add = call_function[aten::add.Tensor](%relu, %relu)
  %output = output[output](%add)
}
)";

TEST(DotTest, DrawsEveryNodeAndOperandEdge) {
  std::unique_ptr<Graph> g = ParseOrDie(kSmall);
  EXPECT_EQ(ToDot(*g), R"(digraph "tracecut" {
  node [style=filled, fontname="monospace"];
  n0 [label="%x\nplaceholder[x]", shape=invhouse, fillcolor="white"];
  n1 [label="%w\nget_attr[fc.weight]", shape=note, fillcolor="white"];
  n2 [label="%linear\ncall_function[aten::linear]", shape=box, fillcolor="white"];
  n3 [label="%relu\ncall_module[act]", shape=box3d, fillcolor="white"];
  n4 [label="%add\ncall_function[aten::add.Tensor]", shape=box, fillcolor="white"];
  n5 [label="%output\noutput[output]", shape=house, fillcolor="white"];
  n0 -> n2;
  n1 -> n2;
  n2 -> n3;
  n3 -> n4;
  n4 -> n5;
}
)");
}

TEST(DotTest, GroupsAndColoursClusters) {
  std::unique_ptr<Graph> g = ParseOrDie(kSmall);
  DotOptions options;
  options.graph_name = "parts";
  options.clusters = {{"linear", 0}, {"w", 0},  {"relu", 1},
                      {"add", 1},    {"x", -1}, {"not_a_node", 0}};
  options.cluster_labels = {"layer \"0\""};
  options.palette = {"red", "#00ff00"};
  options.show_scope = true;
  std::string dot = ToDot(*g, options);
  EXPECT_THAT(dot, HasSubstr(R"(digraph "parts" {)"));
  EXPECT_THAT(dot, HasSubstr(R"(  subgraph cluster_0 {
    label="layer \"0\"";
    style=rounded;
    penwidth=2;
    color="red";
    n1 [label="%w\nget_attr[fc.weight]", shape=note, fillcolor="red"];
    n2 [label="%linear\ncall_function[aten::linear]", shape=box, fillcolor="red"];
  }
  subgraph cluster_1 {
    label="cluster 1";)"));
  EXPECT_THAT(dot, HasSubstr(R"(    n3 [label="%relu\ncall_module[act]\nact", )"
                             R"(shape=box3d, fillcolor="#00ff00"];)"));
  // Unclustered nodes come after the clusters, uncoloured.
  EXPECT_THAT(dot, HasSubstr(R"(  }
  n0 [label="%x\nplaceholder[x]", shape=invhouse, fillcolor="white"];)"));
  // Edges across clusters are bold; inside one they are not.
  EXPECT_THAT(dot, HasSubstr("  n0 -> n2 [style=bold];\n"));
  EXPECT_THAT(dot, HasSubstr("  n1 -> n2;\n"));
  EXPECT_THAT(dot, HasSubstr("  n2 -> n3 [style=bold];\n"));
  EXPECT_THAT(dot, HasSubstr("  n3 -> n4;\n"));
  EXPECT_THAT(dot, HasSubstr("  n4 -> n5 [style=bold];\n"));
  EXPECT_THAT(dot, Not(HasSubstr("not_a_node")));
}

TEST(DotTest, PaletteWrapsAround) {
  std::unique_ptr<Graph> g = ParseOrDie(kSmall);
  DotOptions options;
  options.clusters = {{"x", 12}, {"w", 13}};
  std::string dot = ToDot(*g, options);
  EXPECT_THAT(dot, HasSubstr("fillcolor=\"" + DefaultDotPalette()[0] + "\""));
  EXPECT_THAT(dot, HasSubstr("fillcolor=\"" + DefaultDotPalette()[1] + "\""));
}

TEST(DotTest, EscapesLabels) {
  Graph g;
  Node* x = *g.AddNode(OpKind::kPlaceholder, "a\"b\\c\nd\xff", {}, {}, "x");
  ASSERT_OK(g.Output(Argument::Ref(x)));
  EXPECT_THAT(ToDot(g),
              HasSubstr(R"(label="%x\nplaceholder[a\"b\\c\\x0ad\\xff]")"));
}

TEST(DotTest, EscapesModulePaths) {
  std::unique_ptr<Graph> g = test_graphs::VariedGraph("module_paths");
  DotOptions options;
  options.show_scope = true;
  options.clusters = {{"trunk_output_block1_block1_0_proj_0", 0}};
  options.cluster_labels = {"trunk_output.block1.block1-0 \"\xc3\xa9\""};
  std::string dot = ToDot(*g, options);
  // Ids are positional: nothing of a name or path gets into them.
  EXPECT_THAT(dot,
              HasSubstr("n1 [label=\"%trunk_output_block1_block1_0_proj_0"
                        "\\ncall_module[trunk_output.block1.block1-0."
                        "proj.0]\\ntrunk_output.block1.block1-0.proj.0\""));
  EXPECT_THAT(dot, HasSubstr("label=\"trunk_output.block1.block1-0 "
                             "\\\"\xc3\xa9\\\"\";"));
  // Well-formed UTF-8 stays as is (Graphviz reads UTF-8); quotes and
  // backslashes are escaped, control characters shown as \xNN text.
  EXPECT_THAT(dot, HasSubstr("get_attr[bl\xc3\xb6"
                             "ck.\xd0\xb1\xd0\xbb\xd0"
                             "\xbe\xd0\xba]"));
  EXPECT_THAT(dot, HasSubstr(R"(get_attr[q\"uote.back\\slash])"));
  EXPECT_THAT(dot, HasSubstr(R"(get_attr[tab\\x09.new\\x0aline])"));
  EXPECT_THAT(dot, HasSubstr("get_attr[3d conv.weight]"));
  // Truncated or invalid UTF-8 is not passed to Graphviz.
  Graph bad;
  Node* x = *bad.AddNode(OpKind::kGetAttr,
                         "\xc3.\xe2\x82.\xed\xa0\x80.\xc0\xaf", {}, {}, "x");
  ASSERT_OK(bad.Output(Argument::Ref(x)));
  EXPECT_THAT(
      ToDot(bad),
      HasSubstr(R"(get_attr[\\xc3.\\xe2\\x82.\\xed\\xa0\\x80.\\xc0\\xaf])"));
}

TEST(DotTest, IsDeterministic) {
  for (const test_graphs::NamedGraph& c : test_graphs::VariedGraphs()) {
    DotOptions options;
    int i = 0;
    for (Node* n : c.graph->nodes()) options.clusters[n->name()] = (i++) / 3;
    std::string first = ToDot(*c.graph, options);
    EXPECT_EQ(ToDot(*c.graph->Clone(), options), first) << c.name;
  }
}

}  // namespace
}  // namespace tracecut::ir
