#include "transforms/lint_and_recompile.h"

#include "gtest/gtest.h"
#include "transforms/fusion_math.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

TEST(LintAndRecompileTest, ForwardRunsTheCurrentGraph) {
  torch::jit::Module root = testing::MakeRoot();
  root.register_module("fc", testing::MakeLinear(root, 3, 3, true, 1));
  root.define(R"(
def forward(self, x: Tensor) -> Tensor:
    return x
)");
  runtime::GraphModule gm = testing::MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[fc](%x)
  %relu = call_function[aten::relu](%fc)
  %output = output[output](%relu)
})");
  auto before = gm.graph().Clone();
  auto result = LintAndRecompile().Run(gm);
  ASSERT_OK(result);
  EXPECT_FALSE(*result);
  EXPECT_TRUE(ir::StructurallyEqual(gm.graph(), *before));
  torch::Tensor x = testing::Rand({2, 3}, 5);
  torch::Tensor y = gm.module().forward({x}).toTensor();
  auto expected = testing::RunGraph(gm, {x});
  ASSERT_OK(expected);
  EXPECT_TRUE(fusion_math::BitwiseEqual(y, (*expected)[0]));
  // The old module still runs its own forward (identity).
  EXPECT_TRUE(at::equal(root.forward({x}).toTensor(), x));
}

TEST(LintAndRecompileTest, NamesTheNodeWithADanglingTarget) {
  torch::jit::Module root = testing::MakeRoot();
  runtime::GraphModule gm = testing::MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[missing.fc](%x)
  %output = output[output](%fc)
})");
  auto result = LintAndRecompile().Run(gm);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("%fc"), std::string::npos)
      << result.status();
  EXPECT_NE(result.status().message().find("missing.fc"), std::string::npos);
}

}  // namespace
}  // namespace tracecut::transforms
