// Traces every fixture model (tests/fixtures) and checks the graphs against
// the original modules, torch.fx's call_module targets and the scopes HF
// users expect.

#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "ir/proto.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "tracer/tracer.h"
#include "util/json.h"
#include "util/testing/runfiles.h"

namespace tracecut::tracer {
namespace {

using ::testing::HasSubstr;

// Every fixture; dynamic_branch needs a leaf (tested separately).
const std::vector<std::string>& Stems() {
  static const auto* stems = new std::vector<std::string>{
      "bert",
      "cnn",
      "cnn_bf16",
      "cnn_scripted",
      "config_branch",
      "gpt2",
      "llama",
      "mlp_bn",
      "mlp_bn_scripted",
      "opt",
      "optional_input",
      "shape_branch",
      "two_tower",
  };
  return *stems;
}

using ::tracecut::util::testing::Runfile;

std::string FixturePath(const std::string& stem) {
  return Runfile(absl::StrCat("tests/fixtures/", stem, ".pt"));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::set<std::string> CallModuleTargets(const ir::Graph& g) {
  std::set<std::string> out;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() == ir::OpKind::kCallModule) out.insert(n->target());
  }
  return out;
}

// Flattens the tensors of a (nested) output value, in order.
void Flatten(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) Flatten(e, out);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) Flatten(e, out);
  }
}

// Largest absolute difference between two outputs; infinite when their
// structure or shapes differ.
double MaxAbsDiff(const c10::IValue& a, const c10::IValue& b) {
  std::vector<at::Tensor> ta, tb;
  Flatten(a, ta);
  Flatten(b, tb);
  if (ta.size() != tb.size() || ta.empty()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < ta.size(); ++i) {
    if (ta[i].sizes() != tb[i].sizes() ||
        ta[i].scalar_type() != tb[i].scalar_type()) {
      return INFINITY;
    }
    double d = (ta[i].to(at::kDouble) - tb[i].to(at::kDouble))
                   .abs()
                   .max()
                   .item<double>();
    worst = std::max(worst, d);
  }
  return worst;
}

// The original module's forward on the tracer's example inputs.
c10::IValue Reference(const std::string& stem, const TraceOptions& options,
                      std::vector<c10::IValue>* inputs_out) {
  absl::StatusOr<LoadedModel> model = LoadModel(FixturePath(stem));
  EXPECT_TRUE(model.ok()) << model.status();
  absl::StatusOr<TraceOptions> resolved = WithModelFiles(*model, options);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<ExampleInputs> inputs =
      ResolveExampleInputs(model->module, *resolved);
  EXPECT_TRUE(inputs.ok()) << inputs.status();
  *inputs_out = inputs->values;
  torch::NoGradGuard no_grad;
  return model->module.forward(inputs->values);
}

