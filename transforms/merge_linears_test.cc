#include "transforms/merge_linears.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/fusion_math.h"
#include "transforms/module_util.h"
#include "transforms/pass_pipeline.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::DiffGraphModules;
using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;
using testing::MaxRelError;
using testing::Rand;
using testing::RunGraph;

constexpr char kLinear[] = "torch.nn.modules.linear.Linear";

std::string LinearCall(absl::string_view name, absl::string_view input,
                       int64_t out) {
  return absl::StrCat("  %", name, " = call_module[attn.", name, "](%", input,
                      ") scope[:\"Root\", attn:\"Attention\", attn.", name,
                      ":\"", kLinear, "\"] meta{out=[tensor([2, 5, ", out,
                      "], float32, \"cpu\")]}\n");
}

// attn.q (8 -> 8, bias), attn.k (8 -> 4, no bias), attn.v (8 -> 6, bias), all
// reading %x; attn.o reads %q.
runtime::GraphModule MakeQkv(at::ScalarType dtype = at::kFloat) {
  torch::jit::Module root = MakeRoot();
  torch::jit::Module attn = MakeRoot("Attention");
  attn.register_module("q", MakeLinear(root, 8, 8, true, 1, dtype));
  attn.register_module("k", MakeLinear(root, 8, 4, false, 2, dtype));
  attn.register_module("v", MakeLinear(root, 8, 6, true, 3, dtype));
  attn.register_module("o", MakeLinear(root, 8, 8, true, 4, dtype));
  root.register_module("attn", attn);
  return MakeGraphModule(
      root, absl::StrCat("graph {\n  %x = placeholder[x]()\n",
                         LinearCall("q", "x", 8), LinearCall("k", "x", 4),
                         LinearCall("v", "x", 6), LinearCall("o", "q", 8),
                         "  %output = output[output]((%o, %k, %v))\n}\n"));
}

TEST(MergeLinearsTest, MergesParallelLinearsOfAnySize) {
  runtime::GraphModule original = MakeQkv();
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  auto merged = pipeline.Apply(original);
  ASSERT_OK(merged);
  ASSERT_EQ(pipeline.records().size(), 1u);
  EXPECT_TRUE(pipeline.records()[0].changed);

  const ir::Graph& g = merged->graph();
  ir::Node* m = g.FindNode("q_k_v_merged");
  ASSERT_NE(m, nullptr) << ir::PrintGraph(g);
  EXPECT_EQ(m->op(), ir::OpKind::kCallModule);
  EXPECT_EQ(m->target(), "attn.q_k_v_merged");
  EXPECT_EQ(m->scope().path(), "attn.q_k_v_merged");
  EXPECT_EQ(m->scope().type(), kLinear);
  ASSERT_EQ(m->meta().outputs.size(), 1u);
  EXPECT_EQ(m->meta().outputs[0].shape, (std::vector<int64_t>{2, 5, 18}));
  ASSERT_EQ(m->users().size(), 1u);
  EXPECT_EQ(m->users()[0]->target(), "aten::split_with_sizes");
  for (const char* name : {"q", "k", "v"}) {
    ir::Node* n = g.FindNode(name);
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(n->target(), "getitem") << name;
    EXPECT_EQ(n->scope().path(), "attn") << name;
    EXPECT_NE(FindMark(*n, MergeLinears::kName), nullptr);
  }
  // o reads q, not x: left alone.
  EXPECT_EQ(g.FindNode("o")->op(), ir::OpKind::kCallModule);
  EXPECT_EQ(GetTransformedNodes(g, MergeLinears::kName).size(), 5u);

  // The merged module: weight [18, 8], a bias with zeros for k.
  auto weight = merged->GetTensor("attn.q_k_v_merged.weight");
  auto bias = merged->GetTensor("attn.q_k_v_merged.bias");
  ASSERT_TRUE(weight.ok() && bias.ok());
  EXPECT_EQ(weight->sizes(), (std::vector<int64_t>{18, 8}));
  EXPECT_TRUE(at::equal(bias->narrow(0, 8, 4), at::zeros({4})));

  // The user's module is untouched.
  EXPECT_EQ(original.graph().FindNode("q")->op(), ir::OpKind::kCallModule);
  EXPECT_FALSE(original.GetTensor("attn.q_k_v_merged.weight").ok());
}

TEST(MergeLinearsTest, SameNumbersOnRandomInputs) {
  runtime::GraphModule original = MakeQkv();
  MergeLinears pass;
  auto copy = original.Clone();
  ASSERT_OK(copy);
  ASSERT_TRUE(pass.Run(*copy).value());
  for (uint64_t seed : {11, 12, 13}) {
    std::vector<c10::IValue> in = {Rand({2, 5, 8}, seed)};
    auto before = RunGraph(original, in);
    auto after = RunGraph(*copy, in);
    ASSERT_OK(before);
    ASSERT_OK(after);
    // Stated tolerance: 1e-5 relative to the largest output (fp32).
    EXPECT_LT(MaxRelError(*after, *before), 1e-5);
  }
}

