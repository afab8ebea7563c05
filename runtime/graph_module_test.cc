#include "runtime/graph_module.h"

#include <torch/script.h>

#include <memory>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "runtime/test_util.h"

namespace tracecut::runtime {
namespace {

using testing::Det;
using ::testing::HasSubstr;
using testing::MakeLinear;
using testing::MakeMlp;

GraphModule MakeGm(torch::jit::Module m) {
  auto g = std::make_unique<ir::Graph>();
  ir::Node* x = *g->Placeholder("x");
  ir::Node* r = *g->CallFunction("aten::relu", {ir::Argument::Ref(x)});
  (void)*g->Output(ir::Argument::Ref(r));
  return GraphModule(std::move(m), std::move(g));
}

TEST(GraphModuleCloneTest, CopiesEveryTensorAndTheGraph) {
  GraphModule gm = MakeGm(MakeMlp());
  gm.mutable_extra_files()["config.json"] = "{}";
  absl::StatusOr<GraphModule> copy = gm.Clone();
  ASSERT_TRUE(copy.ok()) << copy.status();

  auto orig_params = gm.module().named_parameters();
  auto copy_params = copy->module().named_parameters();
  ASSERT_EQ(orig_params.size(), copy_params.size());
  auto a = orig_params.begin();
  auto b = copy_params.begin();
  for (; a != orig_params.end(); ++a, ++b) {
    EXPECT_EQ((*a).name, (*b).name);
    EXPECT_NE((*a).value.data_ptr(), (*b).value.data_ptr()) << (*a).name;
    EXPECT_TRUE(torch::equal((*a).value, (*b).value)) << (*a).name;
  }
  auto orig_bufs = gm.module().named_buffers();
  auto copy_bufs = copy->module().named_buffers();
  ASSERT_EQ(orig_bufs.size(), 1u);
  ASSERT_EQ(copy_bufs.size(), 1u);
  EXPECT_NE((*orig_bufs.begin()).value.data_ptr(),
            (*copy_bufs.begin()).value.data_ptr());

  // Mutating the copy in place leaves the original alone.
  at::Tensor before = gm.GetTensor("fc1.weight")->clone();
  copy->GetTensor("fc1.weight")->add_(1.0);
  copy->GetTensor("scale")->zero_();
  EXPECT_TRUE(torch::equal(*gm.GetTensor("fc1.weight"), before));
  EXPECT_FALSE(torch::equal(*gm.GetTensor("scale"), *copy->GetTensor("scale")));

  EXPECT_NE(&copy->graph(), &gm.graph());
  EXPECT_TRUE(ir::StructurallyEqual(copy->graph(), gm.graph()));
  EXPECT_EQ(copy->extra_files().at("config.json"), "{}");
  EXPECT_NE(copy->module().type(), gm.module().type());
  EXPECT_FALSE(copy->module()._ivalue().get() == gm.module()._ivalue().get());
}

TEST(GraphModuleCloneTest, BothStillRun) {
  GraphModule gm = MakeGm(MakeMlp());
  absl::StatusOr<GraphModule> copy = gm.Clone();
  ASSERT_TRUE(copy.ok()) << copy.status();
  at::Tensor x = Det({3, 4}, 11);
  at::Tensor y0 = gm.module().forward({x}).toTensor();
  at::Tensor y1 = copy->module().forward({x}).toTensor();
  EXPECT_TRUE(torch::equal(y0, y1));
  copy->GetTensor("fc3.bias")->add_(1.0);
  EXPECT_TRUE(torch::equal(gm.module().forward({x}).toTensor(), y0));
  EXPECT_FALSE(torch::equal(copy->module().forward({x}).toTensor(), y0));
}

TEST(GraphModuleCloneTest, TiedWeightsStayTiedAndGradFlagsSurvive) {
  torch::jit::Module m = MakeMlp();
  at::Tensor w = m.attr("fc1").toModule().attr("weight").toTensor();
  w.requires_grad_(true);
  m.attr("fc2").toModule().setattr("weight", w);
  GraphModule gm = MakeGm(m);
  absl::StatusOr<GraphModule> copy = gm.Clone();
  ASSERT_TRUE(copy.ok()) << copy.status();
  at::Tensor w1 = *copy->GetTensor("fc1.weight");
  at::Tensor w2 = *copy->GetTensor("fc2.weight");
  EXPECT_TRUE(w1.is_same(w2));
  EXPECT_FALSE(w1.is_same(w));
  EXPECT_TRUE(w1.requires_grad());
  EXPECT_TRUE(w1.is_leaf());
  EXPECT_FALSE(copy->GetTensor("fc1.bias")->requires_grad());
}

// The .pt2 importer ties a module reading another's weight through a
// detached alias (same storage, another tensor): the copies stay tied.
TEST(GraphModuleCloneTest, AliasesOfOneStorageStayTied) {
  torch::jit::Module m = MakeMlp();
  at::Tensor w = m.attr("fc1").toModule().attr("weight").toTensor();
  m.attr("fc2").toModule().setattr("weight", w.detach());
  GraphModule gm = MakeGm(m);
  absl::StatusOr<GraphModule> copy = gm.Clone();
  ASSERT_TRUE(copy.ok()) << copy.status();
  at::Tensor w1 = *copy->GetTensor("fc1.weight");
  at::Tensor w2 = *copy->GetTensor("fc2.weight");
  EXPECT_TRUE(w1.is_alias_of(w2));
  EXPECT_FALSE(w1.is_alias_of(w));
  EXPECT_TRUE(at::equal(w1, w));
  // Untied tensors are copied on their own.
  EXPECT_FALSE(copy->GetTensor("fc3.weight")->is_alias_of(w1));
}

TEST(GraphModuleTest, GetTensorByPath) {
  GraphModule gm = MakeGm(MakeMlp());
  absl::StatusOr<at::Tensor> w = gm.GetTensor("fc3.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(gm.GetTensor("scale").ok());
}

TEST(GraphModuleTest, GetTensorErrorsNameThePath) {
  GraphModule gm = MakeGm(MakeMlp());
  absl::Status s = gm.GetTensor("fc1.wieght").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'fc1.wieght'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("module 'fc1' (Linear)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("no attribute 'wieght'"));

  s = gm.GetTensor("fc9.weight").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("module '<root>' (Mlp)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("no attribute 'fc9'"));

  s = gm.GetTensor("scale.x").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'scale' is a Tensor, not a module"));

  s = gm.GetTensor("fc1").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a tensor"));

  EXPECT_EQ(gm.GetTensor("").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(gm.GetTensor("fc1..weight").status().message()),
              HasSubstr("malformed"));
}

TEST(GraphModuleTest, SetTensorReplacesKeepingParameterKind) {
  GraphModule gm = MakeGm(MakeMlp());
  at::Tensor nw = torch::zeros({4, 4});
  ASSERT_TRUE(gm.SetTensor("fc1.weight", nw).ok());
  EXPECT_TRUE(gm.GetTensor("fc1.weight")->is_same(nw));
  bool found = false;
  for (const auto& p : gm.module().named_parameters()) {
    if (p.name == "fc1.weight") found = true;
  }
  EXPECT_TRUE(found);
}

TEST(GraphModuleTest, SetTensorRejectsNonTensorAttributes) {
  torch::jit::Module m = MakeMlp();
  m.register_attribute("n", c10::IntType::get(), 3);
  GraphModule gm = MakeGm(m);
  absl::Status s = gm.SetTensor("n", torch::ones({1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("'n' holds a int, not a tensor"));
  s = gm.SetTensor("fc1", torch::ones({1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = gm.SetTensor("nope.x", torch::ones({1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no attribute 'nope'"));
}

TEST(GraphModuleTest, SetTensorAddsBufferWithoutTouchingSharedTypeSiblings) {
  GraphModule gm = MakeGm(MakeMlp());
  // fc1 and fc2 share one ClassType.
  ASSERT_EQ(gm.GetSubmodule("fc1")->type(), gm.GetSubmodule("fc2")->type());
  at::Tensor x = Det({3, 4}, 11);
  at::Tensor y = gm.module().forward({x}).toTensor();
  at::Tensor fc2_weight = *gm.GetTensor("fc2.weight");

  at::Tensor scale = torch::full({4}, 0.5);
  ASSERT_TRUE(gm.SetTensor("fc1.input_scale", scale).ok());
  EXPECT_TRUE(gm.GetTensor("fc1.input_scale")->is_same(scale));
  EXPECT_EQ(gm.GetTensor("fc2.input_scale").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_NE(gm.GetSubmodule("fc1")->type(), gm.GetSubmodule("fc2")->type());
  // Same tensors, still runs, still saves and loads.
  EXPECT_TRUE(gm.GetTensor("fc2.weight")->is_same(fc2_weight));
  EXPECT_TRUE(torch::equal(gm.module().forward({x}).toTensor(), y));
  std::stringstream ss;
  gm.module().save(ss);
  torch::jit::Module loaded = torch::jit::load(ss);
  EXPECT_TRUE(torch::equal(loaded.forward({x}).toTensor(), y));
  EXPECT_TRUE(torch::equal(
      loaded.attr("fc1").toModule().attr("input_scale").toTensor(), scale));

  // A new root attribute (as lifted tensor constants are).
  ASSERT_TRUE(gm.SetTensor("_tensor_constant0", torch::ones({2})).ok());
  EXPECT_TRUE(gm.GetTensor("_tensor_constant0").ok());
}

TEST(GraphModuleTest, GetSubmodule) {
  GraphModule gm = MakeGm(MakeMlp());
  absl::StatusOr<torch::jit::Module> root = gm.GetSubmodule("");
  ASSERT_TRUE(root.ok());
  EXPECT_TRUE(*root == gm.module());
  absl::StatusOr<torch::jit::Module> fc3 = gm.GetSubmodule("fc3");
  ASSERT_TRUE(fc3.ok());
  EXPECT_EQ(fc3->attr("weight").toTensor().size(0), 2);
  absl::Status s = gm.GetSubmodule("fc3.weight").status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a module"));
  EXPECT_EQ(gm.GetSubmodule("x.y").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tracecut::runtime
