#include "partition/partitioner.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "partition/subgraph.h"
#include "partition/test_graphs.h"
#include "util/testing/status_matchers.h"

namespace tracecut::partition {
namespace {

using testing::BuildDecoder;
using testing::BuildMoe;
using testing::Decoder;
using testing::DecoderSpec;
using ::testing::ElementsAre;
using testing::Entry;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::MoeNodeCount;
using testing::MoeSpec;
using testing::RootScope;
using ::tracecut::util::testing::StatusIs;

PartitionOptions Llama() {
  PartitionOptions o;
  o.targets = {"LlamaDecoderLayer"};
  return o;
}

// Every node of `original` appears in the reassembled graph with the same
// op, target, operands (by name), scope and meta, and nothing else does.
void ExpectSameNodes(const ir::Graph& original, const ir::Graph& rebuilt) {
  ASSERT_EQ(original.size(), rebuilt.size());
  for (const ir::Node* o : original.nodes()) {
    const ir::Node* r = rebuilt.FindNode(o->name());
    ASSERT_NE(r, nullptr) << o->Describe();
    EXPECT_EQ(r->op(), o->op()) << o->Describe();
    EXPECT_EQ(r->target(), o->target()) << o->Describe();
    EXPECT_EQ(r->scope(), o->scope()) << o->Describe();
    EXPECT_TRUE(r->meta() == o->meta()) << o->Describe();
    std::vector<std::string> oi, ri;
    for (const ir::Node* n : o->inputs()) oi.push_back(n->name());
    for (const ir::Node* n : r->inputs()) ri.push_back(n->name());
    EXPECT_EQ(oi, ri) << o->Describe();
  }
}

// Inputs of every subgraph come from earlier subgraphs or the model.
void ExpectNoForwardReads(const Partition& p) {
  for (const Subgraph& s : p.subgraphs) {
    for (const std::string& in : s.input_names) {
      int home = p.SubgraphOf(in);
      ASSERT_GE(home, 0) << in;
      bool model_input = false;
      for (const auto& m : p.model_inputs) model_input |= m == in;
      if (!model_input) {
        EXPECT_LT(home, s.index) << in;
      }
    }
  }
}

TEST(PartitionerTest, CheckTargetPlacementCatchesASplitOrSharedTarget) {
  Decoder d = BuildDecoder({.layers = 3});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  EXPECT_OK(CheckTargetPlacement(*d.graph, *p));

  // A node of layer 1 homed in layer 2's subgraph: the target is split.
  std::string moved;
  for (const ir::Node* n : d.graph->nodes()) {
    bool in_layer1 = false;
    for (const auto& e : n->scope().stack()) {
      in_layer1 |= e.path == "model.layers.1";
    }
    if (n->op() == ir::OpKind::kCallFunction && in_layer1) {
      moved = n->name();
      break;
    }
  }
  ASSERT_FALSE(moved.empty());
  p->home[moved] = 3;
  absl::Status split = CheckTargetPlacement(*d.graph, *p);
  EXPECT_EQ(split.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(split.message(),
              HasSubstr("belongs to target 'model.layers.1' "
                        "(subgraph 2) but runs in subgraph 3"));
  p->home[moved] = 2;

  // One target listed by two subgraphs.
  p->subgraphs[3].module_paths.push_back("model.layers.0");
  EXPECT_THAT(CheckTargetPlacement(*d.graph, *p).message(),
              HasSubstr("target 'model.layers.0' is in subgraphs 1 and 3"));
}

TEST(PartitionerTest, DecoderSplitsIntoHeadLayersAndTail) {
  Decoder d = BuildDecoder({.layers = 4});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 5u);
  EXPECT_THAT(p->subgraphs[0].module_paths, IsEmpty());
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(p->subgraphs[i + 1].module_paths,
                ElementsAre(absl::StrCat("model.layers.", i)));
  }
  // Head: embedding, mask construction, rotary.
  for (const char* n : {"embed", "mask_expand", "causal_mask", "freqs", "cos",
                        "sin", "inv_freq"}) {
    EXPECT_EQ(p->SubgraphOf(n), 0) << n;
  }
  // Tail goes with the last layer.
  EXPECT_EQ(p->SubgraphOf("norm"), 4);
  EXPECT_EQ(p->SubgraphOf("logits"), 4);
  EXPECT_EQ(p->SubgraphOf("output"), 4);
  // Each layer's parameters in its own subgraph.
  for (int i = 0; i < 4; ++i) {
    const Subgraph& s = p->subgraphs[i + 1];
    std::string l = absl::StrCat("model.layers.", i, ".self_attn.");
    EXPECT_THAT(s.param_targets,
                ElementsAre(l + "q_proj.weight", l + "k_proj.weight",
                            l + "v_proj.weight", l + "o_proj.weight"));
    EXPECT_EQ(s.param_bytes, 4 * 64 * 64 * 4);
    EXPECT_EQ(p->SubgraphOf(absl::StrCat("l", i, "_q_w")), i + 1);
  }
  EXPECT_THAT(
      p->subgraphs[4].leaf_modules,
      ElementsAre("model.layers.3.input_layernorm",
                  "model.layers.3.post_attention_layernorm",
                  "model.layers.3.mlp.gate_proj", "model.layers.3.mlp.up_proj",
                  "model.layers.3.mlp.down_proj", "model.norm", "lm_head"));
  EXPECT_THAT(p->targets_used, ElementsAre("LlamaDecoderLayer"));
  EXPECT_THAT(p->model_inputs, ElementsAre("input_ids", "attention_mask"));
  EXPECT_THAT(p->model_outputs, ElementsAre("logits"));
  EXPECT_THAT(p->warnings, IsEmpty());