TEST(MergeLinearsTest, ReverseRestoresBitForBit) {
  runtime::GraphModule original = MakeQkv();
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  auto merged = pipeline.Apply(original);
  ASSERT_OK(merged);
  auto reversed = pipeline.Reverse(*merged);
  ASSERT_OK(reversed);
  EXPECT_TRUE(*reversed);
  EXPECT_EQ(DiffGraphModules(*merged, original), "");
  // Nothing left to undo.
  MergeLinears pass;
  EXPECT_FALSE(pass.Reverse(*merged).value());
}

TEST(MergeLinearsTest, KeepsReducedPrecisionDtype) {
  runtime::GraphModule original = MakeQkv(at::kBFloat16);
  MergeLinears pass;
  auto copy = original.Clone();
  ASSERT_TRUE(pass.Run(*copy).value());
  EXPECT_EQ(copy->GetTensor("attn.q_k_v_merged.weight")->scalar_type(),
            at::kBFloat16);
  EXPECT_EQ(copy->GetTensor("attn.q_k_v_merged.bias")->scalar_type(),
            at::kBFloat16);
  std::vector<c10::IValue> in = {Rand({2, 5, 8}, 5, at::kBFloat16)};
  auto before = RunGraph(original, in);
  auto after = RunGraph(*copy, in);
  ASSERT_TRUE(before.ok() && after.ok());
  // bf16 GEMMs with different blocking: a few bf16 ulps.
  EXPECT_LT(MaxRelError(*after, *before), 2e-2);
}

TEST(MergeLinearsTest, NoBiasWhenNoLayerHasOne) {
  torch::jit::Module root = MakeRoot();
  root.register_module("a", MakeLinear(root, 4, 3, false, 1));
  root.register_module("b", MakeLinear(root, 4, 5, false, 2));
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %a = call_module[a](%x)
  %b = call_module[b](%x)
  %output = output[output]((%a, %b))
})");
  auto copy = gm.Clone();
  ASSERT_TRUE(MergeLinears().Run(*copy).value());
  auto merged = copy->GetSubmodule("a_b_merged");
  ASSERT_OK(merged);
  EXPECT_TRUE(merged->attr("bias").isNone());
  std::vector<c10::IValue> in = {Rand({3, 4}, 7)};
  EXPECT_LT(MaxRelError(RunGraph(*copy, in).value(), RunGraph(gm, in).value()),
            1e-5);
}

TEST(MergeLinearsTest, MergesHuggingFaceConv1D) {
  torch::jit::Module root = MakeRoot();
  root.register_module("c_q", testing::MakeConv1D(root, 6, 6, 1));
  root.register_module("c_kv", testing::MakeConv1D(root, 6, 12, 2));
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %c_q = call_module[c_q](%x)
  %c_kv = call_module[c_kv](%x)
  %output = output[output]((%c_q, %c_kv))
})");
  auto copy = gm.Clone();
  ASSERT_TRUE(MergeLinears().Run(*copy).value());
  auto merged = copy->GetSubmodule("c_q_c_kv_merged");
  ASSERT_OK(merged);
  EXPECT_EQ(ModuleType(*merged), "transformers.pytorch_utils.Conv1D");
  EXPECT_EQ(merged->attr("weight").toTensor().sizes(),
            (std::vector<int64_t>{6, 18}));
  std::vector<c10::IValue> in = {Rand({2, 3, 6}, 8)};
  EXPECT_LT(MaxRelError(RunGraph(*copy, in).value(), RunGraph(gm, in).value()),
            1e-5);
  ASSERT_TRUE(MergeLinears().Reverse(*copy).value());
  EXPECT_EQ(DiffGraphModules(*copy, gm), "");
}

TEST(MergeLinearsTest, DoesNotFireWithoutParallelSingleUseLayers) {
  torch::jit::Module root = MakeRoot();
  root.register_module("a", MakeLinear(root, 4, 4, true, 1));
  root.register_module("b", MakeLinear(root, 4, 4, true, 2));
  root.register_module("c", MakeLinear(root, 5, 4, true, 3));
  root.register_module("d", MakeLinear(root, 4, 4, true, 4, at::kDouble));
  // a is called twice; b and a read different values; c has other
  // in_features; d another dtype.
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %y = placeholder[y]()
  %z = placeholder[z]()
  %a = call_module[a](%x)
  %b = call_module[b](%x)
  %a_1 = call_module[a](%b)
  %c = call_module[c](%z)
  %d = call_module[d](%y)
  %b_1 = call_function[aten::relu](%y)
  %output = output[output]((%a, %a_1, %c, %d, %b_1))
})");
  auto copy = gm.Clone();
  auto changed = MergeLinears().Run(*copy);
  ASSERT_OK(changed);
  EXPECT_FALSE(*changed);
  EXPECT_EQ(DiffGraphModules(*copy, gm), "");
}

}  // namespace
}  // namespace tracecut::transforms
