#include "runtime/interpreter.h"

#include <torch/script.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "runtime/test_util.h"

namespace tracecut::runtime {
namespace {

using ir::Argument;
using ir::Node;
using testing::Det;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeMlp;

Argument R(Node* n) { return Argument::Ref(n); }

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// The Mlp's forward with its Linear submodules as leaves.
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

// The same with the Linears inlined to aten::linear on get_attr weights.
std::unique_ptr<ir::Graph> InlinedMlpGraph() {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  auto linear = [&](const std::string& m, Node* in) {
    Node* w = *g->GetAttr(m + ".weight");
    Node* b = *g->GetAttr(m + ".bias");
    return *g->CallFunction("aten::linear", {R(in), R(w), R(b)});
  };
  Node* relu = *g->CallFunction("aten::relu", {R(linear("fc1", x))});
  Node* scale = *g->GetAttr("scale");
  Node* mul =
      *g->CallFunction("aten::mul.Tensor", {R(linear("fc2", relu)), R(scale)});
  // alpha omitted: filled from the schema default.
  Node* add = *g->CallFunction("aten::add.Tensor", {R(mul), R(x)});
  (void)*g->Output(R(linear("fc3", add)));
  return g;
}

TEST(InterpreterTest, MatchesModuleForwardExactly) {
  GraphModule gm(MakeMlp(), MlpGraph());
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  for (uint64_t seed : {1, 2, 3}) {
    at::Tensor x = Det({5, 4}, seed);
    absl::StatusOr<c10::IValue> y = interp->Run({x});
    ASSERT_TRUE(y.ok()) << y.status();
    at::Tensor expected = gm.module().forward({x}).toTensor();
    EXPECT_TRUE(torch::equal(y->toTensor(), expected));
  }
}

TEST(InterpreterTest, InlinedGraphMatchesModuleForwardExactly) {
  GraphModule gm(MakeMlp(), InlinedMlpGraph());
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  at::Tensor x = Det({5, 4}, 9);
  absl::StatusOr<c10::IValue> y = interp->Run({x});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(torch::equal(y->toTensor(), gm.module().forward({x}).toTensor()));
}

TEST(InterpreterTest, ConvertsConstantsListsAndMultipleOutputs) {
  // x:[2,6] -> split into [2,3],[2,3] (a Tensor[]), cat them back reversed,
  // view with a size read from the graph, sum over dim 1 as float64, max
  // over dim 0 (two returns), tuple output.
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* parts = *g->CallFunction("aten::split.Tensor",
                                 {R(x), Argument::Int(3), Argument::Int(1)});
  Node* p0 = *g->CallFunction("getitem", {R(parts), Argument::Int(0)});
  Node* p1 = *g->CallFunction("getitem", {R(parts), Argument::Int(-1)});
  Node* cat = *g->CallFunction("aten::cat", {Argument::List({R(p1), R(p0)})},
                               {{"dim", Argument::Int(1)}});
  Node* rows = *g->CallFunction("aten::size.int", {R(x), Argument::Int(0)});
  Node* view = *g->CallFunction(
      "aten::view", {R(cat), Argument::List({R(rows), Argument::Int(-1)})});
  Node* sum = *g->CallFunction(
      "aten::sum.dim_IntList",
      {R(view), Argument::List({Argument::Int(1)}), Argument::Bool(false)},
      {{"dtype", Argument::DType("float64")}});
  Node* max = *g->CallFunction("aten::max.dim", {R(view), Argument::Int(0)});
  Node* values = *g->CallFunction("getitem", {R(max), Argument::Int(0)});
  Node* indices = *g->CallFunction("getitem", {R(max), Argument::Int(1)});
  Node* scaled =
      *g->CallFunction("aten::mul.Scalar", {R(values), Argument::Int(2)});
  (void)*g->Output(Argument::Tuple({R(sum), R(scaled), R(indices)}));
  GraphModule gm(MakeMlp(), std::move(g));
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();

  at::Tensor xt = Det({2, 6}, 4);
  absl::StatusOr<c10::IValue> y = interp->Run({xt});
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(y->isTuple());
  const auto& out = y->toTupleRef().elements();
  ASSERT_EQ(out.size(), 3u);
  auto split = xt.split(3, 1);
  at::Tensor v = torch::cat({split[1], split[0]}, 1).view({2, -1});
  EXPECT_TRUE(torch::equal(out[0].toTensor(), v.sum({1}, false, at::kDouble)));
  EXPECT_EQ(out[0].toTensor().scalar_type(), at::kDouble);
  auto [mv, mi] = v.max(0);
  EXPECT_TRUE(torch::equal(out[1].toTensor(), mv * 2));
  EXPECT_TRUE(torch::equal(out[2].toTensor(), mi));
}

TEST(InterpreterTest, OptionalTensorListsDevicesAndDtypes) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* idx = *g->Placeholder("idx");
  // x[None-free advanced index]: aten::index.Tensor(Tensor self, Tensor?[]).
  Node* picked = *g->CallFunction(
      "aten::index.Tensor", {R(x), Argument::List({Argument::None(), R(idx)})});
  Node* moved = *g->CallFunction(
      "aten::to.device",
      {R(picked), Argument::Device("cpu"), Argument::DType("float16"),
       Argument::Bool(false), Argument::Bool(false)});
  (void)*g->Output(R(moved));
  GraphModule gm(MakeMlp(), std::move(g));
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  at::Tensor xt = Det({3, 4}, 5);
  at::Tensor it = torch::tensor({3, 0}, at::kLong);
  absl::StatusOr<c10::IValue> y = interp->Run({xt, it});
  ASSERT_TRUE(y.ok()) << y.status();
  at::Tensor expected = xt.index({torch::indexing::Slice(), it}).to(at::kHalf);
  EXPECT_TRUE(torch::equal(y->toTensor(), expected));
}

// PlaceOn rewrites the devices written into the graph: the meta device
// stands in for a GPU (it exists on every machine).
TEST(InterpreterTest, PlaceOnMovesDevicesWrittenIntoTheGraph) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* range = *g->CallFunction("aten::arange", {Argument::Int(3)},
                                 {{"dtype", Argument::DType("float32")},
                                  {"device", Argument::Device("cpu")}});
  Node* moved = *g->CallFunction(
      "aten::to.device",
      {R(x), Argument::Device("cpu"), Argument::DType("float32"),
       Argument::Bool(false), Argument::Bool(false)});
  Node* sum = *g->CallFunction("aten::add.Tensor", {R(moved), R(range)});
  (void)*g->Output(R(sum));
  GraphModule gm(MakeMlp(), std::move(g));
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  absl::StatusOr<c10::IValue> cpu = interp->Run({at::ones({3})});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(torch::equal(cpu->toTensor(), torch::tensor({1.F, 2.F, 3.F})));

