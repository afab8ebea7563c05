#include "runtime/device_placement.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>

#include "util/testing/status_matchers.h"

namespace tracecut::runtime {
namespace {

using ::testing::HasSubstr;
using util::testing::StatusIs;

// root.a (Linear-like: weight, bias), root.b (weight tied to a.weight),
// root.scale (a tensor attribute of the root).
torch::jit::Module Model() {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  auto leaf = [&](const char* name) {
    return torch::jit::Module(name, cu, /*shouldMangle=*/true);
  };
  torch::jit::Module root = leaf("Root");
  torch::jit::Module a = leaf("A");
  torch::jit::Module b = leaf("B");
  at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3});
  a.register_parameter("weight", w, false);
  a.register_parameter("bias", at::ones({2}), false);
  b.register_parameter("weight", w, false);
  root.register_module("a", a);
  root.register_module("b", b);
  root.register_buffer("scale", at::full({1}, 2.0));
  return root;
}

at::Tensor Attr(const torch::jit::Module& m, const std::string& module,
                const std::string& name) {
  return (module.empty() ? m : m.attr(module).toModule()).attr(name).toTensor();
}

// The meta device stands in for a GPU here: it exists on every machine.
TEST(DevicePlacementTest, PlacesTiedTensorsOnceAndReturnsTheOriginals) {
  torch::jit::Module root = Model();
  const at::Tensor w = Attr(root, "a", "weight");
  const at::Tensor bias = Attr(root, "a", "bias");
  const at::Tensor scale = Attr(root, "", "scale");
  const c10::Device meta(c10::kMeta);
  ASSERT_OK_AND_ASSIGN(DevicePlacement placed,
                       DevicePlacement::Place(root, {"a", "b.weight"}, meta));
  EXPECT_EQ(placed.tensors(), 2);  // a.weight (= b.weight) and a.bias.
  EXPECT_TRUE(Attr(root, "a", "weight").is_meta());
  EXPECT_TRUE(Attr(root, "a", "bias").is_meta());
  // Tied: one device tensor for both attributes.
  EXPECT_TRUE(Attr(root, "a", "weight").is_same(Attr(root, "b", "weight")));
  // Not asked for: stays.
  EXPECT_TRUE(Attr(root, "", "scale").is_same(scale));

  ASSERT_OK(placed.Return());
  EXPECT_TRUE(Attr(root, "a", "weight").is_same(w));
  EXPECT_TRUE(Attr(root, "b", "weight").is_same(w));
  EXPECT_TRUE(Attr(root, "a", "bias").is_same(bias));
  EXPECT_OK(placed.Return());  // Idempotent.
}

TEST(DevicePlacementTest, CpuMovesNothing) {
  torch::jit::Module root = Model();
  const at::Tensor w = Attr(root, "a", "weight");
  ASSERT_OK_AND_ASSIGN(
      DevicePlacement placed,
      DevicePlacement::Place(root, {""}, c10::Device(c10::kCPU)));
  EXPECT_EQ(placed.tensors(), 0);
  EXPECT_TRUE(Attr(root, "a", "weight").is_same(w));
  EXPECT_OK(placed.Return());
}

// A tensor a modifier replaced on the device is not the original any more:
// Return copies it to the host (out of a meta tensor that copy fails, which
// shows it is attempted and reported, not silently dropped).
TEST(DevicePlacementTest, ReplacedTensorsAreCopiedBack) {
  torch::jit::Module root = Model();
  const c10::Device meta(c10::kMeta);
  ASSERT_OK_AND_ASSIGN(DevicePlacement placed,
                       DevicePlacement::Place(root, {""}, meta));
  EXPECT_EQ(placed.tensors(), 3);
  root.attr("a").toModule().setattr("bias",
                                    at::zeros({2}, at::TensorOptions(meta)));
  EXPECT_THAT(placed.Return(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       HasSubstr("returning tensors to the host: Cannot copy "
                                 "out of meta tensor")));
}

TEST(DevicePlacementTest, BadPathsAreErrors) {
  torch::jit::Module root = Model();
  const c10::Device meta(c10::kMeta);
  EXPECT_THAT(
      DevicePlacement::Place(root, {"a.nope"}, meta).status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("no attribute 'nope'")));
}

}  // namespace
}  // namespace tracecut::runtime