  int64_t total = 0;
  for (const Subgraph& s : p->subgraphs) {
    total += s.node_count;
    EXPECT_OK(ir::Verify(*s.graph));
  }
  EXPECT_OK(ir::Verify(*p->output_graph));
  EXPECT_EQ(total, static_cast<int64_t>(d.graph->size()));
  ExpectNoForwardReads(*p);
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, OutputsAreMinimalAndLastUseFreesEverything) {
  Decoder d = BuildDecoder({.layers = 3});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  const auto& s = p->subgraphs;
  EXPECT_THAT(s[0].input_names, ElementsAre("input_ids", "attention_mask"));
  EXPECT_THAT(s[0].output_names,
              ElementsAre("embed", "causal_mask", "cos", "sin"));
  EXPECT_THAT(s[0].last_use, ElementsAre("input_ids", "attention_mask"));
  EXPECT_THAT(s[1].input_names,
              ElementsAre("embed", "causal_mask", "cos", "sin"));
  EXPECT_THAT(s[1].output_names, ElementsAre("l0_out"));
  EXPECT_THAT(s[1].last_use, ElementsAre("embed"));
  EXPECT_THAT(s[2].input_names,
              ElementsAre("causal_mask", "cos", "sin", "l0_out"));
  EXPECT_THAT(s[2].output_names, ElementsAre("l1_out"));
  EXPECT_THAT(s[2].last_use, ElementsAre("l0_out"));
  EXPECT_THAT(s[3].input_names,
              ElementsAre("causal_mask", "cos", "sin", "l1_out"));
  EXPECT_THAT(s[3].output_names, ElementsAre("logits"));
  EXPECT_THAT(s[3].last_use,
              ElementsAre("causal_mask", "cos", "sin", "l1_out"));

  // The subgraph graphs: placeholders named after the producers, a Tuple of
  // the outputs, cloned nodes with their scopes.
  const ir::Graph& g1 = *s[1].graph;
  std::vector<std::string> ph;
  for (const ir::Node* n : g1.placeholders()) ph.push_back(n->name());
  EXPECT_THAT(ph, ElementsAre("embed", "causal_mask", "cos", "sin"));
  const ir::Node* out = g1.output_node();
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(out->args().size(), 1u);
  ASSERT_EQ(out->args()[0].kind(), ir::Argument::Kind::kTuple);
  ASSERT_EQ(out->args()[0].elements().size(), 1u);
  EXPECT_EQ(out->args()[0].elements()[0].node()->name(), "l0_out");
  const ir::Node* q = g1.FindNode("l0_q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->scope(), d.graph->FindNode("l0_q")->scope());
  EXPECT_EQ(g1.FindNode("l1_q"), nullptr);
  EXPECT_OK(VerifySchedule(*p));
}

TEST(PartitionerTest, ReassembleRebuildsTheGraph) {
  for (bool tied : {false, true}) {
    Decoder d = BuildDecoder({.layers = 3,
                              .tied_embedding = tied,
                              .glue_after_layer = 0,
                              .return_embeddings = true});
    auto p = PartitionGraph(*d.graph, Llama());
    ASSERT_OK(p);
    ASSERT_OK(VerifyPartition(*d.graph, *p));
    auto rebuilt = Reassemble(*p);
    ASSERT_OK(rebuilt);
    ExpectSameNodes(*d.graph, **rebuilt);
  }
}

TEST(PartitionerTest, ModelOutputOfAnEarlySubgraphIsKept) {
  Decoder d = BuildDecoder({.layers = 2, .return_embeddings = true});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  EXPECT_THAT(p->model_outputs, ElementsAre("logits", "embed"));
  EXPECT_THAT(p->subgraphs[0].output_names,
              ElementsAre("embed", "causal_mask", "cos", "sin"));
  for (const Subgraph& s : p->subgraphs) {
    EXPECT_THAT(s.last_use, ::testing::Not(::testing::Contains("embed")));
  }
  std::vector<std::string> ph;
  for (const ir::Node* n : p->output_graph->placeholders()) {
    ph.push_back(n->name());
  }
  EXPECT_THAT(ph, ElementsAre("logits", "embed"));
  EXPECT_OK(VerifySchedule(*p));
}

TEST(PartitionerTest, TiedParametersAreReadInEachSubgraph) {
  Decoder d = BuildDecoder({.layers = 2, .tied_embedding = true});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 3u);
  EXPECT_EQ(p->SubgraphOf("embed_w"), 0);
  EXPECT_THAT(
      p->subgraphs[0].param_targets,
      ElementsAre("model.embed_tokens.weight", "model.rotary_emb.inv_freq"));
  EXPECT_THAT(p->subgraphs[2].param_targets,
              ::testing::Contains("model.embed_tokens.weight"));
  // The weight never travels through the cache.
  for (const Subgraph& s : p->subgraphs) {
    EXPECT_THAT(s.output_names, ::testing::Not(::testing::Contains("embed_w")));
    EXPECT_THAT(s.input_names, ::testing::Not(::testing::Contains("embed_w")));
  }
  const ir::Node* w = p->subgraphs[2].graph->FindNode("embed_w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->op(), ir::OpKind::kGetAttr);
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, GlueBetweenLayersGoesToItsFirstConsumer) {
  Decoder d = BuildDecoder({.layers = 4, .glue_after_layer = 1});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  // glue_cos follows layer 1 in graph order; layer 2 reads it first.
  EXPECT_EQ(p->SubgraphOf("glue_cos"), 3);
  EXPECT_THAT(p->subgraphs[3].output_names, ElementsAre("glue_cos", "l2_out"));
  EXPECT_THAT(p->subgraphs[4].input_names, ::testing::Contains("glue_cos"));
  EXPECT_THAT(p->subgraphs[4].last_use, ::testing::Contains("glue_cos"));
  // cos is last read by the glue node.
  EXPECT_THAT(p->subgraphs[3].last_use, ::testing::Contains("cos"));
  ExpectNoForwardReads(*p);
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, NoHeadWhenNothingPrecedesTheFirstTarget) {
  Decoder d = BuildDecoder({.layers = 3, .no_head = true});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 3u);
  EXPECT_THAT(p->subgraphs[0].module_paths, ElementsAre("model.layers.0"));
  EXPECT_EQ(p->SubgraphOf("input_ids"), 0);
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, LeafLayersAndModuleSizes) {
  Decoder d = BuildDecoder({.layers = 3, .leaf_layers = true});
  PartitionOptions o = Llama();
  o.param_bytes = ParamBytesFromMap({{"model.layers.0", 100},
                                     {"model.layers.1", 200},
                                     {"model.layers.2", 300},
                                     {"lm_head", 7}});
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  EXPECT_THAT(p->subgraphs[1].leaf_modules, ElementsAre("model.layers.0"));
  EXPECT_EQ(p->subgraphs[1].param_bytes, 100);
  EXPECT_EQ(p->subgraphs[3].param_bytes, 307);  // Unknown model.norm is 0.
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, TargetsPerSubgraph) {
  Decoder d = BuildDecoder({.layers = 5});
  PartitionOptions o = Llama();
  o.targets_per_subgraph = 2;
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  EXPECT_THAT(p->subgraphs[1].module_paths,
              ElementsAre("model.layers.0", "model.layers.1"));
  EXPECT_THAT(p->subgraphs[2].module_paths,
              ElementsAre("model.layers.2", "model.layers.3"));
  EXPECT_THAT(p->subgraphs[3].module_paths, ElementsAre("model.layers.4"));
  EXPECT_THAT(p->subgraphs[1].output_names, ElementsAre("l1_out"));
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, PatternsByQualifiedTypePathAndGlob) {
  Decoder d = BuildDecoder({.layers = 3});
  for (const char* t :
       {"transformers.models.llama.modeling_llama.LlamaDecoderLayer",
        "model.layers.*", "*DecoderLayer", "re:model\\.layers\\.[0-9]+"}) {
    PartitionOptions o;
    o.targets = {t};
    auto p = PartitionGraph(*d.graph, o);
    ASSERT_OK(p) << t;
    EXPECT_EQ(p->subgraphs.size(), 4u) << t;
    EXPECT_THAT(p->targets_used, ElementsAre(t));
  }
  // Individual paths.
  PartitionOptions o;
  o.targets = {"model.layers.1", "MistralDecoderLayer"};
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 2u);
  EXPECT_THAT(p->subgraphs[1].module_paths, ElementsAre("model.layers.1"));
  EXPECT_THAT(p->targets_used, ElementsAre("model.layers.1"));
  // Layer 0 is head (before the first target), layer 2 goes with the tail.
  EXPECT_EQ(p->SubgraphOf("l0_q"), 0);
  EXPECT_EQ(p->SubgraphOf("l2_q"), 1);
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, ModulePatternMatches) {
  const std::string t = "transformers.models.llama.modeling_llama.LlamaMLP";
  EXPECT_TRUE(ModulePatternMatches("LlamaMLP", "model.layers.0.mlp", t));
  EXPECT_TRUE(ModulePatternMatches(t, "model.layers.0.mlp", t));
  EXPECT_TRUE(
      ModulePatternMatches("model.layers.0.mlp", "model.layers.0.mlp", t));
  EXPECT_FALSE(ModulePatternMatches("MLP", "model.layers.0.mlp", t));
  EXPECT_TRUE(
      ModulePatternMatches("model.layers.*.mlp", "model.layers.12.mlp", ""));
  EXPECT_FALSE(
      ModulePatternMatches("model.layers.*", "model.layers.0.mlp", ""));
  EXPECT_TRUE(ModulePatternMatches("model.**", "model.layers.0.mlp", ""));
  EXPECT_TRUE(ModulePatternMatches("model.layers.?", "model.layers.7", ""));
  EXPECT_FALSE(ModulePatternMatches("model.layers.?", "model.layers.17", ""));
  EXPECT_TRUE(ModulePatternMatches("Llama*", "x", t));
  EXPECT_TRUE(ModulePatternMatches("re:.*mlp", "model.layers.0.mlp", ""));
  EXPECT_FALSE(ModulePatternMatches("re:mlp", "model.layers.0.mlp", ""));
  EXPECT_FALSE(ModulePatternMatches("re:(", "model", ""));
}

