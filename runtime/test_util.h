#ifndef TRACECUT_RUNTIME_TEST_UTIL_H_
#define TRACECUT_RUNTIME_TEST_UTIL_H_

// Small TorchScript modules for the runtime tests, built in C++.

#include <torch/script.h>

#include <cstdint>
#include <string>

namespace tracecut::runtime::testing {

// A Linear-like leaf module (new ClassType per call) with deterministic
// weight [out, in] and bias [out]:
//   def forward(self, x): return torch.linear(x, self.weight, self.bias)
torch::jit::Module MakeLinear(int64_t in, int64_t out, uint64_t seed);

// The same type as `like` (instances share the ClassType, as torch.jit.trace
// does for identical submodules), fresh deterministic weights.
torch::jit::Module MakeLinearLike(const torch::jit::Module& like,
                                  uint64_t seed);

// Mlp: fc1 = Linear(4, 4), fc2 = Linear(4, 4) of fc1's type, fc3 =
// Linear(4, 2), buffer scale [4]:
//   def forward(self, x):
//       h = torch.relu(self.fc1.forward(x))
//       h = self.fc2.forward(h) * self.scale
//       return self.fc3.forward(h + x)
torch::jit::Module MakeMlp();

// A deterministic tensor of the given shape (values in [-1, 1]).
torch::Tensor Det(c10::IntArrayRef shape, uint64_t seed);

}  // namespace tracecut::runtime::testing

#endif  // TRACECUT_RUNTIME_TEST_UTIL_H_