  interp->PlaceOn(c10::Device(c10::kMeta));
  absl::StatusOr<c10::IValue> meta =
      interp->Run({at::ones({3}, at::TensorOptions().device(c10::kMeta))});
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->toTensor().is_meta());
  EXPECT_EQ(meta->toTensor().sizes(), c10::IntArrayRef({3}));
}

struct Event {
  std::string what;
  size_t num_inputs;
  bool has_output;
};

TEST(InterpreterTest, HooksFireInOrderWithTheRightValues) {
  GraphModule gm(MakeMlp(), MlpGraph());
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();
  std::vector<std::string> events;
  at::Tensor fc1_in, fc1_out, relu_out;
  interp->AddNodeHook([&](const ir::Node& node,
                          absl::Span<const c10::IValue> inputs,
                          const c10::IValue* output) {
    events.push_back(absl::StrCat(output ? "after " : "before ", node.name(),
                                  "/", inputs.size()));
    if (node.name() == "relu" && output != nullptr) {
      relu_out = output->toTensor();
      EXPECT_TRUE(torch::equal(inputs[0].toTensor(), fc1_out));
    }
  });
  interp->AddModuleHook(
      [&](const ir::Node& node, const torch::jit::Module& module,
          absl::Span<const c10::IValue> inputs, const c10::IValue* output) {
        events.push_back(absl::StrCat(
            output ? "module after " : "module before ", node.target()));
        if (node.target() == "fc1") {
          EXPECT_TRUE(module.attr("weight").toTensor().is_same(
              *gm.GetTensor("fc1.weight")));
          if (output == nullptr) {
            fc1_in = inputs[0].toTensor();
          } else {
            fc1_out = output->toTensor();
          }
        }
      });
  at::Tensor x = Det({2, 4}, 1);
  absl::StatusOr<c10::IValue> y = interp->Run({x});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_THAT(
      events,
      ElementsAre("before x/0", "after x/0", "before fc1/1",
                  "module before fc1", "module after fc1", "after fc1/1",
                  "before relu/1", "after relu/1", "before fc2/1",
                  "module before fc2", "module after fc2", "after fc2/1",
                  "before scale/0", "after scale/0", "before mul/2",
                  "after mul/2", "before add/3", "after add/3", "before fc3/1",
                  "module before fc3", "module after fc3", "after fc3/1",
                  "before output/1", "after output/1"));
  EXPECT_TRUE(torch::equal(fc1_in, x));
  at::Tensor w = *gm.GetTensor("fc1.weight");
  at::Tensor b = *gm.GetTensor("fc1.bias");
  EXPECT_TRUE(torch::equal(fc1_out, torch::linear(x, w, b)));
  EXPECT_TRUE(torch::equal(relu_out, torch::relu(fc1_out)));
}