TEST(PartitionerTest, ModulePatternsMatchPyTorchNames) {
  // Segments are whatever PyTorch allows (ir/names.h): torchvision's RegNet
  // has "trunk_output.block1.block1-0".
  const std::string t = "torchvision.models.regnet.ResBottleneckBlock";
  const std::string path = "trunk_output.block1.block1-0";
  EXPECT_TRUE(ModulePatternMatches(path, path, t));
  EXPECT_TRUE(ModulePatternMatches("trunk_output.*.block1-*", path, ""));
  EXPECT_TRUE(ModulePatternMatches("trunk_output.block1.block?-?", path, ""));
  EXPECT_FALSE(ModulePatternMatches("trunk_output.*", path, ""));
  EXPECT_TRUE(ModulePatternMatches("trunk_output.**", path, ""));
  EXPECT_TRUE(ModulePatternMatches("re:.*\\.block1-[0-9]+", path, ""));
  EXPECT_FALSE(ModulePatternMatches("block1-0", path, ""));
  EXPECT_TRUE(ModulePatternMatches("0.my block", "0.my block", ""));
  EXPECT_TRUE(ModulePatternMatches("*.bl*ck",
                                   "0.bl\xc3\xb6"
                                   "ck",
                                   ""));
  EXPECT_TRUE(ModulePatternMatches("a*b", "a*b", ""));
}

