#include "runtime/test_util.h"

#include <memory>

namespace tracecut::runtime::testing {
namespace {

std::shared_ptr<torch::jit::CompilationUnit> Cu() {
  static auto* cu = new std::shared_ptr<torch::jit::CompilationUnit>(
      std::make_shared<torch::jit::CompilationUnit>());
  return *cu;
}

void SetLinearWeights(torch::jit::Module& m, int64_t in, int64_t out,
                      uint64_t seed) {
  m.register_parameter("weight", Det({out, in}, seed), /*is_buffer=*/false);
  m.register_parameter("bias", Det({out}, seed + 1), /*is_buffer=*/false);
}

}  // namespace

torch::Tensor Det(c10::IntArrayRef shape, uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  return torch::rand(shape, gen) * 2 - 1;
}

torch::jit::Module MakeLinear(int64_t in, int64_t out, uint64_t seed) {
  torch::jit::Module m("Linear", Cu(), /*shouldMangle=*/true);
  SetLinearWeights(m, in, out, seed);
  m.define(R"(
def forward(self, x):
    return torch.linear(x, self.weight, self.bias)
)");
  return m;
}

torch::jit::Module MakeLinearLike(const torch::jit::Module& like,
                                  uint64_t seed) {
  torch::jit::Module m = like.deepcopy();
  at::Tensor w = like.attr("weight").toTensor();
  m.setattr("weight", Det(w.sizes(), seed));
  m.setattr("bias", Det({w.size(0)}, seed + 1));
  return m;
}

torch::jit::Module MakeMlp() {
  torch::jit::Module root("Mlp", Cu(), /*shouldMangle=*/true);
  torch::jit::Module fc1 = MakeLinear(4, 4, 1);
  root.register_module("fc1", fc1);
  root.register_module("fc2", MakeLinearLike(fc1, 3));
  root.register_module("fc3", MakeLinear(4, 2, 5));
  root.register_buffer("scale", Det({4}, 7));
  root.define(R"(
def forward(self, x):
    h = torch.relu(self.fc1.forward(x))
    h = self.fc2.forward(h) * self.scale
    return self.fc3.forward(h + x)
)");
  return root;
}

}  // namespace tracecut::runtime::testing
