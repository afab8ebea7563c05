// Latency of the Interpreter and of a lowered forward against the original
// TorchScript module, on a chain of small blocks where per-node overhead
// shows (small tensors) and on one where the kernels dominate.
//
//   bazel run -c opt //runtime:interpreter_benchmark -- \
//       [--benchmark_filter=REGEX] [--benchmark_repetitions=N]
//
// Google Benchmark: the interpreter's and the lowered forward's ratios to the
// original are the rows' time ratios at equal arguments.
//
// Each block: h = relu(linear(h, w_i, b_i)) + h, either inlined (get_attr +
// aten::linear) or through a Linear leaf submodule (call_module).

#include <ATen/Parallel.h>
#include <torch/script.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"

namespace tracecut::runtime {
namespace {

using ir::Argument;
using ir::Node;

struct Model {
  torch::jit::Module module;
  std::unique_ptr<ir::Graph> graph;
};

Model Build(int blocks, int64_t width, bool leaf_modules) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module root("Chain", cu, true);
  std::string src = "def forward(self, x):\n    h = x\n";
  auto g = std::make_unique<ir::Graph>();
  Node* h = *g->Placeholder("x");
  torch::jit::Module proto;
  for (int i = 0; i < blocks; ++i) {
    at::Tensor w = torch::randn({width, width}) / std::sqrt(double(width));
    at::Tensor b = torch::randn({width}) * 0.1;
    Node* lin;
    if (leaf_modules) {
      torch::jit::Module fc;
      if (i == 0) {
        fc = torch::jit::Module("Linear", cu, true);
        fc.register_parameter("weight", w, false);
        fc.register_parameter("bias", b, false);
        fc.define(
            "def forward(self, x):\n"
            "    return torch.linear(x, self.weight, self.bias)\n");
        proto = fc;
      } else {
        fc = proto.deepcopy();
        fc.setattr("weight", w);
        fc.setattr("bias", b);
      }
      std::string name = absl::StrCat("fc", i);
      root.register_module(name, fc);
      absl::StrAppend(&src, "    h = torch.relu(self.", name,
                      ".forward(h)) + h\n");
      lin = *g->CallModule(name, {Argument::Ref(h)});
    } else {
      std::string wn = absl::StrCat("w", i), bn = absl::StrCat("b", i);
      root.register_parameter(wn, w, false);
      root.register_parameter(bn, b, false);
      absl::StrAppend(&src, "    h = torch.relu(torch.linear(h, self.", wn,
                      ", self.", bn, ")) + h\n");
      Node* wv = *g->GetAttr(wn);
      Node* bv = *g->GetAttr(bn);
      lin = *g->CallFunction(
          "aten::linear",
          {Argument::Ref(h), Argument::Ref(wv), Argument::Ref(bv)});
    }
    Node* relu = *g->CallFunction("aten::relu", {Argument::Ref(lin)});
    h = *g->CallFunction("aten::add.Tensor",
                         {Argument::Ref(relu), Argument::Ref(h)});
  }
  src += "    return h\n";
  root.define(src);
  (void)*g->Output(Argument::Ref(h));
  return {root, std::move(g)};
}

// One configuration's three ways to run the same chain, built once and
// checked to agree before anything is timed.
struct Setup {
  explicit Setup(int blocks, int64_t rows, int64_t width, bool leaf_modules)
      : model(Build(blocks, width, leaf_modules)),
        gm(model.module, std::move(model.graph)),
        x(torch::randn({rows, width})) {
    absl::StatusOr<Interpreter> i = Interpreter::Create(gm);
    absl::StatusOr<torch::jit::Module> l = LowerToTorchScript(gm);
    if (!i.ok() || !l.ok()) {
      error = absl::StrCat("setup failed: ", i.status().ToString(), " ",
                           l.status().ToString());
      return;
    }
    interp.emplace(*std::move(i));
    lowered = *std::move(l);
    at::Tensor ref = gm.module().forward({x}).toTensor();
    at::Tensor got = interp->Run({x})->toTensor();
    at::Tensor low = lowered.forward({x}).toTensor();
    if (!torch::allclose(ref, got, 1e-5, 1e-5) ||
        !torch::allclose(ref, low, 1e-5, 1e-5)) {
      error = "outputs differ from the original module";
    }
  }
  Model model;
  GraphModule gm;
  at::Tensor x;
  std::optional<Interpreter> interp;
  torch::jit::Module lowered;
  std::string error;
};

enum class Way { kOriginal, kInterpreter, kLowered };

// Args: blocks, rows, width, leaf modules (0/1).
template <Way way>
void BM_Chain(benchmark::State& state) {
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  Setup s(static_cast<int>(state.range(0)), state.range(1), state.range(2),
          state.range(3) != 0);
  if (!s.error.empty()) {
    state.SkipWithError(s.error.c_str());
    return;
  }
  auto call = [&] {
    switch (way) {
      case Way::kOriginal:
        return s.gm.module().forward({s.x});
      case Way::kInterpreter:
        return *s.interp->Run({s.x});
      case Way::kLowered:
        return s.lowered.forward({s.x});
    }
    return c10::IValue();
  };
  for (int i = 0; i < 50; ++i) call();  // Warm up (profiling executor too).
  for (auto _ : state) benchmark::DoNotOptimize(call());
  state.counters["nodes"] = static_cast<double>(s.gm.graph().size());
}

// Small tensors, where per-node overhead shows; larger ones, where the
// kernels dominate. Each with inlined linears and with Linear leaf modules.
void Configs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"blocks", "rows", "width", "leaf"});
  for (int leaf : {0, 1}) {
    b->Args({32, 1, 16, leaf});
    b->Args({8, 64, 512, leaf});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Chain<Way::kOriginal>)->Apply(Configs);
BENCHMARK(BM_Chain<Way::kInterpreter>)->Apply(Configs);
BENCHMARK(BM_Chain<Way::kLowered>)->Apply(Configs);

}  // namespace
}  // namespace tracecut::runtime

BENCHMARK_MAIN();
