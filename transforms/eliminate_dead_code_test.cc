#include "transforms/eliminate_dead_code.h"

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/purity.h"
#include "transforms/test_util.h"

namespace tracecut::transforms {
namespace {

using testing::ExpectNoRewrite;
using testing::ExpectRewrite;
using testing::MakeLinear;
using testing::MakeRoot;

TEST(EliminateDeadCodeTest, ErasesDeadChainsKeepsEffects) {
  torch::jit::Module root = MakeRoot();
  root.register_module("fc", MakeLinear(root, 3, 3, true, 1));
  root.register_buffer("w", torch::ones({3, 3}));
  constexpr char kBefore[] = R"(graph {
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
})";
  // Unused placeholders (the signature), in-place and random ops stay.
  constexpr char kAfter[] = R"(graph {
  %x = placeholder[x]()
  %unused = placeholder[unused]()
  %add_ = call_function[aten::add_.Tensor](%x, %x, 1)
  %rand = call_function[aten::rand_like](%x, None, None, None, None, None)
  %relu = call_function[aten::relu](%x)
  %output = output[output](%relu)
})";
  EXPECT_TRUE(ExpectRewrite(root, kBefore, EliminateDeadCode(), kAfter));
  // Nothing left to do.
  EXPECT_TRUE(ExpectNoRewrite(root, kAfter, EliminateDeadCode()));
}

TEST(EliminateDeadCodeTest, CanKeepModuleCalls) {
  torch::jit::Module root = MakeRoot();
  root.register_module("fc", MakeLinear(root, 3, 3, true, 1));
  EXPECT_TRUE(ExpectNoRewrite(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[fc](%x)
  %output = output[output](%x)
})",
                              EliminateDeadCode(/*modules_are_pure=*/false)));
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