// Interpreter output of the trace vs the original module, <= 1e-5.
void ExpectInterpreterMatches(const std::string& stem,
                              const TraceOptions& options) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath(stem), options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  std::vector<c10::IValue> inputs;
  c10::IValue expected = Reference(stem, options, &inputs);
  absl::StatusOr<runtime::Interpreter> interp =
      runtime::Interpreter::Create(*gm);
  ASSERT_TRUE(interp.ok()) << interp.status() << "\n"
                           << ir::PrintGraph(gm->graph());
  absl::StatusOr<c10::IValue> got;
  {
    torch::NoGradGuard no_grad;
    got = interp->Run(inputs);
  }
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LE(MaxAbsDiff(expected, *got), 1e-5);
}

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, TracesVerifiesAndMatchesTheModule) {
  const std::string path = FixturePath(GetParam());
  absl::StatusOr<LoadedModel> model = LoadModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<TraceOptions> options = WithModelFiles(*model, {});
  ASSERT_TRUE(options.ok()) << options.status();
  absl::StatusOr<runtime::GraphModule> gm = Trace(model->module, *options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  ASSERT_TRUE(ir::Verify(gm->graph()).ok()) << ir::Verify(gm->graph()) << "\n"
                                            << ir::PrintGraph(gm->graph());

  // Every call_function/call_module has a scope starting at the root and a
  // shape for each tensor it makes.
  for (const ir::Node* n : gm->graph().nodes()) {
    ASSERT_FALSE(n->scope().empty()) << n->Describe();
    EXPECT_EQ(n->scope().stack()[0].path, "") << n->Describe();
    if (n->op() == ir::OpKind::kCallModule) {
      EXPECT_EQ(n->scope().path(), n->target()) << n->Describe();
    }
  }
}

TEST_P(FixtureTest, InterpreterMatchesTheModule) {
  ExpectInterpreterMatches(GetParam(), {});
}

// Nothing a leaf: torch.nn modules' own TorchScript (BatchNorm's checks,
// F.* functions, branches on self.training) is inlined too.
TEST_P(FixtureTest, InterpreterMatchesTheModuleWithoutLeaves) {
  TraceOptions options;
  options.leaf_policy = LeafPolicy::None();
  ExpectInterpreterMatches(GetParam(), options);
}

TEST_P(FixtureTest, ExportedModelRunsAndMatches) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath(GetParam()), {});
  ASSERT_TRUE(gm.ok()) << gm.status();
  const std::string out = TempPath(absl::StrCat(GetParam(), "_traced.pt"));
  absl::Status saved = runtime::SaveTorchScript(*gm, out);
  ASSERT_TRUE(saved.ok()) << saved;
  absl::StatusOr<LoadedModel> reloaded = LoadModel(out);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  // The embedded files travel with the model.
  EXPECT_TRUE(reloaded->config.has_value());
  std::vector<c10::IValue> inputs;
  c10::IValue expected = Reference(GetParam(), {}, &inputs);
  c10::IValue got;
  {
    torch::NoGradGuard no_grad;
    got = reloaded->module.forward(inputs);
  }
  EXPECT_LE(MaxAbsDiff(expected, got), 1e-5);
}

TEST_P(FixtureTest, CallModuleTargetsMatchTorchFx) {
  const std::string json_path =
      Runfile(absl::StrCat("tests/fixtures/", GetParam(), ".fx_targets.json"));
  absl::StatusOr<util::Json> fx =
      util::ParseJson(ReadFile(json_path), json_path);
  ASSERT_TRUE(fx.ok()) << fx.status();
  // fx's own targets where it could trace, else the leaves a real forward
  // calls (equal wherever fx succeeds).
  const util::Json* targets = util::FindMember(*fx, "call_module_targets");
  if (targets == nullptr)
    targets = util::FindMember(*fx, "leaf_modules_called");
  ASSERT_NE(targets, nullptr);
  std::set<std::string> want;
  for (const util::Json& t : *targets) want.insert(t.get<std::string>());

  TraceOptions options;
  options.leaf_policy = LeafPolicy::TorchNn();  // fx's default leaves.
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath(GetParam()), options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_EQ(CallModuleTargets(gm->graph()), want);
}

TEST_P(FixtureTest, TracingTwiceIsByteIdentical) {
  absl::StatusOr<runtime::GraphModule> a =
      TraceFile(FixturePath(GetParam()), {});
  absl::StatusOr<runtime::GraphModule> b =
      TraceFile(FixturePath(GetParam()), {});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(ir::PrintGraph(a->graph()), ir::PrintGraph(b->graph()));
  absl::StatusOr<std::string> pa = ir::SerializeGraph(a->graph());
  absl::StatusOr<std::string> pb = ir::SerializeGraph(b->graph());
  ASSERT_TRUE(pa.ok()) << pa.status();
  ASSERT_TRUE(pb.ok()) << pb.status();
  EXPECT_EQ(*pa, *pb);
}

// The default (meta, real where meta cannot decide) and meta alone give
// what real execution gives.
TEST_P(FixtureTest, MetaShadowGivesTheGraphOfRealExecution) {
  TraceOptions real;
  real.shadow = TraceOptions::Shadow::kReal;
  absl::StatusOr<runtime::GraphModule> want =
      TraceFile(FixturePath(GetParam()), real);
  ASSERT_TRUE(want.ok()) << want.status();
  absl::StatusOr<runtime::GraphModule> automatic =
      TraceFile(FixturePath(GetParam()), {});
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(ir::PrintGraph(automatic->graph()), ir::PrintGraph(want->graph()));
  TraceOptions meta;
  meta.shadow = TraceOptions::Shadow::kMeta;
  absl::StatusOr<runtime::GraphModule> on_meta =
      TraceFile(FixturePath(GetParam()), meta);
  ASSERT_TRUE(on_meta.ok()) << on_meta.status();
  EXPECT_EQ(ir::PrintGraph(on_meta->graph()), ir::PrintGraph(want->graph()));
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, FixtureTest, ::testing::ValuesIn(Stems()),
                         [](const auto& info) { return info.param; });

