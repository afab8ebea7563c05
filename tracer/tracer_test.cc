// Unit tests of the tracer on small TorchScript modules compiled here
// (Module::define), one behaviour each: scopes, leaves, constants, control
// flow, loops, sequences and errors.

#include "tracer/tracer.h"

#include <torch/script.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace tracecut::tracer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A module of type __torch__.<type> with `source` as its methods.
torch::jit::Module MakeModule(const std::string& type,
                              const std::string& source) {
  torch::jit::Module m(absl::StrCat("__torch__.", type));
  if (!source.empty()) m.define(source);
  return m;
}

torch::jit::Module Linear(int64_t in, int64_t out) {
  torch::jit::Module m("__torch__.torch.nn.modules.linear.Linear");
  m.register_parameter("weight", torch::randn({out, in}), false);
  m.register_parameter("bias", torch::randn({out}), false);
  m.define(R"(
def forward(self, x):
    return torch.linear(x, self.weight, self.bias)
)");
  return m;
}

TraceOptions WithInput(const std::string& name, c10::IValue value) {
  TraceOptions options;
  options.example_inputs[name] = std::move(value);
  return options;
}

std::vector<std::string> Targets(const ir::Graph& g, ir::OpKind op) {
  std::vector<std::string> out;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() == op) out.push_back(n->target());
  }
  return out;
}

const ir::Node* FindTarget(const ir::Graph& g, absl::string_view target) {
  for (const ir::Node* n : g.nodes()) {
    if (n->target() == target) return n;
  }
  return nullptr;
}

void ExpectValid(const ir::Graph& g) {
  absl::Status s = ir::Verify(g);
  EXPECT_TRUE(s.ok()) << s << "\n" << ir::PrintGraph(g);
}