TEST(InterpreterTest, RemovedHooksStopFiring) {
  GraphModule gm(MakeMlp(), MlpGraph());
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok());
  int node_calls = 0, module_calls = 0;
  auto a =
      interp->AddNodeHook([&](const ir::Node&, absl::Span<const c10::IValue>,
                              const c10::IValue*) { ++node_calls; });
  auto b = interp->AddModuleHook([&](const ir::Node&, const torch::jit::Module&,
                                     absl::Span<const c10::IValue>,
                                     const c10::IValue*) { ++module_calls; });
  ASSERT_TRUE(interp->Run({Det({2, 4}, 1)}).ok());
  EXPECT_EQ(node_calls, 18);
  EXPECT_EQ(module_calls, 6);
  EXPECT_TRUE(interp->RemoveHook(a));
  EXPECT_TRUE(interp->RemoveHook(b));
  EXPECT_FALSE(interp->RemoveHook(b));
  ASSERT_TRUE(interp->Run({Det({2, 4}, 1)}).ok());
  EXPECT_EQ(node_calls, 18);
  EXPECT_EQ(module_calls, 6);
}

TEST(InterpreterTest, ReleasesValuesAfterTheirLastUse) {
  // x -> r1 -> r2 -> ... -> r8 -> add(r8, r1)? No: r1 must stay alive until
  // the add; everything else dies as soon as its single reader ran.
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* first = *g->CallFunction("aten::neg", {R(x)});
  Node* prev = first;
  for (int i = 0; i < 8; ++i) {
    prev = *g->CallFunction("aten::relu", {R(prev)});
  }
  Node* unused = *g->CallFunction("aten::exp", {R(x)});
  (void)unused;
  Node* add = *g->CallFunction("aten::add.Tensor", {R(prev), R(first)});
  (void)*g->Output(R(add));
  GraphModule gm(MakeMlp(), std::move(g));
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok()) << interp.status();

  // Watch the intermediate made by the second relu: it must be gone once
  // the third relu ran, long before the end.
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> watched;
  bool seen_expired = false;
  std::string second_relu = first->next()->next()->name();
  std::string fourth_relu = first->next()->next()->next()->next()->name();
  interp->AddNodeHook([&](const ir::Node& node, absl::Span<const c10::IValue>,
                          const c10::IValue* output) {
    if (output == nullptr) return;
    if (node.name() == second_relu) {
      watched.emplace(output->toTensor().getIntrusivePtr());
    }
    if (node.name() == fourth_relu)
      seen_expired = watched.has_value() && watched->expired();
  });
  RunStats stats;
  absl::StatusOr<c10::IValue> y = interp->Run({Det({3}, 2)}, &stats);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(seen_expired);
  // x, first, one relu in flight (and exp, released at once) at most.
  EXPECT_LE(stats.peak_live_values, 4);
  EXPECT_EQ(stats.nodes_run, 13);
  // Every value but none is released before the end.
  EXPECT_EQ(stats.values_released, 12);
}

