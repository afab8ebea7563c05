#include "runtime/lowering.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/script.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/test_util.h"
#include "util/testing/temp_dir.h"

namespace tracecut::runtime {
namespace {

using ir::Argument;
using ir::Node;
using testing::Det;
using ::testing::HasSubstr;
using testing::MakeLinear;
using testing::MakeMlp;

namespace fs = std::filesystem;

Argument R(Node* n) { return Argument::Ref(n); }
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::unique_ptr<ir::Graph> MlpGraph() {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* fc1 = *g->CallModule("fc1", {R(x)});
  Node* relu = *g->CallFunction("aten::relu", {R(fc1)});
  Node* fc2 = *g->CallModule("fc2", {R(relu)});
  Node* scale = *g->GetAttr("scale");
  Node* mul = *g->CallFunction("aten::mul.Tensor", {R(fc2), R(scale)});
  Node* add = *g->CallFunction("aten::add.Tensor", {R(mul), R(x)},
                               {{"alpha", Argument::Int(1)}});
  Node* fc3 = *g->CallModule("fc3", {R(add)});
  (void)*g->Output(R(fc3));
  return g;
}

// Lists, multi-output operators, getitem on tuples and lists, dtypes, a
// value computed from a shape, a tuple output and an inlined Linear.
std::unique_ptr<ir::Graph> BusyGraph() {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* w = *g->GetAttr("fc1.weight");
  Node* b = *g->GetAttr("fc1.bias");
  Node* lin = *g->CallFunction("aten::linear", {R(x), R(w), R(b)});
  Node* parts = *g->CallFunction("aten::split.Tensor",
                                 {R(lin), Argument::Int(2), Argument::Int(1)});
  Node* p0 = *g->CallFunction("getitem", {R(parts), Argument::Int(0)});
  Node* p1 = *g->CallFunction("getitem", {R(parts), Argument::Int(-1)});
  Node* cat = *g->CallFunction("aten::cat", {Argument::List({R(p1), R(p0)})},
                               {{"dim", Argument::Int(1)}});
  Node* rows = *g->CallFunction("aten::size.int", {R(x), Argument::Int(0)});
  Node* view = *g->CallFunction(
      "aten::view", {R(cat), Argument::List({R(rows), Argument::Int(-1)})});
  Node* sum = *g->CallFunction(
      "aten::sum.dim_IntList",
      {R(view), Argument::List({Argument::Int(1)}), Argument::Bool(true)},
      {{"dtype", Argument::DType("float64")}});
  Node* max = *g->CallFunction("aten::max.dim", {R(view), Argument::Int(0)});
  Node* values = *g->CallFunction("getitem", {R(max), Argument::Int(0)});
  // Dead: lowering drops it.
  (void)*g->CallFunction("aten::mul.Scalar",
                         {R(values), Argument::Double(0.5)});
  Node* fc3 = *g->CallModule("fc3", {R(view)});
  (void)*g->Output(Argument::Tuple({R(fc3), R(sum), R(values)}));
  return g;
}

void ExpectSameIValue(const c10::IValue& a, const c10::IValue& b) {
  if (a.isTuple()) {
    ASSERT_TRUE(b.isTuple());
    const auto& ea = a.toTupleRef().elements();
    const auto& eb = b.toTupleRef().elements();
    ASSERT_EQ(ea.size(), eb.size());
    for (size_t i = 0; i < ea.size(); ++i) ExpectSameIValue(ea[i], eb[i]);
    return;
  }
  ASSERT_TRUE(a.isTensor() && b.isTensor());
  EXPECT_TRUE(torch::equal(a.toTensor(), b.toTensor()))
      << a.toTensor() << "\nvs\n"
      << b.toTensor();
}

TEST(LoweringTest, LoweredForwardMatchesInterpreterAndOriginal) {
  GraphModule gm(MakeMlp(), MlpGraph());
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok());
  for (uint64_t seed : {1, 2}) {
    at::Tensor x = Det({3, 4}, seed);
    c10::IValue y = lowered->forward({x});
    ExpectSameIValue(y, *interp->Run({x}));
    ExpectSameIValue(y, gm.module().forward({x}));
  }
  std::string code = lowered->get_method("forward").graph()->toString();
  EXPECT_THAT(code, HasSubstr("prim::CallMethod[name=\"forward\"]"));
  EXPECT_THAT(code, HasSubstr("aten::relu"));
}

TEST(LoweringTest, OriginalModuleKeepsItsForward) {
  torch::jit::Module m = MakeMlp();
  std::string before = m.get_method("forward").graph()->toString();
  // A graph that computes something else entirely.
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* neg = *g->CallFunction("aten::neg", {R(x)});
  (void)*g->Output(R(neg));
  GraphModule gm(m, std::move(g));
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  at::Tensor x4 = Det({2, 4}, 1);
  EXPECT_TRUE(torch::equal(lowered->forward({x4}).toTensor(), -x4));
  EXPECT_EQ(m.get_method("forward").graph()->toString(), before);
  EXPECT_FALSE(torch::equal(m.forward({x4}).toTensor(), -x4.narrow(1, 0, 2)));
  EXPECT_EQ(m.forward({x4}).toTensor().size(1), 2);
  EXPECT_NE(lowered->type(), m.type());
  // Tensors are shared, not copied.
  EXPECT_TRUE(lowered->attr("fc1").toModule().attr("weight").toTensor().is_same(
      m.attr("fc1").toModule().attr("weight").toTensor()));
  // Lowering twice works (the first lowering did not touch gm's types).
  EXPECT_TRUE(LowerToTorchScript(gm).ok());
}

TEST(LoweringTest, BusyGraphMatchesInterpreter) {
  GraphModule gm(MakeMlp(), BusyGraph());
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  at::Tensor x = Det({3, 4}, 5);
  absl::StatusOr<c10::IValue> expected = interp->Run({x});
  ASSERT_TRUE(expected.ok()) << expected.status();
  ExpectSameIValue(lowered->forward({x}), *expected);
  std::string code = lowered->get_method("forward").graph()->toString();
  EXPECT_THAT(code, HasSubstr("prim::ListConstruct"));
  EXPECT_THAT(code, HasSubstr("prim::TupleConstruct"));
  EXPECT_THAT(code, ::testing::Not(HasSubstr("aten::mul")));  // Dead code.
}

TEST(LoweringTest, InfersNonTensorInputTypesFromUse) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* dim = *g->Placeholder("dim");
  Node* k = *g->Placeholder("k");
  Node* sum =
      *g->CallFunction("aten::sum.dim_IntList",
                       {R(x), Argument::List({R(dim)}), Argument::Bool(false)},
                       {{"dtype", Argument::None()}});
  Node* mul = *g->CallFunction("aten::mul.Scalar", {R(sum), R(k)});
  (void)*g->Output(R(mul));
  GraphModule gm(MakeMlp(), std::move(g));
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const auto& args =
      lowered->get_method("forward").function().getSchema().arguments();
  ASSERT_EQ(args.size(), 4u);
  EXPECT_EQ(args[1].name(), "x");
  EXPECT_EQ(args[2].type()->str(), "int");
  EXPECT_EQ(args[3].type()->str(), "Scalar");
  at::Tensor xv = Det({2, 3}, 1);
  at::Tensor y = lowered->forward({xv, int64_t{1}, 2.5}).toTensor();
  EXPECT_TRUE(torch::equal(y, xv.sum({1}) * 2.5));