// ------------------------------------------------------------------ llama

class LlamaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<runtime::GraphModule> gm =
        TraceFile(FixturePath("llama"), {});
    ASSERT_TRUE(gm.ok()) << gm.status();
    gm_ = new runtime::GraphModule(*std::move(gm));
  }
  static void TearDownTestSuite() {
    delete gm_;
    gm_ = nullptr;
  }
  static runtime::GraphModule* gm_;
};
runtime::GraphModule* LlamaTest::gm_ = nullptr;

TEST_F(LlamaTest, EveryNodeInsideALayerHasTheLayerInItsScope) {
  int inside = 0;
  for (const ir::Node* n : gm_->graph().nodes()) {
    const bool under_layer0 =
        (n->op() == ir::OpKind::kCallModule &&
         absl::StartsWith(n->target(), "model.layers.0.")) ||
        n->scope().Contains("model.layers.0");
    if (!under_layer0) continue;
    ++inside;
    ASSERT_GE(n->scope().depth(), 3u) << n->Describe();
    const ir::ScopeEntry& layer = n->scope().stack()[2];
    EXPECT_EQ(layer.path, "model.layers.0") << n->Describe();
    EXPECT_EQ(ir::Scope::ShortType(layer.type), "LlamaDecoderLayer")
        << n->Describe();
  }
  EXPECT_GT(inside, 20);
}

TEST_F(LlamaTest, ScopesAndLeaves) {
  const ir::Graph& g = gm_->graph();
  const ir::Node* q = nullptr;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() == ir::OpKind::kCallModule &&
        n->target() == "model.layers.1.self_attn.q_proj") {
      q = n;
    }
  }
  ASSERT_NE(q, nullptr) << ir::PrintGraph(g);
  std::vector<std::string> paths, types;
  for (const ir::ScopeEntry& e : q->scope().stack()) {
    paths.push_back(e.path);
    types.push_back(ir::Scope::ShortType(e.type));
  }
  EXPECT_THAT(paths, ::testing::ElementsAre("", "model", "model.layers.1",
                                            "model.layers.1.self_attn",
                                            "model.layers.1.self_attn.q_proj"));
  EXPECT_THAT(types, ::testing::ElementsAre("LlamaForCausalLM", "LlamaModel",
                                            "LlamaDecoderLayer",
                                            "LlamaAttention", "Linear"));
  EXPECT_EQ(q->scope().type(), "torch.nn.modules.linear.Linear");
  // The output shapes are known.
  ASSERT_EQ(q->meta().outputs.size(), 1u);
  EXPECT_EQ(q->meta().outputs[0].dtype, "float32");
  // HF defaults land in graph meta.
  auto it = g.meta().extra.find("hf.sequential_targets");
  ASSERT_NE(it, g.meta().extra.end());
  ASSERT_EQ(it->second.elements().size(), 1u);
  EXPECT_EQ(it->second.elements()[0].as_string(), "LlamaDecoderLayer");
}

TEST_F(LlamaTest, CustomLeafByTypeAndGlob) {
  TraceOptions options;
  options.leaf_policy.AddType("LlamaRMSNorm").AddPath("model.layers.*.mlp");
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath("llama"), options);
  ASSERT_TRUE(gm.ok()) << gm.status();
  std::set<std::string> targets = CallModuleTargets(gm->graph());
  EXPECT_TRUE(targets.count("model.layers.0.mlp"));
  EXPECT_TRUE(targets.count("model.layers.1.mlp"));
  EXPECT_TRUE(targets.count("model.norm"));
  EXPECT_TRUE(targets.count("model.layers.0.input_layernorm"));
  EXPECT_FALSE(targets.count("model.layers.0.mlp.gate_proj"));
}

