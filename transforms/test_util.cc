#include "transforms/test_util.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ir/text.h"
#include "runtime/interpreter.h"
#include "transforms/fusion_math.h"
#include "transforms/instrumentation.h"
#include "transforms/module_util.h"

namespace tracecut::transforms::testing {
namespace {

using torch::jit::Module;

Module NewLeaf(const Module& root, absl::string_view type) {
  Module m(c10::QualifiedName(absl::StrCat("__torch__.", type)),
           root._ivalue()->compilation_unit(), /*shouldMangle=*/true);
  m.register_attribute("training", c10::BoolType::get(), false);
  return m;
}

void Flatten(const c10::IValue& v, std::vector<torch::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) Flatten(e, out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) Flatten(e, out);
  }
}

}  // namespace

torch::Tensor Rand(c10::IntArrayRef shape, uint64_t seed,
                   at::ScalarType dtype) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return (at::rand(shape, gen) * 2 - 1).to(dtype);
}

Module MakeRoot(absl::string_view type) {
  Module m(c10::QualifiedName(absl::StrCat("__torch__.", type)),
           std::make_shared<torch::jit::CompilationUnit>(),
           /*shouldMangle=*/true);
  m.register_attribute("training", c10::BoolType::get(), false);
  return m;
}

Module MakeLinear(const Module& root, int64_t in, int64_t out, bool bias,
                  uint64_t seed, at::ScalarType dtype) {
  std::optional<torch::Tensor> b;
  if (bias) b = Rand({out}, seed + 1, dtype);
  return MakeLinearModule(root, Rand({out, in}, seed, dtype), b).value();
}

Module MakeConv1D(const Module& root, int64_t in, int64_t out, uint64_t seed) {
  return MakeConv1DModule(root, Rand({in, out}, seed), Rand({out}, seed + 1),
                          "transformers.pytorch_utils.Conv1D")
      .value();
}

Module MakeConv2d(const Module& root, int64_t in, int64_t out, int64_t kernel,
                  bool bias, int64_t padding, uint64_t seed,
                  at::ScalarType dtype) {
  Conv2dLeaf conv;
  conv.weight = Rand({out, in, kernel, kernel}, seed, dtype);
  if (bias) conv.bias = Rand({out}, seed + 1, dtype);
  conv.stride = {1, 1};
  conv.padding = {padding, padding};
  conv.dilation = {1, 1};
  conv.groups = 1;
  return MakeConv2dModule(root, conv).value();
}

Module MakeBatchNorm(const Module& root, int64_t channels, bool affine,
                     bool two_d, uint64_t seed, at::ScalarType dtype) {
  Module m = NewLeaf(root, two_d ? "torch.nn.modules.batchnorm.BatchNorm2d"
                                 : "torch.nn.modules.batchnorm.BatchNorm1d");
  if (affine) {
    m.register_parameter("weight", Rand({channels}, seed, dtype) + 1.5, false);
    m.register_parameter("bias", Rand({channels}, seed + 1, dtype), false);
  }
  m.register_buffer("running_mean", Rand({channels}, seed + 2, dtype));
  m.register_buffer("running_var",
                    Rand({channels}, seed + 3, dtype).abs() + 0.5);
  m.register_buffer("num_batches_tracked", torch::tensor(int64_t{10}));
  m.define(absl::StrCat(
      R"(
def forward(self, input: Tensor) -> Tensor:
    return torch.batch_norm(input, )",
      affine ? "self.weight, self.bias" : "None, None",
      R"(, self.running_mean, self.running_var, False, 0.1, 1e-05, False)
)"));
  return m;
}

runtime::GraphModule MakeGraphModule(const Module& root,
                                     absl::string_view ir_text) {
  auto graph = ir::ParseGraph(ir_text);
  EXPECT_TRUE(graph.ok()) << graph.status();
  if (!graph.ok())
    return runtime::GraphModule(root, std::make_unique<ir::Graph>());
  return runtime::GraphModule(root, std::move(graph).value());
}

absl::StatusOr<std::vector<torch::Tensor>> RunGraph(
    const runtime::GraphModule& gm, const std::vector<c10::IValue>& inputs) {
  auto interp = runtime::Interpreter::Create(gm);
  if (!interp.ok()) return interp.status();
  auto out = interp->Run(inputs);
  if (!out.ok()) return out.status();
  std::vector<torch::Tensor> tensors;
  Flatten(*out, tensors);
  return tensors;
}

double MaxRelError(const std::vector<torch::Tensor>& actual,
                   const std::vector<torch::Tensor>& expected) {
  if (actual.size() != expected.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    worst = std::max(
        worst, fusion_math::CompareTensors(actual[i], expected[i]).max_rel);
  }
  return worst;
}

std::map<std::string, torch::Tensor> NamedTensors(const Module& root) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& sub : root.named_modules()) {
    const c10::ClassTypePtr& type = sub.value.type();
    for (size_t i = 0; i < type->numAttributes(); ++i) {
      c10::IValue v = sub.value._ivalue()->getSlot(i);
      if (!v.isTensor()) continue;
      const std::string& attr = type->getAttributeName(i);
      out[sub.name.empty() ? attr : absl::StrCat(sub.name, ".", attr)] =
          v.toTensor();
    }
  }
  return out;
}