TEST(InterpreterTest, RunNamedRunsASubgraphOfTheSameModule) {
  // fc2(h) * scale + x as a partition subgraph: inputs h and x.
  auto g = std::make_unique<ir::Graph>();
  Node* h = *g->Placeholder("relu");
  Node* x = *g->Placeholder("x");
  Node* fc2 = *g->CallModule("fc2", {R(h)});
  Node* scale = *g->GetAttr("scale");
  Node* mul = *g->CallFunction("aten::mul.Tensor", {R(fc2), R(scale)});
  Node* add = *g->CallFunction("aten::add.Tensor", {R(mul), R(x)});
  (void)*g->Output(Argument::Tuple({R(add)}));
  torch::jit::Module root = MakeMlp();
  absl::StatusOr<Interpreter> interp = Interpreter::Create(*g, root);
  ASSERT_TRUE(interp.ok()) << interp.status();
  EXPECT_EQ(interp->placeholders().size(), 2u);

  at::Tensor hv = Det({2, 4}, 3), xv = Det({2, 4}, 4);
  absl::StatusOr<c10::IValue> y = interp->RunNamed({{"x", xv}, {"relu", hv}});
  ASSERT_TRUE(y.ok()) << y.status();
  torch::jit::Module fc2m = root.attr("fc2").toModule();
  at::Tensor expected =
      fc2m.forward({hv}).toTensor() * root.attr("scale").toTensor() + xv;
  EXPECT_TRUE(torch::equal(y->toTupleRef().elements()[0].toTensor(), expected));

  absl::Status missing = interp->RunNamed({{"x", xv}}).status();
  EXPECT_THAT(Msg(missing), HasSubstr("missing input: relu"));
  absl::Status unknown =
      interp->RunNamed({{"x", xv}, {"relu", hv}, {"bogus", hv}}).status();
  EXPECT_THAT(Msg(unknown), HasSubstr("no placeholder named bogus"));
}

TEST(InterpreterTest, SeesTensorUpdatesMadeAfterCreate) {
  GraphModule gm(MakeMlp(), MlpGraph());
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok());
  ASSERT_TRUE(gm.SetTensor("scale", torch::zeros({4})).ok());
  // Adding a buffer gives fc1 a private type and a new object.
  ASSERT_TRUE(gm.SetTensor("fc1.extra", torch::ones({1})).ok());
  ASSERT_TRUE(gm.SetTensor("fc1.weight", torch::zeros({4, 4})).ok());
  at::Tensor x = Det({2, 4}, 1);
  absl::StatusOr<c10::IValue> y = interp->Run({x});
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(torch::equal(y->toTensor(), gm.module().forward({x}).toTensor()));
}

absl::Status CreateError(std::unique_ptr<ir::Graph> g) {
  GraphModule gm(MakeMlp(), std::move(g));
  return Interpreter::Create(gm).status();
}

// One call_function on a placeholder x, returned.
std::unique_ptr<ir::Graph> OneCall(const std::string& target,
                                   std::vector<Argument> extra_args,
                                   ir::Kwargs kwargs = {}) {
  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  std::vector<Argument> args = {R(x)};
  for (Argument& a : extra_args) args.push_back(std::move(a));
  Node* n = *g->CallFunction(target, std::move(args), std::move(kwargs), "op");
  (void)*g->Output(R(n));
  return g;
}

