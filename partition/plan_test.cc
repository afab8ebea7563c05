#include "partition/plan.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "partition/plan.pb.h"
#include "partition/test_graphs.h"
#include "util/format.h"
#include "util/testing/status_matchers.h"

namespace tracecut::partition {
namespace {

using testing::BuildDecoder;
using testing::Decoder;
using testing::DecoderSpec;
using ::testing::ElementsAre;
using testing::Entry;
using ::testing::HasSubstr;
using testing::RootScope;

PartitionOptions Llama() {
  PartitionOptions o;
  o.targets = {"LlamaDecoderLayer"};
  return o;
}

PartitionPlan PlanOf(const ir::Graph& g, const PartitionOptions& o) {
  auto p = PartitionGraph(g, o);
  EXPECT_OK(p);
  if (!p.ok()) return {};
  return BuildPlan(*p, o);
}

TEST(PlanTest, HumanBytes) {
  EXPECT_EQ(util::HumanBytes(0), "0 B");
  EXPECT_EQ(util::HumanBytes(1023), "1023 B");
  EXPECT_EQ(util::HumanBytes(1024), "1.0 KiB");
  EXPECT_EQ(util::HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(util::HumanBytes(int64_t{64} << 20), "64.0 MiB");
  EXPECT_EQ(util::HumanBytes(int64_t{5} << 30), "5.0 GiB");
}

TEST(PlanTest, BuildPlanCopiesThePartition) {
  Decoder d = BuildDecoder({.layers = 3});
  PartitionOptions o = Llama();
  o.ignore = {"lm_head"};
  PartitionPlan plan = PlanOf(*d.graph, o);
  ASSERT_EQ(plan.subgraphs_size(), 4);
  EXPECT_EQ(plan.node_count(), static_cast<int64_t>(d.graph->size()));
  EXPECT_THAT(plan.targets_used(), ElementsAre("LlamaDecoderLayer"));
  EXPECT_THAT(plan.options().targets(), ElementsAre("LlamaDecoderLayer"));
  EXPECT_THAT(plan.options().ignore(), ElementsAre("lm_head"));
  EXPECT_EQ(plan.options().nesting(), "outermost");
  EXPECT_THAT(plan.model_inputs(), ElementsAre("input_ids", "attention_mask"));
  EXPECT_THAT(plan.model_outputs(), ElementsAre("logits"));
  const SubgraphPlan& s1 = plan.subgraphs(1);
  EXPECT_EQ(s1.index(), 1);
  EXPECT_THAT(s1.module_paths(), ElementsAre("model.layers.0"));
  EXPECT_THAT(s1.input_names(),
              ElementsAre("embed", "causal_mask", "cos", "sin"));
  EXPECT_THAT(s1.output_names(), ElementsAre("l0_out"));
  EXPECT_THAT(s1.last_use(), ElementsAre("embed"));
  EXPECT_EQ(s1.param_bytes(), 4 * 64 * 64 * 4);
  EXPECT_EQ(s1.param_targets_size(), 4);
  EXPECT_EQ(s1.leaf_modules_size(), 5);
  int64_t sum = 0;
  for (const SubgraphPlan& s : plan.subgraphs()) sum += s.node_count();
  EXPECT_EQ(sum, plan.node_count());
}

TEST(PlanTest, TextTableIsAligned) {
  Decoder d = BuildDecoder({.layers = 12});
  PartitionOptions o = Llama();
  o.targets_per_subgraph = 4;
  std::string text = PlanToText(PlanOf(*d.graph, o));
  std::printf("%s", text.c_str());
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines[0], "partition: 4 subgraphs, " +
                          std::to_string(d.graph->size()) +
                          " nodes, targets: LlamaDecoderLayer");
  EXPECT_THAT(lines[1], ::testing::StartsWith("#  nodes  params"));
  EXPECT_THAT(lines[2], HasSubstr("(head)"));
  EXPECT_THAT(lines[2], HasSubstr("input_ids, attention_mask"));
  EXPECT_THAT(lines[2], HasSubstr("embed, causal_mask, cos, sin"));
  EXPECT_THAT(lines[3], HasSubstr("model.layers.0 .. model.layers.3 (4)"));
  EXPECT_THAT(lines[3], HasSubstr("256.0 KiB"));
  EXPECT_THAT(lines[3], HasSubstr("l3_out"));
  // Columns line up: "modules" starts at the same offset in every row.
  size_t col = lines[1].find("modules");
  EXPECT_EQ(lines[2].find("(head)"), col);
  EXPECT_EQ(lines[3].find("model.layers.0"), col);
  for (const std::string& line : lines) {
    if (!line.empty()) {
      EXPECT_NE(line.back(), ' ') << line;
    }
  }
}

TEST(PlanTest, TextShowsWarnings) {
  Decoder d = BuildDecoder({.layers = 2});
  PartitionOptions o = Llama();
  o.max_param_bytes = 1000;
  std::string text = PlanToText(PlanOf(*d.graph, o));
  EXPECT_THAT(text, HasSubstr("warning: subgraph 1 reads 64.0 KiB of "
                              "parameters, over max_param_bytes (1000 B)"));
}

// Pins the JSON format on a tiny graph.
TEST(PlanTest, JsonGolden) {
  ir::Graph g;
  ir::Node* x = *g.Placeholder("x");
  ir::Node* w = *g.GetAttr("blocks.0.w", "w0");
  w->meta().outputs.push_back({{2, 2}, "float32", "cpu"});
  w->set_scope(RootScope().Push(Entry("blocks.0", "m.Block")));
  ir::Node* y = *g.CallFunction(
      "aten::mm", {ir::Argument::Ref(x), ir::Argument::Ref(w)}, {}, "y");
  y->set_scope(RootScope().Push(Entry("blocks.0", "m.Block")));
  ASSERT_OK(g.Output(ir::Argument::Ref(y)));
  PartitionOptions o;
  o.targets = {"Block", "a\"b\\c"};
  std::string json = PlanToJson(PlanOf(g, o));
  EXPECT_EQ(json, R"({
  "subgraphs": [
    {
      "index": 0,
      "node_count": 4,
      "module_paths": [
        "blocks.0"
      ],
      "input_names": [
        "x"
      ],
      "output_names": [
        "y"
      ],
      "last_use": [
        "x"
      ],
      "param_bytes": 16,
      "param_targets": [
        "blocks.0.w"
      ],
      "leaf_modules": [],
      "warnings": []
    }
  ],
  "targets_used": [
    "Block"
  ],
  "options": {
    "targets": [
      "Block",
      "a\"b\\c"
    ],
    "ignore": [],
    "targets_per_subgraph": 0,
    "max_param_bytes": 0,
    "nesting": "outermost"
  },
  "model_inputs": [
    "x"
  ],
  "model_outputs": [
    "y"
  ],
  "node_count": 4,
  "warnings": []
}
)");
}

TEST(PlanTest, JsonIsDeterministicAndRoundTrips) {
  DecoderSpec spec{.layers = 6, .glue_after_layer = 2};
  Decoder a = BuildDecoder(spec);
  Decoder b = BuildDecoder(spec);
  PartitionOptions o = Llama();
  o.max_param_bytes = 3 * 4 * 64 * 64 * 4;
  std::string ja = PlanToJson(PlanOf(*a.graph, o));
  std::string jb = PlanToJson(PlanOf(*b.graph, o));
  EXPECT_EQ(ja, jb);  // Byte-identical.
  auto back = PlanFromJson(ja);
  ASSERT_OK(back);
  EXPECT_EQ(back->SerializeAsString(), PlanOf(*a.graph, o).SerializeAsString());
  EXPECT_EQ(PlanToJson(*back), ja);
  EXPECT_FALSE(PlanFromJson("{\"subgraphs\": 3}").ok());
  // Every field, even of a plan that lacks its options.
  EXPECT_THAT(PlanToJson(PartitionPlan()),
              HasSubstr("\"options\": {\n    \"targets\": [],"));
}

TEST(PlanTest, DotHasOneColouredClusterPerSubgraph) {
  Decoder d = BuildDecoder({.layers = 2});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  std::string dot = PartitionToDot(*d.graph, *p);
  EXPECT_THAT(dot, HasSubstr("digraph \"partition\""));
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_0"));
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_2"));
  EXPECT_THAT(dot, ::testing::Not(HasSubstr("subgraph cluster_3")));
  EXPECT_THAT(dot, HasSubstr("#0 head"));
  EXPECT_THAT(dot, HasSubstr("#1 model.layers.0"));
  EXPECT_EQ(dot, PartitionToDot(*d.graph, *p));
}

}  // namespace
}  // namespace tracecut::partition