// Every node inside a sequential target (HF's no-split module) carries that
// module in its scope, at the same depth, with the right type.
class SequentialTargetScopeTest : public ::testing::TestWithParam<std::string> {
};

TEST_P(SequentialTargetScopeTest, NodesInsideTargetsCarryThem) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath(GetParam()), {});
  ASSERT_TRUE(gm.ok()) << gm.status();
  const ir::Graph& g = gm->graph();
  auto it = g.meta().extra.find("hf.sequential_targets");
  ASSERT_NE(it, g.meta().extra.end());
  ASSERT_EQ(it->second.elements().size(), 1u);
  const std::string target = it->second.elements()[0].as_string();
  std::map<std::string, size_t> depth_of;  // Target path -> scope depth.
  std::map<std::string, int> nodes_in;
  for (const ir::Node* n : g.nodes()) {
    const auto& stack = n->scope().stack();
    for (size_t d = 0; d < stack.size(); ++d) {
      if (ir::Scope::ShortType(stack[d].type) != target) continue;
      auto [pos, inserted] = depth_of.emplace(stack[d].path, d);
      EXPECT_EQ(pos->second, d) << n->Describe();
      ++nodes_in[stack[d].path];
    }
    // Nothing under a target's path is outside its scope.
    for (const auto& [path, d] : depth_of) {
      if (n->op() == ir::OpKind::kCallModule &&
          absl::StartsWith(n->target(), path + ".")) {
        EXPECT_TRUE(n->scope().Contains(path)) << n->Describe();
      }
    }
  }
  EXPECT_EQ(depth_of.size(), 2u) << target;  // Two layers in each fixture.
  for (const auto& [path, count] : nodes_in) EXPECT_GT(count, 5) << path;
}

INSTANTIATE_TEST_SUITE_P(HfFixtures, SequentialTargetScopeTest,
                         ::testing::Values("llama", "bert", "gpt2", "opt"),
                         [](const auto& info) { return info.param; });

TEST(Gpt2Test, Conv1DIsALeafByDefault) {
  absl::StatusOr<runtime::GraphModule> gm = TraceFile(FixturePath("gpt2"), {});
  ASSERT_TRUE(gm.ok()) << gm.status();
  std::set<std::string> targets = CallModuleTargets(gm->graph());
  EXPECT_TRUE(targets.count("transformer.h.0.attn.c_attn"));
  EXPECT_TRUE(targets.count("transformer.h.1.mlp.c_proj"));
}

// ---------------------------------------------------------- control flow

TEST(ControlFlowTest, DataDependentBranchNamesModuleAndLineThenTracesAsLeaf) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath("dynamic_branch"), {});
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("data-dependent"));
  EXPECT_THAT(gm.status().message(), HasSubstr("'encoder.block.gate'"));
  EXPECT_THAT(gm.status().message(), HasSubstr("DynamicGate"));
  EXPECT_THAT(gm.status().message(),
              HasSubstr("tests/fixtures/modeling_control_flow.py:"));
  EXPECT_THAT(gm.status().message(), HasSubstr("x.sum() > 0"));
  EXPECT_THAT(gm.status().message(), HasSubstr("--leaf=encoder.block.gate"));

  for (const char* leaf : {"encoder.block.gate", "DynamicGate"}) {
    TraceOptions options;
    options.leaf_policy.AddTypeOrPath(leaf);
    gm = TraceFile(FixturePath("dynamic_branch"), options);
    ASSERT_TRUE(gm.ok()) << gm.status();
    EXPECT_TRUE(CallModuleTargets(gm->graph()).count("encoder.block.gate"));
    ExpectInterpreterMatches("dynamic_branch", options);
  }
}

TEST(ControlFlowTest, ShapeBranchesAreSpecialisedAndRecorded) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath("shape_branch"), {});
  ASSERT_TRUE(gm.ok()) << gm.status();
  const std::vector<std::string>& a = gm->graph().meta().assumptions;
  ASSERT_EQ(a.size(), 2u) << ir::PrintGraph(gm->graph());
  EXPECT_THAT(a[0], HasSubstr("x.dim() == 3"));
  EXPECT_THAT(a[0], HasSubstr("modeling_control_flow.py:"));
  EXPECT_THAT(a[1], HasSubstr("x.size(-1) > 8"));
}