std::string DiffGraphModules(const runtime::GraphModule& a,
                             const runtime::GraphModule& b) {
  if (!ir::StructurallyEqual(a.graph(), b.graph())) {
    return absl::StrCat("graphs differ:\n", ir::PrintGraph(a.graph()),
                        "--- versus ---\n", ir::PrintGraph(b.graph()));
  }
  const auto ta = NamedTensors(a.module());
  const auto tb = NamedTensors(b.module());
  for (const auto& [path, t] : ta) {
    auto it = tb.find(path);
    if (it == tb.end()) return absl::StrCat("only the first has ", path);
    if (!fusion_math::BitwiseEqual(t, it->second)) {
      return absl::StrCat("tensor ", path, " differs");
    }
  }
  for (const auto& [path, t] : tb) {
    if (!ta.count(path)) return absl::StrCat("only the second has ", path);
  }
  return "";
}

std::string PrintWithoutMarks(const ir::Graph& graph) {
  std::unique_ptr<ir::Graph> copy = graph.Clone();
  for (ir::Node* n : copy->nodes()) n->meta().transforms.clear();
  return ir::PrintGraph(*copy);
}

namespace {

// `ir` over a deep copy of `root`.
absl::StatusOr<runtime::GraphModule> Load(const torch::jit::Module& root,
                                          absl::string_view ir) {
  absl::StatusOr<std::unique_ptr<ir::Graph>> graph = ir::ParseGraph(ir);
  if (!graph.ok()) return graph.status();
  return runtime::GraphModule(root, *std::move(graph)).Clone();
}

}  // namespace

::testing::AssertionResult ExpectRewrite(
    const torch::jit::Module& root, absl::string_view before_ir,
    Transformation& pass, absl::string_view expected_ir,
    std::optional<runtime::GraphModule>* rewritten) {
  absl::StatusOr<runtime::GraphModule> gm = Load(root, before_ir);
  if (!gm.ok()) {
    return ::testing::AssertionFailure()
           << "the input IR does not load: " << gm.status();
  }
  absl::StatusOr<std::unique_ptr<ir::Graph>> expected =
      ir::ParseGraph(expected_ir);
  if (!expected.ok()) {
    return ::testing::AssertionFailure()
           << "the expected IR does not parse: " << expected.status();
  }
  absl::StatusOr<bool> changed = pass.Run(*gm);
  if (!changed.ok()) {
    return ::testing::AssertionFailure()
           << pass.name() << " failed: " << changed.status();
  }
  if (!*changed) {
    return ::testing::AssertionFailure() << pass.name() << " did not fire on\n"
                                         << ir::PrintGraph(gm->graph());
  }
  for (absl::Status s : {VerifyGraph(*gm), CheckModuleReferences(*gm)}) {
    if (!s.ok()) {
      return ::testing::AssertionFailure() << "the IR after " << pass.name()
                                           << " does not verify: " << s << "\n"
                                           << ir::PrintGraph(gm->graph());
    }
  }
  const std::string actual_text = PrintWithoutMarks(gm->graph());
  const std::string expected_text = PrintWithoutMarks(**expected);
  if (actual_text != expected_text) {
    return ::testing::AssertionFailure() << "after " << pass.name() << ":\n"
                                         << actual_text << "--- expected ---\n"
                                         << expected_text;
  }
  if (rewritten != nullptr) rewritten->emplace(*std::move(gm));
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult ExpectRewrite(
    const torch::jit::Module& root, absl::string_view before_ir,
    Transformation&& pass, absl::string_view expected_ir,
    std::optional<runtime::GraphModule>* rewritten) {
  return ExpectRewrite(root, before_ir, pass, expected_ir, rewritten);
}

::testing::AssertionResult ExpectNoRewrite(const torch::jit::Module& root,
                                           absl::string_view ir,
                                           Transformation& pass) {
  absl::StatusOr<runtime::GraphModule> gm = Load(root, ir);
  if (!gm.ok()) {
    return ::testing::AssertionFailure()
           << "the input IR does not load: " << gm.status();
  }
  absl::StatusOr<runtime::GraphModule> copy = gm->Clone();
  if (!copy.ok()) return ::testing::AssertionFailure() << copy.status();
  absl::StatusOr<bool> changed = pass.Run(*copy);
  if (!changed.ok()) {
    return ::testing::AssertionFailure()
           << pass.name() << " failed: " << changed.status();
  }
  if (*changed) {
    return ::testing::AssertionFailure()
           << pass.name() << " fired (returned true):\n"
           << ir::PrintGraph(copy->graph());
  }
  const std::string diff = DiffGraphModules(*copy, *gm);
  if (!diff.empty()) {
    return ::testing::AssertionFailure()
           << pass.name() << " returned false but changed the module: " << diff;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult ExpectNoRewrite(const torch::jit::Module& root,
                                           absl::string_view ir,
                                           Transformation&& pass) {
  return ExpectNoRewrite(root, ir, pass);
}

}  // namespace tracecut::transforms::testing