TEST(PartitionerTest, IgnoredModulesNeverStartASubgraph) {
  Decoder d = BuildDecoder({.layers = 4});
  PartitionOptions o = Llama();
  o.ignore = {"model.layers.2"};
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  EXPECT_THAT(p->subgraphs[3].module_paths, ElementsAre("model.layers.3"));
  // Layer 2's nodes are placed with their first consumer, layer 3.
  EXPECT_EQ(p->SubgraphOf("l2_q"), 3);
  EXPECT_THAT(p->subgraphs[3].param_targets,
              ::testing::Contains("model.layers.2.self_attn.q_proj.weight"));
  EXPECT_OK(VerifyPartition(*d.graph, *p));

  // Ignoring an ancestor ignores everything inside it.
  o.ignore = {"model"};
  auto none = PartitionGraph(*d.graph, o);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
}

TEST(PartitionerTest, TargetsMatchingNothingListLikelyLayers) {
  Decoder d = BuildDecoder({.layers = 3});
  PartitionOptions o;
  o.targets = {"MistralDecoderLayer"};
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  std::printf("[ message ] %s\n", std::string(p.status().message()).c_str());
  EXPECT_THAT(p.status().message(), HasSubstr("[MistralDecoderLayer]"));
  // Layers (in numbered containers) first.
  EXPECT_THAT(p.status().message(),
              HasSubstr("(likely layers): LlamaDecoderLayer (3), Linear (10)"));
  EXPECT_THAT(p.status().message(), HasSubstr("LlamaMLP (3)"));
  EXPECT_THAT(p.status().message(),
              ::testing::Not(HasSubstr("LlamaForCausalLM")));
}