TEST(TracerTest, InlinesSubmodulesWithScopesAndKeepsTorchNnLeaves) {
  torch::jit::Module block = MakeModule("my.Block", "");
  block.register_module("fc", Linear(4, 4));
  block.define(R"(
def forward(self, x):
    return torch.relu(self.fc.forward(x)) + 1.0
)");
  torch::jit::Module root = MakeModule("my.Net", "");
  root.register_module("block", block);
  root.define(R"(
def forward(self, x):
    return self.block.forward(x) * 2.0
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({2, 4})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Graph& g = gm->graph();
  ExpectValid(g);
  EXPECT_THAT(Targets(g, ir::OpKind::kCallModule), ElementsAre("block.fc"));
  EXPECT_THAT(
      Targets(g, ir::OpKind::kCallFunction),
      ElementsAre("aten::relu", "aten::add.Scalar", "aten::mul.Scalar"));

  const ir::Node* relu = FindTarget(g, "aten::relu");
  ASSERT_NE(relu, nullptr);
  ASSERT_EQ(relu->scope().depth(), 2u);
  EXPECT_EQ(relu->scope().stack()[0].path, "");
  EXPECT_EQ(relu->scope().stack()[0].type, "my.Net");
  EXPECT_EQ(relu->scope().path(), "block");
  EXPECT_EQ(relu->scope().type(), "my.Block");
  EXPECT_EQ(relu->name(), "relu");
  ASSERT_EQ(relu->meta().outputs.size(), 1u);
  EXPECT_THAT(relu->meta().outputs[0].shape, ElementsAre(2, 4));

  const ir::Node* fc = FindTarget(g, "block.fc");
  EXPECT_EQ(fc->name(), "block_fc");
  EXPECT_EQ(fc->scope().path(), "block.fc");
  EXPECT_EQ(fc->scope().type(), "torch.nn.modules.linear.Linear");

  const ir::Node* mul = FindTarget(g, "aten::mul.Scalar");
  ASSERT_EQ(mul->scope().depth(), 1u);
  EXPECT_EQ(g.output_node()->args()[0].node(), mul);
}

TEST(TracerTest, LeafPolicyByPredicateAndNone) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("fc", Linear(3, 3));
  root.define("def forward(self, x):\n    return self.fc.forward(x)\n");
  TraceOptions options = WithInput("x", torch::randn({1, 3}));
  options.leaf_policy = LeafPolicy::None();
  absl::StatusOr<runtime::GraphModule> gm = Trace(root, options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_THAT(Targets(gm->graph(), ir::OpKind::kCallFunction),
              ElementsAre("aten::linear"));
  EXPECT_THAT(Targets(gm->graph(), ir::OpKind::kGetAttr),
              ElementsAre("fc.weight", "fc.bias"));

  options.leaf_policy.AddPredicate(
      [](absl::string_view path, absl::string_view) { return path == "fc"; });
  gm = Trace(root, options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_THAT(Targets(gm->graph(), ir::OpKind::kCallModule), ElementsAre("fc"));
}

TEST(TracerTest, GetAttrOncePerPathAndNonTensorAttributesAreConstants) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_parameter("w", torch::ones({3}), false);
  root.register_attribute("scale", c10::IntType::get(), int64_t{3});
  root.register_attribute("flag", c10::BoolType::get(), true);
  root.define(R"(
def forward(self, x):
    y = x * self.w + self.w
    if self.flag:
        y = y * self.scale
    return y
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({3})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Graph& g = gm->graph();
  ExpectValid(g);
  EXPECT_THAT(Targets(g, ir::OpKind::kGetAttr), ElementsAre("w"));
  const ir::Node* scale = FindTarget(g, "aten::mul.Scalar");
  ASSERT_NE(scale, nullptr) << ir::PrintGraph(g);
  EXPECT_EQ(scale->args()[1], ir::Argument::Int(3));
  EXPECT_THAT(g.meta().assumptions, IsEmpty());
}

TEST(TracerTest, TensorConstantsAreLiftedOnTheCloneOnly) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    return x + torch.tensor([1.0, 2.0])
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  // torch.tensor(...) is an operator call, not a constant; add a real one.
  torch::jit::Module root2 = MakeModule("Net2", "");
  root2.register_buffer("b", torch::ones({2}));
  root2.define("def forward(self, x):\n    return x + self.b\n");
  gm = Trace(root2, WithInput("x", torch::randn({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_FALSE(root2.hasattr("_tensor_constant0"));
}

TEST(TracerTest, NeverMutatesTheCallersModule) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_buffer("count", torch::zeros({1}));
  root.define(R"(
def forward(self, x):
    self.count.add_(1.0)
    return x + self.count
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::zeros({1})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_EQ(root.attr("count").toTensor().item<float>(), 0.0f);
  // The in-place update is kept: it is not dead code.
  EXPECT_NE(FindTarget(gm->graph(), "aten::add_.Scalar"), nullptr);
}

// The importer ties weights by giving the reading module a detached alias
// (same storage, its own tensor): the trace's copies keep them one tensor's
// storage, and an expanded one (a deferred weight's stand-in) one element.
TEST(TracerTest, TensorsSharingStorageStayTiedInTheCopy) {
  torch::jit::Module root = MakeModule("Net", "");
  torch::jit::Module head = MakeModule("Head", "");
  const torch::Tensor w = torch::full({1}, 2.0F).expand({3, 4});
  root.register_buffer("w", w);
  head.register_buffer("tied_w", w.detach());
  head.define("def forward(self, x):\n    return x * self.tied_w\n");
  root.register_module("head", head);
  // Writes module state: the trace copies the tensors (NeverMutatesTheCallers
  // Module).
  root.register_buffer("count", torch::zeros({1}));
  root.define(R"(
def forward(self, x):
    self.count.add_(1.0)
    return self.head.forward(x + self.w)
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({3, 4})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  absl::StatusOr<torch::Tensor> a = gm->GetTensor("w");
  absl::StatusOr<torch::Tensor> b = gm->GetTensor("head.tied_w");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->is_alias_of(*b));
  EXPECT_FALSE(a->is_alias_of(w));  // A copy: the caller's is not touched.
  EXPECT_EQ(a->storage().nbytes(), sizeof(float));
  EXPECT_TRUE(torch::equal(*b, w));
}

TEST(TracerTest, ShapeConditionsAreSpecialisedAndRecorded) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    if x.dim() == 3:
        x = x.sum(1)
    if x.size(-1) > 8:
        return x * 2.0
    return x - 1.0
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({2, 5, 4})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Graph& g = gm->graph();
  ExpectValid(g);
  EXPECT_THAT(Targets(g, ir::OpKind::kCallFunction),
              ElementsAre("aten::sum.dim_IntList", "aten::sub.Scalar"));
  ASSERT_EQ(g.meta().assumptions.size(), 2u);
  EXPECT_THAT(g.meta().assumptions[0], HasSubstr("x.dim() == 3"));
  EXPECT_THAT(g.meta().assumptions[0], HasSubstr("took then-branch"));
  EXPECT_THAT(g.meta().assumptions[1], HasSubstr("x.size(-1) > 8"));
  EXPECT_THAT(g.meta().assumptions[1], HasSubstr("took else-branch"));
}

TEST(TracerTest, DataDependentConditionIsAnErrorNamingTheModule) {
  torch::jit::Module gate = MakeModule("Gate", R"(
def forward(self, x):
    if bool(x.max() > 0):
        return x
    return -x
)");
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("gate", gate);
  root.define("def forward(self, x):\n    return self.gate.forward(x) + 1\n");
  TraceOptions options = WithInput("x", torch::randn({4}));
  absl::StatusOr<runtime::GraphModule> gm = Trace(root, options);
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("data-dependent"));
  EXPECT_THAT(gm.status().message(), HasSubstr("module 'gate' (Gate)"));
  EXPECT_THAT(gm.status().message(), HasSubstr("prim::If"));
  EXPECT_THAT(gm.status().message(), HasSubstr("--leaf=gate"));

  options.leaf_policy.AddTypeOrPath("gate");
  gm = Trace(root, options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_THAT(Targets(gm->graph(), ir::OpKind::kCallModule),
              ElementsAre("gate"));
}

TEST(TracerTest, DataDependentConditionInTheRootCannotBeALeaf) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    if bool(x.sum() > 0):
        return x
    return -x
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({4})));
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("root module"));
}