  // Explicit types win.
  LoweringOptions options;
  options.input_types = {c10::TensorType::get(), c10::IntType::get(),
                         c10::FloatType::get()};
  lowered = LowerToTorchScript(gm, options);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(lowered->get_method("forward")
                .function()
                .getSchema()
                .arguments()[3]
                .type()
                ->str(),
            "float");
}

TEST(LoweringTest, KeepsTheOriginalSignatureWithDefaults) {
  torch::jit::Module m("WithDefault");
  m.register_buffer("bias", torch::ones({3}));
  m.define(R"(
def forward(self, x, alpha: float = 2.0):
    return torch.add(x, self.bias, alpha=alpha)
)");
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* alpha = *g->Placeholder("alpha");
  Node* bias = *g->GetAttr("bias");
  Node* add = *g->CallFunction("aten::add.Tensor", {R(x), R(bias)},
                               {{"alpha", R(alpha)}});
  (void)*g->Output(R(add));
  GraphModule gm(m, std::move(g));
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  at::Tensor xv = Det({3}, 2);
  EXPECT_TRUE(torch::equal(lowered->forward({xv}).toTensor(),
                           m.forward({xv}).toTensor()));
  EXPECT_TRUE(torch::equal(lowered->forward({xv, 0.5}).toTensor(),
                           xv + 0.5 * torch::ones({3})));
}