TEST(PartitionerTest, RejectsBadOptions) {
  Decoder d = BuildDecoder({.layers = 1});
  EXPECT_EQ(PartitionGraph(*d.graph, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  PartitionOptions o;
  o.targets = {"re:(unclosed"};
  EXPECT_THAT(
      PartitionGraph(*d.graph, o),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("re:(unclosed")));
  o = Llama();
  o.targets_per_subgraph = -1;
  EXPECT_THAT(PartitionGraph(*d.graph, o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ir::Graph no_output;
  EXPECT_THAT(PartitionGraph(no_output, Llama()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PartitionerTest, NestedTargetsOutermostByDefault) {
  Decoder d = BuildDecoder({.layers = 3});
  PartitionOptions o;
  o.targets = {"LlamaMLP", "LlamaDecoderLayer"};
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  EXPECT_THAT(p->subgraphs[1].module_paths, ElementsAre("model.layers.0"));
  EXPECT_THAT(p->targets_used, ElementsAre("LlamaDecoderLayer"));
}

TEST(PartitionerTest, NestedTargetsInnermostRejectsSurroundingOuter) {
  Decoder d = BuildDecoder({.layers = 3});
  PartitionOptions o;
  o.targets = {"LlamaDecoderLayer", "LlamaMLP"};
  o.nesting = Nesting::kInnermost;
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  std::printf("[ message ] %s\n", std::string(p.status().message()).c_str());
  EXPECT_THAT(p.status().message(), HasSubstr("'model.layers.0'"));
  EXPECT_THAT(p.status().message(), HasSubstr("'model.layers.0.mlp'"));
  EXPECT_THAT(p.status().message(), HasSubstr("l0_out"));
  EXPECT_THAT(p.status().message(), HasSubstr("nesting=outermost"));

  // Targeting only the inner modules splits each layer in two; the layer's
  // own nodes (norms, residual adds) go with their first consumer, except
  // layer 0's input norm, which precedes the first target (head).
  o.targets = {"LlamaAttention", "LlamaMLP"};
  auto split = PartitionGraph(*d.graph, o);
  ASSERT_OK(split);
  ASSERT_EQ(split->subgraphs.size(), 7u);
  EXPECT_THAT(split->subgraphs[1].module_paths,
              ElementsAre("model.layers.0.self_attn"));
  EXPECT_THAT(split->subgraphs[2].module_paths,
              ElementsAre("model.layers.0.mlp"));
  EXPECT_EQ(split->SubgraphOf("l0_ln1"), 0);
  EXPECT_EQ(split->SubgraphOf("l1_ln1"), 3);
  EXPECT_EQ(split->SubgraphOf("l0_res1"), 2);
  EXPECT_EQ(split->SubgraphOf("l0_ln2"), 2);
  EXPECT_EQ(split->SubgraphOf("l0_out"), 3);  // Read first by layer 1.
  EXPECT_OK(VerifyPartition(*d.graph, *split));
}

// A ResNet-like model: each stage runs its own downsample, then its blocks.
// The stage's own nodes all precede its blocks, so innermost works.
TEST(PartitionerTest, NestedTargetsInnermostSplitsStages) {
  ir::Graph g;
  ir::Scope root = RootScope();
  ir::Node* x = *g.Placeholder("x");
  ir::Node* h = x;
  for (int s = 0; s < 2; ++s) {
    std::string sp = absl::StrCat("stages.", s);
    ir::Scope stage = root.Push(Entry(sp, "resnet.ResNetStage"));
    ir::Node* down = *g.CallModule(sp + ".downsample", {ir::Argument::Ref(h)},
                                   {}, absl::StrCat("s", s, "_down"));
    down->set_scope(stage.Push(Entry(sp + ".downsample", "torch.nn.Conv2d")));
    h = down;
    for (int b = 0; b < 2; ++b) {
      std::string bp = absl::StrCat(sp, ".blocks.", b);
      ir::Scope block = stage.Push(Entry(bp, "resnet.ResNetBlock"));
      ir::Node* conv = *g.CallModule(bp + ".conv", {ir::Argument::Ref(h)}, {},
                                     absl::StrCat("s", s, "b", b, "_conv"));
      conv->set_scope(block.Push(Entry(bp + ".conv", "torch.nn.Conv2d")));
      ir::Node* add = *g.CallFunction(
          "aten::add.Tensor",
          {ir::Argument::Ref(conv), ir::Argument::Ref(h), ir::Argument::Int(1)},
          {}, absl::StrCat("s", s, "b", b, "_add"));
      add->set_scope(block);
      h = add;
    }
  }
  ASSERT_OK(g.Output(ir::Argument::Ref(h)));

  PartitionOptions o;
  o.targets = {"ResNetStage", "ResNetBlock"};
  auto outer = PartitionGraph(g, o);
  ASSERT_OK(outer);
  ASSERT_EQ(outer->subgraphs.size(), 2u);
  EXPECT_THAT(outer->subgraphs[0].module_paths, ElementsAre("stages.0"));

  o.nesting = Nesting::kInnermost;
  auto inner = PartitionGraph(g, o);
  ASSERT_OK(inner);
  ASSERT_EQ(inner->subgraphs.size(), 6u);
  EXPECT_THAT(inner->subgraphs[0].module_paths, ElementsAre("stages.0"));
  EXPECT_THAT(inner->subgraphs[1].module_paths,
              ElementsAre("stages.0.blocks.0"));
  EXPECT_THAT(inner->subgraphs[3].module_paths, ElementsAre("stages.1"));
  EXPECT_THAT(inner->subgraphs[0].output_names, ElementsAre("s0_down"));
  EXPECT_OK(VerifyPartition(g, *inner));
}

// A shared module called before and after another target cannot be one
// subgraph.
TEST(PartitionerTest, TargetRunningAroundAnotherIsRejected) {
  ir::Graph g;
  ir::Scope root = RootScope();
  ir::Scope shared = root.Push(Entry("shared", "Block"));
  ir::Scope other = root.Push(Entry("other", "Block"));
  ir::Node* x = *g.Placeholder("x");
  ir::Node* a = *g.CallFunction("aten::relu", {ir::Argument::Ref(x)}, {}, "a");
  a->set_scope(shared);
  ir::Node* b = *g.CallFunction("aten::relu", {ir::Argument::Ref(a)}, {}, "b");
  b->set_scope(other);
  ir::Node* c = *g.CallFunction("aten::relu", {ir::Argument::Ref(b)}, {}, "c");
  c->set_scope(shared);
  ASSERT_OK(g.Output(ir::Argument::Ref(c)));
  PartitionOptions o;
  o.targets = {"Block"};
  auto p = PartitionGraph(g, o);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  std::printf("[ message ] %s\n", std::string(p.status().message()).c_str());
  EXPECT_THAT(p.status().message(), HasSubstr("%c"));
  EXPECT_THAT(p.status().message(), HasSubstr("'shared' (Block)"));
  EXPECT_THAT(p.status().message(), HasSubstr("'other' (Block)"));
  // Ignoring one of them makes it orderable.
  o.ignore = {"other"};
  auto ok = PartitionGraph(g, o);
  ASSERT_OK(ok);
  EXPECT_EQ(ok->subgraphs.size(), 1u);
}

TEST(PartitionerTest, BudgetMergesConsecutiveTargets) {
  Decoder d = BuildDecoder({.layers = 6});
  const int64_t layer = 4 * 64 * 64 * 4;  // q, k, v, o from meta.
  PartitionOptions o = Llama();
  o.max_param_bytes = 2 * layer + layer / 2;
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  EXPECT_THAT(p->subgraphs[1].module_paths,
              ElementsAre("model.layers.0", "model.layers.1"));
  EXPECT_EQ(p->subgraphs[1].param_bytes, 2 * layer);
  EXPECT_THAT(p->subgraphs[3].module_paths,
              ElementsAre("model.layers.4", "model.layers.5"));
  // Leaf modules have no size without a callback.
  EXPECT_THAT(p->warnings, ElementsAre(HasSubstr("unknown")));

  // With a cap on targets as well.
  o.targets_per_subgraph = 1;
  auto capped = PartitionGraph(*d.graph, o);
  ASSERT_OK(capped);
  EXPECT_EQ(capped->subgraphs.size(), 7u);
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

TEST(PartitionerTest, BudgetKeepsAnOversizedTargetAloneAndWarns) {
  Decoder d = BuildDecoder({.layers = 3});
  PartitionOptions o = Llama();
  absl::flat_hash_map<std::string, int64_t> sizes;
  for (const ir::Node* n : d.graph->nodes()) {
    if (n->op() == ir::OpKind::kGetAttr || n->op() == ir::OpKind::kCallModule) {
      sizes[n->target()] = 10;
    }
  }
  sizes["model.layers.1.self_attn.q_proj.weight"] = 1000;
  o.param_bytes = ParamBytesFromMap(sizes);
  o.max_param_bytes = 500;
  auto p = PartitionGraph(*d.graph, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  EXPECT_THAT(p->subgraphs[1].module_paths, ElementsAre("model.layers.0"));
  EXPECT_THAT(p->subgraphs[2].module_paths, ElementsAre("model.layers.1"));
  EXPECT_THAT(p->subgraphs[3].module_paths, ElementsAre("model.layers.2"));
  EXPECT_THAT(p->subgraphs[2].warnings,
              ElementsAre(HasSubstr("over max_param_bytes")));
  EXPECT_THAT(p->warnings, ElementsAre(HasSubstr("model.layers.1")));
  EXPECT_THAT(p->subgraphs[1].warnings, IsEmpty());
}

TEST(PartitionerTest, Deterministic) {
  Decoder d = BuildDecoder({.layers = 4, .glue_after_layer = 2});
  auto a = PartitionGraph(*d.graph, Llama());
  auto b = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_EQ(a->subgraphs.size(), b->subgraphs.size());
  for (size_t i = 0; i < a->subgraphs.size(); ++i) {
    EXPECT_TRUE(
        ir::StructurallyEqual(*a->subgraphs[i].graph, *b->subgraphs[i].graph));
    EXPECT_EQ(a->subgraphs[i].input_names, b->subgraphs[i].input_names);
    EXPECT_EQ(a->subgraphs[i].output_names, b->subgraphs[i].output_names);
    EXPECT_EQ(a->subgraphs[i].last_use, b->subgraphs[i].last_use);
  }
}

// The exact subgraph graphs, built from and compared as IR text.
TEST(PartitionerTest, SubgraphGraphsFromText) {
  auto g = ir::ParseGraph(R"(graph {
  %x = placeholder[x]()
  %mask = call_function[aten::neg](%x) scope[:"M"]
  %a = call_function[aten::relu](%x) scope[:"M", blocks.0:"m.Block"]
  %w1 = get_attr[blocks.1.w]() scope[:"M", blocks.1:"m.Block"] meta{out=[tensor([2, 2], float32, "cpu")]}
  %b = call_function[aten::mm](%a, %w1) scope[:"M", blocks.1:"m.Block"]
  %c = call_function[aten::add.Tensor](%b, %mask, 1) scope[:"M", blocks.1:"m.Block"]
  %output = output[output](%c)
}
)");
  ASSERT_OK(g);
  PartitionOptions o;
  o.targets = {"m.Block"};
  auto p = PartitionGraph(**g, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 3u);
  EXPECT_EQ(ir::PrintGraph(*p->subgraphs[0].graph), R"(graph {
  %x = placeholder[x]()
  %mask = call_function[aten::neg](%x) scope[:"M"]
  %output = output[output]((%mask,))
}
)");
  EXPECT_EQ(ir::PrintGraph(*p->subgraphs[1].graph), R"(graph {
  %x = placeholder[x]()
  %a = call_function[aten::relu](%x) scope[:"M", blocks.0:"m.Block"]
  %output = output[output]((%a,))
}
)");
  EXPECT_EQ(ir::PrintGraph(*p->subgraphs[2].graph), R"(graph {
  %mask = placeholder[mask]()
  %a = placeholder[a]()
  %w1 = get_attr[blocks.1.w]() scope[:"M", blocks.1:"m.Block"] meta{out=[tensor([2, 2], float32, "cpu")]}
  %b = call_function[aten::mm](%a, %w1) scope[:"M", blocks.1:"m.Block"]
  %c = call_function[aten::add.Tensor](%b, %mask, 1) scope[:"M", blocks.1:"m.Block"]
  %output = output[output]((%c,))
}
)");
  EXPECT_EQ(ir::PrintGraph(*p->output_graph), R"(graph {
  %c = placeholder[c]()
  %output = output[output](%c)
}
)");
  EXPECT_THAT(p->subgraphs[0].last_use, IsEmpty());
  EXPECT_THAT(p->subgraphs[1].last_use, ElementsAre("x"));
  EXPECT_THAT(p->subgraphs[2].last_use, ElementsAre("mask", "a"));
  EXPECT_EQ(p->subgraphs[2].param_bytes, 16);
  auto rebuilt = Reassemble(*p);
  ASSERT_OK(rebuilt);
  EXPECT_EQ(ir::PrintGraph(**rebuilt), ir::PrintGraph(**g));
}

TEST(PartitionerTest, VerifyScheduleCatchesBrokenPartitions) {
  Decoder d = BuildDecoder({.layers = 2});
  auto p = PartitionGraph(*d.graph, Llama());
  ASSERT_OK(p);
  // A value freed too early.
  p->subgraphs[1].last_use.push_back("causal_mask");
  absl::Status s = VerifySchedule(*p);
  EXPECT_THAT(s.message(), HasSubstr("subgraph 2 reads %causal_mask, which "
                                     "subgraph 1 freed"));
  p->subgraphs[1].last_use.pop_back();
  // A value never freed.
  p->subgraphs[2].last_use.pop_back();
  s = VerifySchedule(*p);
  EXPECT_THAT(s.message(), HasSubstr("is never freed"));
  p->subgraphs[2].last_use.push_back("l0_out");
  ASSERT_OK(VerifySchedule(*p));
  // A subgraph that reads what a later one produces.
  std::swap(p->subgraphs[1], p->subgraphs[2]);
  std::swap(p->subgraphs[1].index, p->subgraphs[2].index);
  s = VerifySchedule(*p);
  EXPECT_THAT(s.message(), HasSubstr("which the later subgraph 2 produces"));
}

TEST(PartitionerTest, TwoThousandLayersPartitionQuickly) {
  const int layers = 2000;
  auto t0 = std::chrono::steady_clock::now();
  Decoder d = BuildDecoder({.layers = layers});
  auto t1 = std::chrono::steady_clock::now();
  auto p = PartitionGraph(*d.graph, Llama());
  auto t2 = std::chrono::steady_clock::now();
  ASSERT_OK(p);
  auto ms = [](auto a, auto b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  std::printf(
      "[ timing ] %d layers, %zu nodes: build %.1f ms, partition %.1f ms\n",
      layers, d.graph->size(), ms(t0, t1), ms(t1, t2));
  ASSERT_EQ(p->subgraphs.size(), static_cast<size_t>(layers + 1));
  EXPECT_THAT(p->subgraphs[layers].output_names, ElementsAre("logits"));
  EXPECT_THAT(p->subgraphs[1000].output_names, ElementsAre("l999_out"));
  EXPECT_OK(VerifyPartition(*d.graph, *p));
}

// A leaf module called inside an outer target whose scope does not end with
// the leaf (as TorchScript leaves are scoped), every node with its own copy
// of its stack (no sharing): with kInnermost the leaf is an instance of its
// own, numbered before the outer one, whose first node comes later.
TEST(PartitionerTest, LeafTargetInsideAnOuterTargetWithUnsharedScopes) {
  ir::Graph g;
  auto outer = [] {
    return ir::Scope({Entry("", "M"), Entry("outer", "pkg.Outer")});
  };
  ir::Node* x = *g.Placeholder("x");
  ir::Node* leaf =
      *g.CallModule("outer.inner", {ir::Argument::Ref(x)}, {}, "leaf");
  leaf->set_scope(outer());
  ir::Node* relu =
      *g.CallFunction("aten::relu", {ir::Argument::Ref(leaf)}, {}, "relu");
  relu->set_scope(outer());
  ir::Node* skipped =
      *g.CallModule("outer.skip", {ir::Argument::Ref(relu)}, {}, "skipped");
  skipped->set_scope(outer());
  ASSERT_OK(g.Output(ir::Argument::Ref(skipped)));

  PartitionOptions o;
  o.targets = {"Outer", "outer.inner", "outer.skip"};
  o.ignore = {"outer.skip"};
  o.nesting = Nesting::kInnermost;
  auto p = PartitionGraph(g, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 2u);
  EXPECT_THAT(p->subgraphs[0].module_paths, ElementsAre("outer.inner"));
  EXPECT_THAT(p->subgraphs[1].module_paths, ElementsAre("outer"));
  EXPECT_EQ(p->SubgraphOf("leaf"), 0);
  EXPECT_EQ(p->SubgraphOf("relu"), 1);
  // An ignored leaf stays with the target around it.
  EXPECT_EQ(p->SubgraphOf("skipped"), 1);
  EXPECT_OK(VerifyPartition(g, *p));

  o.nesting = Nesting::kOutermost;
  auto outermost = PartitionGraph(g, o);
  ASSERT_OK(outermost);
  ASSERT_EQ(outermost->subgraphs.size(), 1u);
  EXPECT_THAT(outermost->subgraphs[0].module_paths, ElementsAre("outer"));
}

// The synthetic mixture-of-experts graph of the scale benchmark
// (partition_bench --moe): valid IR, the node count its header states, and
// partitioned like a traced Mixtral.
TEST(PartitionerTest, MoeGraphSplitsAtDecoderLayers) {
  const MoeSpec spec{.layers = 3, .experts = 5};
  std::unique_ptr<ir::Graph> g = BuildMoe(spec);
  ASSERT_OK(ir::Verify(*g));
  EXPECT_EQ(static_cast<int64_t>(g->size()), MoeNodeCount(spec));
  PartitionOptions o;
  o.targets = {"MixtralDecoderLayer"};
  auto p = PartitionGraph(*g, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 4u);
  EXPECT_THAT(p->subgraphs[0].module_paths, IsEmpty());
  for (int l = 0; l < spec.layers; ++l) {
    EXPECT_THAT(p->subgraphs[l + 1].module_paths,
                ElementsAre(absl::StrCat("model.layers.", l)));
    // The layer's router, every expert and its accumulation.
    for (int e = 0; e < spec.experts; ++e) {
      EXPECT_EQ(
          p->SubgraphOf(absl::StrCat("model_layers_", l,
                                     "_block_sparse_moe_experts_", e, "_w2")),
          l + 1);
    }
    EXPECT_EQ(p->SubgraphOf(
                  absl::StrCat("model_layers_", l, "_block_sparse_moe_gate")),
              l + 1);
    // Per layer: input norm, q/k/v/o, post-attention norm, router gate, and
    // four leaves per expert.
    EXPECT_EQ(p->subgraphs[l + 1].leaf_modules.size(),
              7u + 4u * spec.experts + (l + 1 == spec.layers ? 2u : 0u));
    // Each layer reads the head's mask and rotary tables and the previous
    // layer's output.
    EXPECT_EQ(p->subgraphs[l + 1].input_names.size(), 4u);
  }
  EXPECT_EQ(p->SubgraphOf("model_embed_tokens"), 0);
  EXPECT_EQ(p->SubgraphOf("lm_head"), 3);
  EXPECT_THAT(p->model_outputs, ElementsAre("lm_head"));
  int64_t total = 0;
  for (const Subgraph& s : p->subgraphs) total += s.node_count;
  EXPECT_EQ(total, MoeNodeCount(spec));
  EXPECT_OK(CheckTargetPlacement(*g, *p));
  EXPECT_OK(VerifyPartition(*g, *p));
  auto rebuilt = Reassemble(*p);
  ASSERT_OK(rebuilt);
  ExpectSameNodes(*g, **rebuilt);
}

// Experts as targets: one subgraph each. The block's dispatch (where,
// index) and accumulation (index_add) nodes go with their first consumer;
// nesting them inside decoder-layer targets is rejected with kInnermost,
// since each layer's own nodes run both before and after its experts.
TEST(PartitionerTest, MoeExpertsAsTargets) {
  const MoeSpec spec{.layers = 2, .experts = 3};
  std::unique_ptr<ir::Graph> g = BuildMoe(spec);
  PartitionOptions o;
  o.targets = {"MixtralBlockSparseTop2MLP"};
  auto p = PartitionGraph(*g, o);
  ASSERT_OK(p);
  ASSERT_EQ(p->subgraphs.size(), 1u + spec.layers * spec.experts);
  EXPECT_THAT(p->subgraphs[4].module_paths,
              ElementsAre("model.layers.1.block_sparse_moe.experts.0"));
  // Expert 0's token selection runs with it; its index_add with expert 1.
  EXPECT_EQ(p->SubgraphOf("model_layers_1_block_sparse_moe_gate"), 4);
  EXPECT_OK(CheckTargetPlacement(*g, *p));
  EXPECT_OK(VerifyPartition(*g, *p));

  o.targets = {"MixtralDecoderLayer", "MixtralBlockSparseTop2MLP"};
  auto outer = PartitionGraph(*g, o);
  ASSERT_OK(outer);
  EXPECT_EQ(outer->subgraphs.size(), 1u + spec.layers);

  o.nesting = Nesting::kInnermost;
  auto inner = PartitionGraph(*g, o);
  ASSERT_EQ(inner.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(inner.status().message(),
              HasSubstr("'model.layers.0' (MixtralDecoderLayer)"));
  EXPECT_THAT(inner.status().message(),
              HasSubstr("'model.layers.0.block_sparse_moe.experts.0'"));

  // Ignoring a layer folds it into its neighbours' subgraphs.
  PartitionOptions skip;
  skip.targets = {"MixtralDecoderLayer"};
  skip.ignore = {"model.layers.0"};
  auto skipped = PartitionGraph(*g, skip);
  ASSERT_OK(skipped);
  ASSERT_EQ(skipped->subgraphs.size(), 2u);
  EXPECT_EQ(skipped->SubgraphOf("model_layers_0_block_sparse_moe_gate"), 0);
  EXPECT_OK(VerifyPartition(*g, *skipped));
}

// The scale benchmark's graph at a size a test can afford (about 62k
// nodes; bench/RESULTS.md times it up to a million): every target in
// exactly one subgraph, nothing lost. Prints the time, asserts none.
TEST(PartitionerTest, LargeMoeGraph) {
  const MoeSpec spec{.layers = 16, .experts = 256};
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<ir::Graph> g = BuildMoe(spec);
  auto t1 = std::chrono::steady_clock::now();
  PartitionOptions o;
  o.targets = {"MixtralDecoderLayer"};
  auto p = PartitionGraph(*g, o);
  auto t2 = std::chrono::steady_clock::now();
  ASSERT_OK(p);
  auto ms = [](auto a, auto b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  std::printf("[ timing ] %zu nodes: build %.1f ms, partition %.1f ms\n",
              g->size(), ms(t0, t1), ms(t1, t2));
  EXPECT_EQ(static_cast<int64_t>(g->size()), MoeNodeCount(spec));
  ASSERT_EQ(p->subgraphs.size(), static_cast<size_t>(spec.layers + 1));
  for (int l = 0; l < spec.layers; ++l) {
    EXPECT_THAT(p->subgraphs[l + 1].module_paths,
                ElementsAre(absl::StrCat("model.layers.", l)));
  }
  EXPECT_OK(CheckTargetPlacement(*g, *p));
  EXPECT_OK(VerifyPartition(*g, *p));

  // Partitioned on one thread (Note [Partitioning on two threads]): the
  // same result.
  o.threads = 1;
  auto one = PartitionGraph(*g, o);
  ASSERT_OK(one);
  ASSERT_EQ(one->subgraphs.size(), p->subgraphs.size());
  for (size_t s = 0; s < p->subgraphs.size(); ++s) {
    const Subgraph& a = p->subgraphs[s];
    const Subgraph& b = one->subgraphs[s];
    EXPECT_TRUE(ir::StructurallyEqual(*a.graph, *b.graph)) << s;
    EXPECT_EQ(a.index, b.index);
    EXPECT_EQ(a.module_paths, b.module_paths);
    EXPECT_EQ(a.input_names, b.input_names);
    EXPECT_EQ(a.output_names, b.output_names);
    EXPECT_EQ(a.last_use, b.last_use);
    EXPECT_EQ(a.param_targets, b.param_targets);
    EXPECT_EQ(a.leaf_modules, b.leaf_modules);
    EXPECT_EQ(a.node_count, b.node_count);
  }
  EXPECT_TRUE(p->home == one->home);
  EXPECT_EQ(p->home.size(), g->size());
  EXPECT_TRUE(ir::StructurallyEqual(*p->output_graph, *one->output_graph));
}

}  // namespace
}  // namespace tracecut::partition