TEST(TracerTest, ConditionsFromSizesThroughScalarOpsStayShapeOnly) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    n = x.size(0) * 2 + int(torch.tensor(x.size(1)))
    if n > 5:
        return x + 1
    return x
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({2, 3})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_EQ(gm->graph().meta().assumptions.size(), 1u);
}

TEST(TracerTest, ItemOfDataIsDataDependent) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    n = int(x.sum())
    for i in range(n):
        x = x + 1
    return x
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({2})));
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("trip count of a loop"));
}

TEST(TracerTest, LoopsWithKnownTripCountsAreUnrolled) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    for i in range(3):
        x = x * 2.0 + i
    for j in range(x.size(0)):
        x = x + 1.0
    return x
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Graph& g = gm->graph();
  ExpectValid(g);
  int muls = 0, adds = 0;
  for (const ir::Node* n : g.nodes()) {
    muls += n->target() == "aten::mul.Scalar";
    adds += absl::StartsWith(n->target(), "aten::add");
  }
  EXPECT_EQ(muls, 3);
  EXPECT_EQ(adds, 5);
  // Only the shape-dependent loop is an assumption.
  ASSERT_EQ(g.meta().assumptions.size(), 1u);
  EXPECT_THAT(g.meta().assumptions[0], HasSubstr("ran 2 iterations"));
}

TEST(TracerTest, WhileLoopOnShapes) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    while x.size(0) < 8:
        x = torch.cat([x, x])
    return x
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({1})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  int cats = 0;
  for (const ir::Node* n : gm->graph().nodes())
    cats += n->target() == "aten::cat";
  EXPECT_EQ(cats, 3);
}

TEST(TracerTest, OptionalNoneInputsAndIsNoneChecks) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x, mask: Optional[Tensor] = None):
    if mask is not None:
        x = x * mask
    return x + 1.0
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_EQ(gm->graph().placeholders().size(), 2u);
  EXPECT_THAT(gm->graph().meta().assumptions,
              ElementsAre("input mask is None"));
  EXPECT_THAT(Targets(gm->graph(), ir::OpKind::kCallFunction),
              ElementsAre("aten::add.Scalar"));

  TraceOptions options = WithInput("x", torch::ones({2}));
  options.example_inputs["mask"] = torch::ones({2});
  gm = Trace(root, options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_THAT(Targets(gm->graph(), ir::OpKind::kCallFunction),
              ElementsAre("aten::mul.Tensor", "aten::add.Scalar"));
  EXPECT_THAT(gm->graph().meta().assumptions, IsEmpty());
}