TEST(LoweringErrorsTest, NameTheNode) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* bad = *g->CallFunction("aten::no_such_op", {R(x)});
  (void)*g->Output(R(bad));
  GraphModule gm(MakeMlp(), std::move(g));
  absl::Status s = LowerToTorchScript(gm).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(s),
              HasSubstr("%no_such_op (call_function aten::no_such_op)"));

  g = std::make_unique<ir::Graph>();
  x = *g->Placeholder("x");
  Node* w = *g->GetAttr("fc2.nope");
  Node* add = *g->CallFunction("aten::add.Tensor", {R(x), R(w)});
  (void)*g->Output(R(add));
  GraphModule gm2(MakeMlp(), std::move(g));
  s = LowerToTorchScript(gm2).status();
  EXPECT_THAT(Msg(s),
              HasSubstr("module 'fc2' (Linear) has no attribute 'nope'"));

  // An int flowing into a Tensor argument: the schema check names the node.
  g = std::make_unique<ir::Graph>();
  x = *g->Placeholder("x");
  Node* n = *g->CallFunction("aten::size.int", {R(x), Argument::Int(0)});
  Node* relu = *g->CallFunction("aten::relu", {R(n)}, {}, "bad_relu");
  (void)*g->Output(R(relu));
  GraphModule gm3(MakeMlp(), std::move(g));
  s = LowerToTorchScript(gm3).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Msg(s), HasSubstr("%bad_relu (call_function aten::relu)"));
  EXPECT_THAT(Msg(s),
              HasSubstr("Expected a value of type 'Tensor' for argument "
                        "'self' but instead found type 'int'"));
  EXPECT_THAT(Msg(s), ::testing::Not(HasSubstr("\n")));
}

using ::tracecut::util::testing::ListDir;

