// Lean exports (runtime/prune_unused.h): what a lowered module keeps of a
// model whose graph no longer uses all of it, and that the GraphModule itself
// never changes.

#include "runtime/prune_unused.h"

#include <torch/script.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "runtime/test_util.h"

namespace tracecut::runtime {
namespace {

using ir::Argument;
using ir::Node;
using testing::Det;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using testing::MakeLinear;
using ::testing::UnorderedElementsAre;

Argument R(Node* n) { return Argument::Ref(n); }

std::shared_ptr<torch::jit::CompilationUnit> Cu() {
  static auto* cu = new std::shared_ptr<torch::jit::CompilationUnit>(
      std::make_shared<torch::jit::CompilationUnit>());
  return *cu;
}

// A block as a fusion pass leaves it: conv and bn, which the block's own
// forward calls, and `fused`, which replaced them in the graph; a buffer the
// graph reads and one only the old forward reads; an int attribute.
torch::jit::Module MakeBlock(uint64_t seed) {
  torch::jit::Module m("Block", Cu(), /*shouldMangle=*/true);
  m.register_module("conv", MakeLinear(4, 4, seed));
  m.register_module("bn", MakeLinear(4, 4, seed + 2));
  m.register_module("fused", MakeLinear(4, 4, seed + 4));
  m.register_buffer("used", Det({4}, seed + 6));
  m.register_buffer("unused", Det({4}, seed + 7));
  m.register_attribute("depth", c10::IntType::get(), 2);
  m.define(R"(
def forward(self, x):
    return self.bn.forward(self.conv.forward(x)) * self.used + self.unused
)");
  return m;
}

// Net: blocks a and b, an unused Linear `dead`, buffers scale (read by the
// graph), stale (read by nothing now) and offset (read by `_shift`, which
// the exported method `shifted` calls). `_impl` is a helper of forward.
torch::jit::Module MakeNet(const torch::jit::Module& a,
                           const torch::jit::Module& b) {
  torch::jit::Module root("Net", Cu(), /*shouldMangle=*/true);
  root.register_module("a", a);
  root.register_module("b", b);
  root.register_module("dead", MakeLinear(4, 4, 40));
  root.register_buffer("scale", Det({4}, 41));
  root.register_buffer("stale", Det({4}, 42));
  root.register_buffer("offset", Det({4}, 43));
  root.define(R"(
def forward(self, x):
    return self._impl(x) * self.stale

def _impl(self, x):
    return self.dead.forward(self.b.forward(self.a.forward(x)))

def shifted(self, x):
    return self._shift(self.forward(x))

def _shift(self, x):
    return x + self.offset
)");
  return root;
}

// x -> a.fused * a.used -> b.conv -> b.bn -> * scale.
std::unique_ptr<ir::Graph> FusedGraph() {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* fused = *g->CallModule("a.fused", {R(x)});
  Node* used = *g->GetAttr("a.used");
  Node* mul = *g->CallFunction("aten::mul.Tensor", {R(fused), R(used)});
  Node* conv = *g->CallModule("b.conv", {R(mul)});
  Node* bn = *g->CallModule("b.bn", {R(conv)});
  Node* scale = *g->GetAttr("scale");
  Node* out = *g->CallFunction("aten::mul.Tensor", {R(bn), R(scale)});
  (void)*g->Output(R(out));
  return g;
}

std::vector<std::string> AttributeNames(const torch::jit::Module& m) {
  std::vector<std::string> names;
  for (size_t i = 0; i < m.type()->numAttributes(); ++i) {
    names.push_back(m.type()->getAttributeName(i));
  }
  return names;
}

std::vector<std::string> MethodNames(const torch::jit::Module& m) {
  std::vector<std::string> names;
  for (const torch::jit::Method& method : m.get_methods()) {
    names.push_back(method.name());
  }
  return names;
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

TEST(PruneUnusedTest, KeepsOnlyWhatTheGraphAndRootMethodsUse) {
  GraphModule gm(MakeNet(MakeBlock(1), MakeBlock(11)), FusedGraph());
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::StatusOr<std::vector<std::string>> removed = PruneUnused(gm, *lowered);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre("a.bn", "a.conv", "a.unused", "b.fused",
                                    "b.unused", "b.used", "dead", "stale"));

  // The root keeps forward, `shifted`, `_shift` and the buffer `_shift`
  // reads; forward's helper `_impl` goes.
  EXPECT_THAT(AttributeNames(*lowered),
              ElementsAre("a", "b", "scale", "offset"));
  EXPECT_THAT(MethodNames(*lowered),
              UnorderedElementsAre("forward", "shifted", "_shift"));
  // Blocks keep what lies on the graph's paths and their int, not methods.
  torch::jit::Module a = lowered->attr("a").toModule();
  EXPECT_THAT(AttributeNames(a), ElementsAre("fused", "used", "depth"));
  EXPECT_THAT(MethodNames(a), IsEmpty());
  EXPECT_EQ(a.attr("depth").toInt(), 2);
  torch::jit::Module b = lowered->attr("b").toModule();
  EXPECT_THAT(AttributeNames(b), ElementsAre("conv", "bn", "depth"));
  // Called modules keep everything.
  EXPECT_THAT(AttributeNames(a.attr("fused").toModule()),
              ElementsAre("weight", "bias"));
  EXPECT_THAT(MethodNames(a.attr("fused").toModule()), ElementsAre("forward"));

  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  const at::Tensor x = Det({3, 4}, 5);
  const at::Tensor expected = interp->Run({x})->toTensor();
  EXPECT_TRUE(torch::equal(lowered->forward({x}).toTensor(), expected));
  EXPECT_TRUE(torch::equal(lowered->run_method("shifted", x).toTensor(),
                           expected + gm.module().attr("offset").toTensor()));

  // Saved and loaded, it still runs both methods.
  const std::string path = TempPath("pruned.pt");
  ASSERT_TRUE(SaveModuleAtomically(*lowered, path).ok());
  torch::jit::Module loaded = torch::jit::load(path);
  EXPECT_TRUE(torch::equal(loaded.forward({x}).toTensor(), expected));
  EXPECT_FALSE(loaded.hasattr("dead"));
  EXPECT_FALSE(loaded.attr("a").toModule().hasattr("bn"));
}

TEST(PruneUnusedTest, GraphModuleKeepsEverything) {
  GraphModule gm(MakeNet(MakeBlock(1), MakeBlock(11)), FusedGraph());
  const std::vector<std::string> before = AttributeNames(gm.module());
  const std::string forward_before =
      gm.module().get_method("forward").graph()->toString();
  LoweringOptions options;
  options.prune_unused = true;
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm, options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_FALSE(lowered->hasattr("dead"));

  EXPECT_EQ(AttributeNames(gm.module()), before);
  torch::jit::Module a = gm.module().attr("a").toModule();
  EXPECT_THAT(AttributeNames(a),
              ElementsAre("conv", "bn", "fused", "used", "unused", "depth"));
  EXPECT_THAT(MethodNames(a), ElementsAre("forward"));
  EXPECT_EQ(gm.module().get_method("forward").graph()->toString(),
            forward_before);
  // The original still runs its own forward, through conv and bn.
  const at::Tensor x = Det({3, 4}, 6);
  EXPECT_EQ(gm.module().forward({x}).toTensor().sizes(), x.sizes());
  // Tensors are shared, not copied.
  EXPECT_TRUE(lowered->attr("scale").toTensor().is_same(
      gm.module().attr("scale").toTensor()));
  // Lowering again (pruned or not) still sees the whole module.
  absl::StatusOr<torch::jit::Module> again = LowerToTorchScript(gm);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->hasattr("dead"));
  EXPECT_TRUE(LowerToTorchScript(gm, options).ok());
}

// Blocks sharing one ClassType lose only what neither of them needs.
TEST(PruneUnusedTest, SharedTypesKeepTheUnion) {
  torch::jit::Module a = MakeBlock(1);
  torch::jit::Module b = a.deepcopy();
  ASSERT_EQ(a.type(), b.type());
  GraphModule gm(MakeNet(a, b), FusedGraph());
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::StatusOr<std::vector<std::string>> removed = PruneUnused(gm, *lowered);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre("a.unused", "b.unused", "dead", "stale"));
  EXPECT_THAT(AttributeNames(lowered->attr("b").toModule()),
              ElementsAre("conv", "bn", "fused", "used", "depth"));
  const at::Tensor x = Det({3, 4}, 7);
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  EXPECT_TRUE(torch::equal(lowered->forward({x}).toTensor(),
                           interp->Run({x})->toTensor()));
}