TEST(TracerTest, NonTensorInputsAreSpecialisedConstants) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x, repeats: int, scale: float = 0.5):
    for i in range(repeats):
        x = x * scale
    return x
)");
  TraceOptions options = WithInput("x", torch::ones({2}));
  options.example_inputs["repeats"] = int64_t{3};
  absl::StatusOr<runtime::GraphModule> gm = Trace(root, options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_EQ(gm->graph().placeholders().size(), 3u);
  EXPECT_THAT(gm->graph().meta().assumptions,
              ElementsAre("input repeats == 3", "input scale == 0.5"));
  int muls = 0;
  for (const ir::Node* n : gm->graph().nodes()) {
    if (n->target() != "aten::mul.Scalar") continue;
    ++muls;
    EXPECT_EQ(n->args()[1], ir::Argument::Double(0.5));
  }
  EXPECT_EQ(muls, 3);
}

TEST(TracerTest, TuplesBuiltInTheGraphAreForwardedOpResultsUseGetitem) {
  torch::jit::Module pair = MakeModule("Pair", R"(
def forward(self, x):
    return x + 1.0, x - 1.0
)");
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("pair", pair);
  root.define(R"(
def forward(self, x):
    a, b = self.pair.forward(x)
    c, d = torch.chunk(a, 2)
    m, i = torch.max(b, 0)
    return c + d + m, i
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({4})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Graph& g = gm->graph();
  ExpectValid(g);
  int getitems = 0;
  for (const ir::Node* n : g.nodes()) {
    if (n->target() != "getitem") continue;
    ++getitems;
    ASSERT_EQ(n->args().size(), 2u);
    EXPECT_TRUE(n->args()[0].is_node());
    EXPECT_EQ(n->args()[1].kind(), ir::Argument::Kind::kInt);
  }
  EXPECT_EQ(getitems, 4);  // chunk -> 2, max -> 2; the pair is forwarded.
  const ir::Argument& out = g.output_node()->args()[0];
  ASSERT_EQ(out.kind(), ir::Argument::Kind::kTuple);
  EXPECT_EQ(out.elements().size(), 2u);
}

TEST(TracerTest, ListsAppendedInTheGraph) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    parts: List[Tensor] = []
    for i in range(3):
        parts.append(x * float(i))
    return torch.cat(parts)
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Node* cat = FindTarget(gm->graph(), "aten::cat");
  ASSERT_NE(cat, nullptr);
  ASSERT_EQ(cat->args()[0].kind(), ir::Argument::Kind::kList);
  EXPECT_EQ(cat->args()[0].elements().size(), 3u);
  EXPECT_THAT(cat->meta().outputs[0].shape, ElementsAre(6));
}

TEST(TracerTest, InPlaceListOperationsOnBuiltListsAreRejected) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    parts: List[Tensor] = [x, x]
    parts.insert(0, x * 2.0)
    return torch.cat(parts)
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({2})));
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("aten::insert.t"));
}

TEST(TracerTest, ScalarTypeArgumentsBecomeDTypes) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    return x.to(7) + torch.zeros([2], dtype=x.dtype)
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Node* to = FindTarget(gm->graph(), "aten::to.dtype");
  ASSERT_NE(to, nullptr) << ir::PrintGraph(gm->graph());
  EXPECT_EQ(to->args()[1], ir::Argument::DType("float64"));
  const ir::Node* zeros = FindTarget(gm->graph(), "aten::zeros");
  ASSERT_NE(zeros, nullptr) << ir::PrintGraph(gm->graph());
  EXPECT_EQ(zeros->args()[1], ir::Argument::DType("float32"));
}

TEST(TracerTest, OtherMethodsAreInlinedInTheModulesScope) {
  torch::jit::Module inner = MakeModule("Inner", R"(
def helper(self, x):
    return torch.sigmoid(x)

def forward(self, x):
    return self.helper(x) * torch.softmax(x, -1)
)");
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("inner", inner);
  root.define("def forward(self, x):\n    return self.inner.forward(x)\n");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({2, 3})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  for (const ir::Node* n : gm->graph().nodes()) {
    if (n->op() != ir::OpKind::kCallFunction) continue;
    EXPECT_EQ(n->scope().path(), "inner") << n->Describe();
    EXPECT_EQ(n->scope().depth(), 2u) << n->Describe();
  }
  EXPECT_NE(FindTarget(gm->graph(), "aten::softmax.int"), nullptr)
      << ir::PrintGraph(gm->graph());
}