// A directory of this test's own.
std::string TempDir() {
  return util::testing::TempDir(
      ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

// Net: block0, block1 (one type Block: fc = Linear(4, 4) leaf, buffer
// scale), head = Linear(4, 2), buffer shift on the root.
torch::jit::Module MakeNet() {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module block("Block", cu, /*shouldMangle=*/true);
  block.register_module("fc", MakeLinear(4, 4, 1));
  block.register_buffer("scale", Det({4}, 2));
  block.define(R"(
def forward(self, x):
    return torch.relu(self.fc.forward(x) * self.scale)
)");
  torch::jit::Module net("Net", cu, /*shouldMangle=*/true);
  net.register_module("block0", block);
  torch::jit::Module block1 = block.deepcopy();
  block1.setattr("scale", Det({4}, 3));
  net.register_module("block1", block1);
  net.register_module("head", MakeLinear(4, 2, 4));
  net.register_buffer("shift", Det({4}, 5));
  net.define(R"(
def forward(self, x):
    return self.head.forward(self.block1.forward(self.block0.forward(x)))
)");
  return net;
}

// Appends Block `name`'s nodes, in its scope, reading the root's shift
// (a tensor outside the block); `extra` adds a neg.
Node* AddBlock(ir::Graph& g, const std::string& name, Node* x,
               bool extra = false) {
  const ir::Scope block_scope({{"", "Net"}, {name, "Block"}});
  Node* fc = *g.CallModule(name + ".fc", {R(x)});
  fc->set_scope(block_scope.Push({name + ".fc", "Linear"}));
  Node* scale = *g.GetAttr(name + ".scale");
  Node* mul = *g.CallFunction("aten::mul.Tensor", {R(fc), R(scale)});
  Node* shift = *g.GetAttr("shift");
  Node* add = *g.CallFunction("aten::add.Tensor", {R(mul), R(shift)},
                              {{"alpha", Argument::Int(1)}});
  Node* out = *g.CallFunction("aten::relu", {R(add)});
  for (Node* n : {scale, mul, shift, add, out}) n->set_scope(block_scope);
  if (extra) {
    out = *g.CallFunction("aten::neg", {R(out)});
    out->set_scope(block_scope);
  }
  return out;
}

std::unique_ptr<ir::Graph> NetGraph(const std::vector<std::string>& blocks,
                                    bool block1_extra = false) {
  auto g = std::make_unique<ir::Graph>();
  Node* h = *g->Placeholder("x");
  for (const std::string& name : blocks) {
    h = AddBlock(*g, name, h, block1_extra && name == "block1");
  }
  Node* head = *g->CallModule("head", {R(h)});
  head->set_scope(ir::Scope({{"", "Net"}, {"head", "Linear"}}));
  (void)*g->Output(R(head));
  return g;
}

// Lowers, runs, saves and loads `gm`; returns the root forward's graph text.
std::string LowerRunAndReload(const GraphModule& gm,
                              const LoweringOptions& options = {}) {
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm, options);
  EXPECT_TRUE(lowered.ok()) << lowered.status();
  if (!lowered.ok()) return "";
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  EXPECT_TRUE(interp.ok()) << interp.status();
  at::Tensor x = Det({3, 4}, 9);
  ExpectSameIValue(lowered->forward({x}), *interp->Run({x}));
  // What is saved compiles again (no method calls an old forward the old
  // way) and runs the same.
  std::stringstream bytes;
  lowered->save(bytes);
  torch::jit::Module loaded = torch::jit::load(bytes);
  ExpectSameIValue(loaded.forward({x}), *interp->Run({x}));
  return lowered->get_method("forward").graph()->toString();
}

TEST(HierarchyTest, EachModuleCallBecomesItsForward) {
  GraphModule gm(MakeNet(), NetGraph({"block0", "block1"}));
  const std::string root = LowerRunAndReload(gm);
  // The root calls the blocks; their nodes are in Block.forward, which reads
  // the root's shift as an argument.
  EXPECT_THAT(root, ::testing::Not(HasSubstr("aten::mul")));
  EXPECT_THAT(root, HasSubstr("prim::GetAttr[name=\"shift\"]"));
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok());
  torch::jit::Module block0 = lowered->attr("block0").toModule();
  const std::string body = block0.get_method("forward").graph()->toString();
  EXPECT_THAT(body, HasSubstr("aten::mul"));
  EXPECT_THAT(body, HasSubstr("prim::GetAttr[name=\"scale\"]"));
  EXPECT_EQ(block0.get_method("forward").num_inputs(), 3);  // self, x, shift
  // The leaf keeps its own forward.
  EXPECT_TRUE(block0.attr("fc").toModule().find_method("forward").has_value());

  LoweringOptions flat;
  flat.keep_hierarchy = false;
  EXPECT_THAT(LowerRunAndReload(gm, flat), HasSubstr("aten::mul"));
}

TEST(HierarchyTest, AModuleCalledTwiceStaysInline) {
  GraphModule gm(MakeNet(), NetGraph({"block0", "block1", "block0"}));
  const std::string root = LowerRunAndReload(gm);
  EXPECT_THAT(root, HasSubstr("aten::mul"));  // block0's calls.
  EXPECT_THAT(root, HasSubstr("prim::GetAttr[name=\"block1\"]"));
}

TEST(HierarchyTest, AnInstanceThatComputesSomethingElseGetsItsOwnType) {
  // block1 computes more than block0: Block.forward can only be one of
  // them, so block1 gets a Block type of its own.
  torch::jit::Module net = MakeNet();
  GraphModule gm(net, NetGraph({"block0", "block1"}, true));
  const std::string root = LowerRunAndReload(gm);
  EXPECT_THAT(root, ::testing::Not(HasSubstr("aten::neg")));
  EXPECT_THAT(root, ::testing::Not(HasSubstr("aten::mul")));
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  ASSERT_TRUE(lowered.ok());
  torch::jit::Module block0 = lowered->attr("block0").toModule();
  torch::jit::Module block1 = lowered->attr("block1").toModule();
  EXPECT_NE(block0.type(), block1.type());
  EXPECT_EQ(ir::Scope::DemangleType(block1.type()->name()->qualifiedName()),
            ir::Scope::DemangleType(block0.type()->name()->qualifiedName()));
  EXPECT_THAT(block1.get_method("forward").graph()->toString(),
              HasSubstr("aten::neg"));
  EXPECT_THAT(block0.get_method("forward").graph()->toString(),
              ::testing::Not(HasSubstr("aten::neg")));
  // The original module's instances still share their type.
  EXPECT_EQ(net.attr("block0").toModule().type(),
            net.attr("block1").toModule().type());
}