// A type that a called (whole) module has is not pruned in its other
// instances: they share its forward, which reads everything.
TEST(PruneUnusedTest, TypeOfACalledModuleIsNotPruned) {
  torch::jit::Module a = MakeBlock(1);
  torch::jit::Module b = a.deepcopy();
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* fused = *g->CallModule("a.fused", {R(x)});
  Node* block = *g->CallModule("b", {R(fused)});
  (void)*g->Output(R(block));
  GraphModule gm(MakeNet(a, b), std::move(g));
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::StatusOr<std::vector<std::string>> removed = PruneUnused(gm, *lowered);
  ASSERT_TRUE(removed.ok()) << removed.status();
  // `offset` stays: `shifted` reads it.
  EXPECT_THAT(*removed, ElementsAre("dead", "scale", "stale"));
  EXPECT_THAT(MethodNames(lowered->attr("a").toModule()),
              ElementsAre("forward"));
}

// A get_attr of a module keeps its whole subtree (a call_method may run any
// of its methods).
TEST(PruneUnusedTest, GetAttrOfAModuleKeepsItWhole) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* a = *g->GetAttr("a");
  Node* call = *g->CallMethod("forward", {R(a), R(x)});
  (void)*g->Output(R(call));
  GraphModule gm(MakeNet(MakeBlock(1), MakeBlock(11)), std::move(g));
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::StatusOr<std::vector<std::string>> removed = PruneUnused(gm, *lowered);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ElementsAre("b", "dead", "scale", "stale"));
  const at::Tensor in = Det({3, 4}, 8);
  EXPECT_TRUE(
      torch::equal(lowered->forward({in}).toTensor(),
                   gm.module().attr("a").toModule().forward({in}).toTensor()));
}

}  // namespace
}  // namespace tracecut::runtime