TEST(TracerTest, RaisingOnTheExampleInputsIsAnError) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    assert x.dim() == 2, "expected a matrix"
    return x
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::ones({2})));
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("raises"));
  EXPECT_THAT(gm.status().message(), HasSubstr("expected a matrix"));
}

TEST(TracerTest, MissingExampleInputIsAClearError) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, features):
    return features
)");
  absl::StatusOr<runtime::GraphModule> gm = Trace(root, TraceOptions());
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("'features'"));
  EXPECT_THAT(gm.status().message(), HasSubstr("tracecut_inputs.json"));

  gm = Trace(root, WithInput("nope", torch::ones({1})));
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("'nope'"));
}

TEST(TracerTest, HfDummyInputsFromConfig) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_parameter("emb", torch::randn({10, 4}), false);
  root.define(R"(
def forward(self, input_ids, attention_mask, position_ids):
    h = torch.embedding(self.emb, input_ids)
    return h * attention_mask.unsqueeze(-1) + position_ids.unsqueeze(-1)
)");
  TraceOptions options;
  absl::StatusOr<hf::HfConfig> config = hf::HfConfig::Parse(
      R"({"model_type": "llama", "vocab_size": 10, "max_position_embeddings": 8})",
      "config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  options.config = *config;
  absl::StatusOr<ExampleInputs> inputs = ResolveExampleInputs(root, options);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->values.size(), 3u);
  const at::Tensor ids = inputs->values[0].toTensor();
  EXPECT_THAT(ids.sizes().vec(), ElementsAre(2, 8));  // seq capped at 8.
  EXPECT_LT(ids.max().item<int64_t>(), 10);
  EXPECT_TRUE(inputs->values[1].toTensor().eq(1).all().item<bool>());
  EXPECT_EQ(inputs->values[2].toTensor()[1][7].item<int64_t>(), 7);
  // Deterministic.
  absl::StatusOr<ExampleInputs> again = ResolveExampleInputs(root, options);
  EXPECT_TRUE(ids.equal(again->values[0].toTensor()));

  absl::StatusOr<runtime::GraphModule> gm = Trace(root, options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_EQ(gm->graph().meta().extra.at("hf.model_type"),
            ir::Argument::String("llama"));
}

TEST(TracerTest, MethodOtherThanForwardOnALeafIsInlined) {
  torch::jit::Module leaf("__torch__.torch.nn.modules.linear.Linear");
  leaf.register_parameter("weight", torch::randn({2, 2}), false);
  leaf.define(R"(
def scale(self, x):
    return x * 3.0

def forward(self, x):
    return torch.matmul(x, self.weight)
)");
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("lin", leaf);
  root.define(
      "def forward(self, x):\n    return "
      "self.lin.forward(self.lin.scale(x))\n");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_THAT(Targets(gm->graph(), ir::OpKind::kCallModule),
              ElementsAre("lin"));
  const ir::Node* mul = FindTarget(gm->graph(), "aten::mul.Scalar");
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(mul->scope().path(), "lin");
}

TEST(TracerTest, DeterministicText) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("fc", Linear(4, 4));
  root.define(R"(
def forward(self, x):
    y = self.fc.forward(x)
    return torch.relu(y) + torch.relu(y)
)");
  absl::StatusOr<runtime::GraphModule> a =
      Trace(root, WithInput("x", torch::randn({2, 4})));
  absl::StatusOr<runtime::GraphModule> b =
      Trace(root, WithInput("x", torch::randn({2, 4})));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(ir::PrintGraph(a->graph()), ir::PrintGraph(b->graph()));
  EXPECT_NE(FindTarget(a->graph(), "aten::relu"), nullptr);
  std::set<std::string> names;
  for (const ir::Node* n : a->graph().nodes()) names.insert(n->name());
  EXPECT_TRUE(names.count("relu") && names.count("relu_1"));
}