TEST(HierarchyTest, PruningKeepsOutlinedForwards) {
  // With prune_unused, outlined modules keep their forward and what it reads.
  GraphModule gm(MakeNet(), NetGraph({"block0", "block1"}));
  LoweringOptions lean;
  lean.prune_unused = true;
  LowerRunAndReload(gm, lean);
}

TEST(SaveTest, SaveLoadRunsTheSameAndKeepsExtraFiles) {
  std::string dir = TempDir();
  std::string path = dir + "/model.pt";
  GraphModule gm(MakeMlp(), BusyGraph());
  gm.mutable_extra_files()["config.json"] = R"({"model_type": "mlp"})";
  SaveOptions options;
  options.extra_files["tracecut.txt"] = "lowered";
  ASSERT_TRUE(SaveTorchScript(gm, path, options).ok());
  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre("model.pt"));

  torch::jit::ExtraFilesMap extra = {{"config.json", ""}, {"tracecut.txt", ""}};
  torch::jit::Module loaded = torch::jit::load(path, std::nullopt, extra);
  EXPECT_EQ(extra["config.json"], R"({"model_type": "mlp"})");
  EXPECT_EQ(extra["tracecut.txt"], "lowered");
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok());
  at::Tensor x = Det({3, 4}, 8);
  ExpectSameIValue(loaded.forward({x}), *interp->Run({x}));

  // Without gm's extra files.
  options.include_extra_files = false;
  ASSERT_TRUE(SaveTorchScript(gm, path, options).ok());
  extra = {{"config.json", ""}};
  torch::jit::load(path, std::nullopt, extra);
  EXPECT_EQ(extra["config.json"], "");
}

TEST(SaveTest, MissingOrUnwritableDirectoryIsAClearError) {
  std::string dir = TempDir();
  GraphModule gm(MakeMlp(), MlpGraph());
  absl::Status s = SaveTorchScript(gm, dir + "/no/such/dir/model.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(s),
              HasSubstr("cannot save '" + dir + "/no/such/dir/model.pt'"));
  EXPECT_THAT(Msg(s), HasSubstr("No such file or directory"));

  s = SaveTorchScript(gm, dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), HasSubstr("is a directory"));

  if (geteuid() != 0) {  // root writes anywhere.
    std::string ro = dir + "/ro";
    fs::create_directory(ro);
    chmod(ro.c_str(), 0555);
    s = SaveTorchScript(gm, ro + "/model.pt");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(Msg(s), HasSubstr("Permission denied"));
    chmod(ro.c_str(), 0755);
  }
}

TEST(SaveTest, FailureLeavesNoPartialFileAndKeepsTheOldOne) {
  std::string dir = TempDir();
  std::string path = dir + "/model.pt";
  {
    std::ofstream old(path);
    old << "previous model";
  }
  // A Future cannot be serialized: the save fails after starting to write.
  torch::jit::Module m = MakeMlp();
  m.register_attribute(
      "pending", c10::FutureType::create(c10::IntType::get()),
      c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get()));
  GraphModule gm(m, MlpGraph());
  absl::Status s = SaveTorchScript(gm, path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Msg(s), HasSubstr("cannot save '" + path + "'"));
  EXPECT_THAT(ListDir(dir), ::testing::ElementsAre("model.pt"));
  std::ifstream in(path);
  std::string content((std::istreambuf_iterator<char>(in)),
                      std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "previous model");
}

TEST(SaveTest, FullDiskIsAStatusAndLeavesNoFile) {
  std::string dir = TempDir();
  std::string path = dir + "/full.pt";
  GraphModule gm(MakeMlp(), MlpGraph());
  // A file size limit makes writes past 1 KiB fail with EFBIG, as a full
  // disk would (LibTorch's own file writer terminated the process then).
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  absl::Status s = SaveTorchScript(gm, path);
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Msg(s), HasSubstr("cannot save '" + path + "'"));
  EXPECT_THAT(Msg(s), HasSubstr("File too large"));
  EXPECT_TRUE(ListDir(dir).empty());
}

}  // namespace
}  // namespace tracecut::runtime