TEST(ControlFlowTest, ConstantBranchesLeaveNoAssumptions) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath("config_branch"), {});
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_THAT(gm->graph().meta().assumptions, ::testing::IsEmpty());
  bool tanh = false;
  for (const ir::Node* n : gm->graph().nodes()) {
    tanh |= n->target() == "aten::tanh";
    EXPECT_NE(n->target(), "layer.dropout");
  }
  EXPECT_TRUE(tanh);
}

TEST(ControlFlowTest, OptionalInputGivenAsNone) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(FixturePath("optional_input"), {});
  ASSERT_TRUE(gm.ok()) << gm.status();
  EXPECT_THAT(gm->graph().meta().assumptions,
              ::testing::ElementsAre("input mask is None"));
  EXPECT_EQ(gm->graph().placeholders().size(), 2u);
  for (const ir::Node* n : gm->graph().nodes()) {
    EXPECT_FALSE(absl::StartsWith(n->target(), "aten::mul")) << n->Describe();
  }
}

// ------------------------------------------------------------- bad files

TEST(LoadTest, MissingFile) {
  absl::StatusOr<runtime::GraphModule> gm =
      TraceFile(TempPath("does_not_exist.pt"), {});
  ASSERT_FALSE(gm.ok());
  EXPECT_EQ(gm.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gm.status().message(), HasSubstr("does_not_exist.pt"));
}

TEST(LoadTest, EmptyFile) {
  const std::string path = TempPath("empty.pt");
  WriteFile(path, "");
  absl::StatusOr<runtime::GraphModule> gm = TraceFile(path, {});
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("is empty"));
  EXPECT_THAT(gm.status().message(), HasSubstr(path));
}

TEST(LoadTest, NotAZip) {
  const std::string path = TempPath("text.pt");
  WriteFile(path, "this is not a model\n");
  absl::StatusOr<runtime::GraphModule> gm = TraceFile(path, {});
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("not a TorchScript archive"));
  EXPECT_THAT(gm.status().message(), HasSubstr(path));
}

TEST(LoadTest, TruncatedArchive) {
  const std::string bytes = ReadFile(FixturePath("cnn"));
  ASSERT_GT(bytes.size(), 1000u);
  const std::string path = TempPath("truncated.pt");
  WriteFile(path, bytes.substr(0, bytes.size() / 2));
  absl::StatusOr<runtime::GraphModule> gm = TraceFile(path, {});
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(gm.status().message(), HasSubstr(path));
}

TEST(LoadTest, ZipThatIsNotTorchScript) {
  const std::string path = TempPath("tensor.pt");
  // torch.save's format: a zip with a pickle, but no TorchScript code.
  std::vector<char> bytes =
      torch::jit::pickle_save(c10::IValue(torch::ones({2, 2})));
  WriteFile(path, std::string(bytes.begin(), bytes.end()));
  absl::StatusOr<runtime::GraphModule> gm = TraceFile(path, {});
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("not a TorchScript model"));
  EXPECT_THAT(gm.status().message(), HasSubstr(path));
}

TEST(LoadTest, Directory) {
  const std::string path = TempPath("dir.pt");
  mkdir(path.c_str(), 0755);
  absl::StatusOr<runtime::GraphModule> gm = TraceFile(path, {});
  ASSERT_FALSE(gm.ok());
  EXPECT_THAT(gm.status().message(), HasSubstr("is a directory"));
}

TEST(LoadTest, EmbeddedFilesAreRead) {
  absl::StatusOr<LoadedModel> m = LoadModel(FixturePath("llama"));
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->config.has_value());
  EXPECT_EQ(m->config->model_type(), "llama");
  ASSERT_TRUE(m->inputs.has_value());
  ASSERT_EQ(m->inputs->inputs.size(), 2u);
  EXPECT_EQ(m->inputs->inputs[0].name, "input_ids");
}

}  // namespace
}  // namespace tracecut::tracer