TEST(InterpreterErrorsTest, UnknownOperatorNamesTheNode) {
  absl::Status s = CreateError(OneCall("aten::no_such_op", {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(s), HasSubstr("%op (call_function aten::no_such_op)"));
  EXPECT_THAT(Msg(s), HasSubstr("unknown operator 'aten::no_such_op'"));

  s = CreateError(OneCall("aten::add.Nope", {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(s), HasSubstr("has no overload 'Nope'"));
  EXPECT_THAT(Msg(s), HasSubstr("aten::add.Tensor"));

  s = CreateError(OneCall("relu", {}));
  EXPECT_THAT(Msg(s), HasSubstr("no namespace"));
}

TEST(InterpreterErrorsTest, ArgumentMismatchesNameTheNodeAndSchema) {
  absl::Status s = CreateError(OneCall("aten::relu", {Argument::Int(1)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("%op"));
  EXPECT_THAT(Msg(s), HasSubstr("aten::relu takes 1 argument, got 2"));
  EXPECT_THAT(Msg(s), HasSubstr("schema: aten::relu(Tensor self) -> Tensor"));

  s = CreateError(OneCall("aten::add.Tensor", {}));
  EXPECT_THAT(Msg(s), HasSubstr("missing argument 'other'"));

  s = CreateError(
      OneCall("aten::add.Tensor", {}, {{"beta", Argument::Int(1)}}));
  EXPECT_THAT(Msg(s), HasSubstr("has no argument named 'beta'"));

  s = CreateError(OneCall("aten::sum.dim_IntList",
                          {Argument::List({Argument::Int(0)})},
                          {{"dim", Argument::List({})}}));
  EXPECT_THAT(Msg(s), HasSubstr("argument 'dim' given twice"));

  s = CreateError(OneCall("aten::add.Tensor", {Argument::String("one")}));
  EXPECT_THAT(Msg(s),
              HasSubstr("argument 'other' expects Tensor, got a constant str"));

  s = CreateError(OneCall("aten::to.dtype", {Argument::DType("float99")}));
  EXPECT_THAT(Msg(s), HasSubstr("unknown dtype 'float99'"));
}

TEST(InterpreterErrorsTest, BadAttributeAndModulePaths) {
  auto g = std::make_unique<ir::Graph>();
  (void)*g->Placeholder("x");
  Node* w = *g->GetAttr("fc1.wieght");
  (void)*g->Output(R(w));
  absl::Status s = CreateError(std::move(g));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(s), HasSubstr("get_attr fc1.wieght"));
  EXPECT_THAT(Msg(s),
              HasSubstr("module 'fc1' (Linear) has no attribute 'wieght'"));

  g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* m = *g->CallModule("scale", {R(x)});
  (void)*g->Output(R(m));
  s = CreateError(std::move(g));
  EXPECT_THAT(Msg(s), HasSubstr("'scale' is a Tensor, not a module"));

  g = std::make_unique<ir::Graph>();
  x = *g->Placeholder("x");
  m = *g->CallModule("fc9", {R(x)});
  (void)*g->Output(R(m));
  s = CreateError(std::move(g));
  EXPECT_THAT(Msg(s),
              HasSubstr("module '<root>' (Mlp) has no attribute 'fc9'"));

  g = std::make_unique<ir::Graph>();
  x = *g->Placeholder("x");
  m = *g->CallModule("fc1", {R(x), R(x)});
  (void)*g->Output(R(m));
  s = CreateError(std::move(g));
  EXPECT_THAT(Msg(s), HasSubstr("takes 1 argument, got 2"));

  g = std::make_unique<ir::Graph>();
  (void)*g->Placeholder("x");
  s = CreateError(std::move(g));
  EXPECT_THAT(Msg(s), HasSubstr("0 output nodes"));
}

TEST(InterpreterErrorsTest, RuntimeFailuresNameTheNode) {
  GraphModule gm(MakeMlp(), InlinedMlpGraph());
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok());
  absl::Status s = interp->Run({Det({2, 3}, 1)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("%linear (call_function aten::linear)"));
  EXPECT_THAT(Msg(s), HasSubstr("mat1 and mat2 shapes cannot be multiplied"));
  EXPECT_THAT(Msg(s), ::testing::Not(HasSubstr("\n")));

  // Inside a leaf module's TorchScript forward.
  GraphModule gm2(MakeMlp(), MlpGraph());
  interp = Interpreter::Create(gm2);
  ASSERT_TRUE(interp.ok());
  s = interp->Run({Det({2, 3}, 1)}).status();
  EXPECT_THAT(Msg(s), HasSubstr("%fc1 (call_module fc1)"));
  EXPECT_THAT(Msg(s), HasSubstr("mat1 and mat2 shapes cannot be multiplied"));

  s = interp->Run({}).status();
  EXPECT_THAT(Msg(s), HasSubstr("expected 1 input (x), got 0"));

  auto g = std::make_unique<ir::Graph>();
  Node* x = *g->Placeholder("x");
  Node* item = *g->CallFunction("getitem", {R(x), Argument::Int(5)});
  (void)*g->Output(R(item));
  GraphModule gm3(MakeMlp(), std::move(g));
  interp = Interpreter::Create(gm3);
  ASSERT_TRUE(interp.ok());
  c10::IValue tuple = c10::ivalue::Tuple::create({torch::ones({1})});
  s = interp->Run({tuple}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(Msg(s), HasSubstr("index 5 out of range for size 1"));
}

TEST(InterpreterErrorsTest, ThrowingHookFailsTheRun) {
  GraphModule gm(MakeMlp(), MlpGraph());
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  ASSERT_TRUE(interp.ok());
  interp->AddNodeHook([](const ir::Node& node, absl::Span<const c10::IValue>,
                         const c10::IValue*) {
    TORCH_CHECK(node.name() != "relu", "observer broke");
  });
  absl::Status s = interp->Run({Det({2, 4}, 1)}).status();
  EXPECT_THAT(Msg(s), HasSubstr("%relu"));
  EXPECT_THAT(Msg(s), HasSubstr("observer broke"));
}

}  // namespace
}  // namespace tracecut::runtime
