#include "transforms/fold_constants.h"

#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/eliminate_dead_code.h"
#include "transforms/fusion_math.h"
#include "transforms/test_util.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

using testing::MakeGraphModule;
using testing::MakeRoot;
using testing::Rand;
using testing::RunGraph;

constexpr char kGraph[] = R"(graph {
  %x = placeholder[x]()
  %w = get_attr[w]()
  %t = call_function[aten::t](%w)
  %mul = call_function[aten::mul.Scalar](%t, 2.0)
  %mm = call_function[aten::mm](%x, %mul)
  %scale = get_attr[scale]()
  %neg = call_function[aten::neg](%scale)
  %add = call_function[aten::add.Tensor](%mm, %neg, 1)
  %zeros = call_function[aten::zeros_like](%scale, None, None, None, None, None)
  %add_ = call_function[aten::add_.Tensor](%zeros, %scale, 1)
  %rand = call_function[aten::rand_like](%scale, None, None, None, None, None)
  %output = output[output]((%add, %add_, %rand))
})";

runtime::GraphModule Make() {
  torch::jit::Module root = MakeRoot();
  root.register_parameter("w", Rand({4, 3}, 1), false);
  root.register_buffer("scale", Rand({4}, 2));
  return MakeGraphModule(root, kGraph);
}

TEST(FoldConstantsTest, FoldsPureChainsOnly) {
  runtime::GraphModule original = Make();
  auto gm = original.Clone();
  auto changed = FoldConstants().Run(*gm);
  ASSERT_OK(changed);
  ASSERT_TRUE(*changed);
  const ir::Graph& g = gm->graph();
  for (const char* folded : {"t", "mul", "neg"}) {
    ir::Node* n = g.FindNode(folded);
    ASSERT_NE(n, nullptr) << folded;
    EXPECT_EQ(n->op(), ir::OpKind::kGetAttr) << folded << "\n"
                                             << ir::PrintGraph(g);
  }
  // zeros_like feeds an in-place add_; rand_like is random.
  EXPECT_EQ(g.FindNode("zeros")->op(), ir::OpKind::kCallFunction);
  EXPECT_EQ(g.FindNode("rand")->op(), ir::OpKind::kCallFunction);
  EXPECT_EQ(g.FindNode("mm")->op(), ir::OpKind::kCallFunction);
  // The folded transpose does not alias the parameter.
  auto folded = gm->GetTensor("_folded_constant_t");
  ASSERT_OK(folded);
  EXPECT_FALSE(folded->storage().is_alias_of(gm->GetTensor("w")->storage()));

  ASSERT_TRUE(EliminateDeadCode().Run(*gm).value());
  EXPECT_EQ(g.FindNode("w"), nullptr);

  std::vector<c10::IValue> in = {Rand({2, 3}, 3)};
  auto before = RunGraph(original, in);
  auto after = RunGraph(*gm, in);
  ASSERT_TRUE(before.ok() && after.ok()) << after.status();
  // Same operators on the same values, once: bit for bit.
  EXPECT_TRUE(fusion_math::BitwiseEqual((*after)[0], (*before)[0]));
  EXPECT_TRUE(fusion_math::BitwiseEqual((*after)[1], (*before)[1]));
  // Running twice does not accumulate into a folded buffer.
  auto again = RunGraph(*gm, in);
  EXPECT_TRUE(fusion_math::BitwiseEqual((*again)[1], (*before)[1]));
}

TEST(FoldConstantsTest, CanLeaveParametersAlone) {
  auto gm = Make().Clone();
  FoldConstantsOptions options;
  options.fold_parameters = false;
  ASSERT_TRUE(FoldConstants(options).Run(*gm).value());
  EXPECT_EQ(gm->graph().FindNode("t")->op(), ir::OpKind::kCallFunction);
  EXPECT_EQ(gm->graph().FindNode("neg")->op(), ir::OpKind::kGetAttr);
}

TEST(FoldConstantsTest, DoesNotFireWithoutConstantOperands) {
  runtime::GraphModule gm = MakeGraphModule(MakeRoot(), R"(graph {
  %x = placeholder[x]()
  %relu = call_function[aten::relu](%x)
  %output = output[output](%relu)
})");
  EXPECT_FALSE(FoldConstants().Run(gm).value());
}

TEST(FoldConstantsTest, RespectsSizeLimit) {
  auto gm = Make().Clone();
  FoldConstantsOptions options;
  options.max_bytes = 8;
  FoldConstants(options).Run(*gm).value();
  EXPECT_EQ(gm->graph().FindNode("t")->op(), ir::OpKind::kCallFunction);
}

}  // namespace
}  // namespace tracecut::transforms