TEST(TracerTest, MetaShadowSharesWeightsAndNeverTouchesTheCaller) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("fc", Linear(4, 3));
  root.register_parameter("scale", torch::randn({3}), false);
  root.define(R"(
def forward(self, x):
    return self.fc.forward(x) * self.scale
)");
  root.eval();  // Training-mode leaves (BatchNorm) write their buffers.
  const at::Tensor weight =
      root.attr("fc").toModule().attr("weight").toTensor();
  const at::Tensor before = weight.clone();
  TraceOptions options = WithInput("x", torch::randn({2, 4}));
  options.shadow = TraceOptions::Shadow::kMeta;
  absl::StatusOr<runtime::GraphModule> gm = Trace(root, options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  absl::StatusOr<at::Tensor> traced = gm->GetTensor("fc.weight");
  ASSERT_TRUE(traced.ok()) << traced.status();
  // The leaf ran on meta twins and got its tensors back.
  EXPECT_TRUE(torch::equal(*traced, before));
  EXPECT_FALSE(traced->is_meta());
  EXPECT_FALSE(root.attr("fc").toModule().attr("weight").toTensor().is_meta());
  EXPECT_EQ(FindTarget(gm->graph(), "fc")->meta().outputs[0].device, "cpu");
  // Replacing a tensor of the trace leaves the caller's alone.
  ASSERT_TRUE(gm->SetTensor("fc.weight", torch::zeros({3, 4})).ok());
  EXPECT_TRUE(torch::equal(root.attr("fc").toModule().attr("weight").toTensor(),
                           before));
}

TEST(TracerTest, GraphsThatWriteModuleStateGetTheirOwnTensors) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_buffer("count", torch::zeros({1}));
  root.define(R"(
def forward(self, x):
    y = x.clone()
    y.add_(1.0)
    self.count.add_(1.0)
    return y + self.count
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::zeros({1})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  absl::StatusOr<at::Tensor> count = gm->GetTensor("count");
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_NE(count->data_ptr(), root.attr("count").toTensor().data_ptr());
}

TEST(TracerTest, InPlaceOnGraphTensorsKeepsWeightsShared) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_parameter("w", torch::randn({2}), false);
  root.define(R"(
def forward(self, x):
    y = x * self.w
    y.add_(1.0)
    return y
)");
  absl::StatusOr<runtime::GraphModule> gm =
      Trace(root, WithInput("x", torch::randn({2})));
  ASSERT_TRUE(gm.ok()) << gm.status();
  absl::StatusOr<at::Tensor> w = gm->GetTensor("w");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->data_ptr(), root.attr("w").toTensor().data_ptr());
}

TEST(TracerTest, ValuesOfDataNeedRealExecution) {
  torch::jit::Module root = MakeModule("Net", R"(
def forward(self, x):
    return x * x.sum().item()
)");
  TraceOptions options = WithInput("x", torch::randn({3}));
  options.shadow = TraceOptions::Shadow::kMeta;
  absl::StatusOr<runtime::GraphModule> meta = Trace(root, options);
  ASSERT_FALSE(meta.ok());
  EXPECT_THAT(meta.status().message(), HasSubstr("item"));
  options.shadow = TraceOptions::Shadow::kAuto;
  absl::StatusOr<runtime::GraphModule> automatic = Trace(root, options);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  options.shadow = TraceOptions::Shadow::kReal;
  absl::StatusOr<runtime::GraphModule> real = Trace(root, options);
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ(ir::PrintGraph(automatic->graph()), ir::PrintGraph(real->graph()));
}

TEST(TracerTest, MetaAndRealShadowGiveTheSameGraph) {
  torch::jit::Module root = MakeModule("Net", "");
  root.register_module("fc", Linear(4, 6));
  root.define(R"(
def forward(self, x):
    h = self.fc.forward(x)
    if h.size(-1) > 4:
        h = h[:, :4]
    mask = torch.ones(h.size(0), h.size(1), device=h.device).triu()
    return torch.embedding(h, torch.zeros([2], dtype=4)) + mask.sum()
)");
  TraceOptions options = WithInput("x", torch::randn({2, 4}));
  options.shadow = TraceOptions::Shadow::kMeta;
  absl::StatusOr<runtime::GraphModule> meta = Trace(root, options);
  ASSERT_TRUE(meta.ok()) << meta.status();
  options.shadow = TraceOptions::Shadow::kReal;
  absl::StatusOr<runtime::GraphModule> real = Trace(root, options);
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_EQ(ir::PrintGraph(meta->graph()), ir::PrintGraph(real->graph()));
}

}  // namespace
}  // namespace tracecut::tracer
