#include "transforms/lint_and_recompile.h"

#include "gtest/gtest.h"
#include "transforms/test_util.h"

namespace tracecut::transforms {
namespace {

TEST(LintAndRecompileTest, PassesAWellFormedModule) {
  torch::jit::Module root = testing::MakeRoot();
  root.register_module("fc", testing::MakeLinear(root, 3, 3, true, 1));
  runtime::GraphModule gm = testing::MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[fc](%x)
  %output = output[output](%fc)
})");
  auto result = LintAndRecompile().Run(gm);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(*result);
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
