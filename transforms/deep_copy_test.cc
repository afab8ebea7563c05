#include "transforms/deep_copy.h"

#include "gtest/gtest.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

TEST(DeepCopyTest, DetachesFromTheInput) {
  torch::jit::Module root = testing::MakeRoot();
  root.register_module("fc", testing::MakeLinear(root, 3, 3, true, 1));
  runtime::GraphModule gm = testing::MakeGraphModule(root, R"(graph {
  %x = placeholder[x]()
  %fc = call_module[fc](%x)
  %output = output[output](%fc)
})");
  const ir::Graph* old_graph = &gm.graph();
  std::unique_ptr<ir::Graph> before = gm.graph().Clone();
  torch::Tensor w = gm.GetTensor("fc.weight").value();
  DeepCopy pass;
  auto changed = pass.Run(gm);
  ASSERT_OK(changed);
  EXPECT_FALSE(*changed);  // Same graph, same numbers.
  EXPECT_NE(&gm.graph(), old_graph);
  EXPECT_TRUE(ir::StructurallyEqual(gm.graph(), *before));
  torch::Tensor w2 = gm.GetTensor("fc.weight").value();
  EXPECT_FALSE(w2.is_same(w));
  EXPECT_TRUE(at::equal(w2, w));
  w2.add_(1);
  EXPECT_FALSE(at::equal(w2, w));  // The input's tensor is unaffected.
  EXPECT_FALSE(pass.Reverse(gm).value());
}

}  // namespace
}  // namespace tracecut::transforms
