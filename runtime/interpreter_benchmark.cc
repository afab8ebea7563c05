// Latency of the Interpreter and of a lowered forward against the original
// TorchScript module, on a chain of small blocks where per-node overhead
// shows (small tensors) and on one where the kernels dominate.
//
//   bazel run -c opt //runtime:interpreter_benchmark -- [iterations]
//
// Each block: h = relu(linear(h, w_i, b_i)) + h, either inlined (get_attr +
// aten::linear) or through a Linear leaf submodule (call_module).

#include <ATen/Parallel.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// Median microseconds per call over `reps` repetitions of `iters` calls.
double Time(const std::function<void()>& fn, int iters, int reps) {
  for (int i = 0; i < 50; ++i) fn();  // Warm up (profiling executor too).
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    std::chrono::duration<double, std::micro> d =
        std::chrono::steady_clock::now() - start;
    per_call.push_back(d.count() / iters);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

void Bench(const char* label, int blocks, int64_t rows, int64_t width,
           bool leaf_modules, int iters) {
  Model m = Build(blocks, width, leaf_modules);
  GraphModule gm(m.module, std::move(m.graph));
  absl::StatusOr<Interpreter> interp = Interpreter::Create(gm);
  absl::StatusOr<torch::jit::Module> lowered = LowerToTorchScript(gm);
  if (!interp.ok() || !lowered.ok()) {
    std::fprintf(stderr, "setup failed: %s %s\n",
                 interp.status().ToString().c_str(),
                 lowered.status().ToString().c_str());
    std::exit(1);
  }
  at::Tensor x = torch::randn({rows, width});
  at::Tensor ref = gm.module().forward({x}).toTensor();
  at::Tensor got = interp->Run({x})->toTensor();
  at::Tensor low = lowered->forward({x}).toTensor();
  if (!torch::allclose(ref, got, 1e-5, 1e-5) ||
      !torch::allclose(ref, low, 1e-5, 1e-5)) {
    std::fprintf(stderr, "%s: outputs differ\n", label);
    std::exit(1);
  }
  const int reps = 7;
  double t_orig = Time([&] { gm.module().forward({x}); }, iters, reps);
  double t_interp = Time([&] { (void)interp->Run({x}); }, iters, reps);
  double t_low = Time([&] { lowered->forward({x}); }, iters, reps);
  std::printf(
      "%-34s nodes=%4zu  original %8.2f us  interpreter %8.2f us (%.3fx)  "
      "lowered %8.2f us (%.3fx)\n",
      label, gm.graph().size(), t_orig, t_interp, t_interp / t_orig, t_low,
      t_low / t_orig);
}

}  // namespace
}  // namespace tracecut::runtime

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 300;
  at::set_num_threads(1);
  torch::NoGradGuard no_grad;
  using tracecut::runtime::Bench;
  Bench("inlined, 32 blocks, [1,16]", 32, 1, 16, false, iters);
  Bench("leaf modules, 32 blocks, [1,16]", 32, 1, 16, true, iters);
  Bench("inlined, 8 blocks, [64,512]", 8, 64, 512, false, iters / 4 + 1);
  Bench("leaf modules, 8 blocks, [64,512]", 8, 64, 512, true, iters / 4 + 1);
  return 0;
}
