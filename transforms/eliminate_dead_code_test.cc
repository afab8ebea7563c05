#include "transforms/eliminate_dead_code.h"

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/purity.h"
#include "transforms/test_util.h"

namespace tracecut::transforms {
namespace {

using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;

TEST(EliminateDeadCodeTest, ErasesDeadChainsKeepsEffects) {
  torch::jit::Module root = MakeRoot();
  root.register_module("fc", MakeLinear(root, 3, 3, true, 1));
  root.register_buffer("w", torch::ones({3, 3}));
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %unused = placeholder[unused]()
  %w = get_attr[w]()
  %t = call_function[aten::t](%w)
  %mm = call_function[aten::mm](%t, %t)
  %fc = call_module[fc](%x)
  %add_ = call_function[aten::add_.Tensor](%x, %x, 1)
  %rand = call_function[aten::rand_like](%x, None, None, None, None, None)
  %relu = call_function[aten::relu](%x)
  %output = output[output](%relu)
})");
  auto changed = EliminateDeadCode().Run(gm);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  const ir::Graph& g = gm.graph();
  for (const char* gone : {"w", "t", "mm", "fc"}) {
    EXPECT_EQ(g.FindNode(gone), nullptr) << gone << "\n" << ir::PrintGraph(g);
  }
  for (const char* kept : {"x", "unused", "add_", "rand", "relu", "output"}) {
    EXPECT_NE(g.FindNode(kept), nullptr) << kept;
  }
  EXPECT_FALSE(EliminateDeadCode().Run(gm).value());
}

TEST(EliminateDeadCodeTest, CanKeepModuleCalls) {
  torch::jit::Module root = MakeRoot();
  root.register_module("fc", MakeLinear(root, 3, 3, true, 1));
  runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[fc](%x)
  %output = output[output](%x)
})");
  EXPECT_FALSE(EliminateDeadCode(/*modules_are_pure=*/false).Run(gm).value());
  EXPECT_NE(gm.graph().FindNode("fc"), nullptr);
}

TEST(PurityTest, Operators) {
  EXPECT_TRUE(IsImpureOperator("aten::add_.Tensor"));
  EXPECT_TRUE(IsImpureOperator("aten::add.out"));
  EXPECT_TRUE(IsImpureOperator("aten::randn"));
  EXPECT_TRUE(IsImpureOperator("aten::dropout"));
  EXPECT_TRUE(IsImpureOperator("prim::RaiseException"));
  EXPECT_FALSE(IsImpureOperator("aten::add.Tensor"));
  EXPECT_FALSE(IsImpureOperator("aten::__and__.Tensor"));
  EXPECT_FALSE(IsImpureOperator("aten::linear"));
}

}  // namespace
}  // namespace tracecut::transforms
