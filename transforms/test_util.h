#ifndef TRACECUT_TRANSFORMS_TEST_UTIL_H_
#define TRACECUT_TRANSFORMS_TEST_UTIL_H_

// Hand-built GraphModules for the pass tests: TorchScript leaf modules typed
// like torch.nn's (as torch.jit.trace leaves them), a root module holding
// them, and the IR graph given as text.
//
//   torch::jit::Module root = MakeRoot();
//   root.register_module("fc", MakeLinear(root, 4, 3, /*bias=*/true, 1));
//   runtime::GraphModule gm = MakeGraphModule(root, R"(graph {
//     %x = placeholder[x]()
//     %fc = call_module[fc](%x) scope[:"Root",
//     fc:"torch.nn.modules.linear.Linear"] %output = output[output](%fc)
//   })");

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "runtime/graph_module.h"
#include "transforms/transformation.h"

namespace tracecut::transforms::testing {

// A deterministic tensor with values in about [-1, 1].
torch::Tensor Rand(c10::IntArrayRef shape, uint64_t seed,
                   at::ScalarType dtype = at::kFloat);

// An empty root module (its own compilation unit).
torch::jit::Module MakeRoot(absl::string_view type = "Root");

// Leaves in `root`'s compilation unit, with deterministic parameters.
torch::jit::Module MakeLinear(const torch::jit::Module& root, int64_t in,
                              int64_t out, bool bias, uint64_t seed,
                              at::ScalarType dtype = at::kFloat);
// Hugging Face Conv1D (weight [in, out], bias [out]), typed
// "transformers.pytorch_utils.Conv1D".
torch::jit::Module MakeConv1D(const torch::jit::Module& root, int64_t in,
                              int64_t out, uint64_t seed);
torch::jit::Module MakeConv2d(const torch::jit::Module& root, int64_t in,
                              int64_t out, int64_t kernel, bool bias,
                              int64_t padding, uint64_t seed,
                              at::ScalarType dtype = at::kFloat);
// BatchNorm1d/2d in eval mode with non-trivial running statistics, as
// traced (batch_norm with training=False in forward).
torch::jit::Module MakeBatchNorm(const torch::jit::Module& root,
                                 int64_t channels, bool affine, bool two_d,
                                 uint64_t seed,
                                 at::ScalarType dtype = at::kFloat);

// Parses `ir_text` (failing the test on errors) and pairs it with `root`.
runtime::GraphModule MakeGraphModule(const torch::jit::Module& root,
                                     absl::string_view ir_text);

// Runs `gm` on `inputs` with the runtime interpreter; returns the output's
// tensors in order (tuples flattened).
absl::StatusOr<std::vector<torch::Tensor>> RunGraph(
    const runtime::GraphModule& gm, const std::vector<c10::IValue>& inputs);

// Largest relative error (max |a-b| / max |b|) over paired outputs.
double MaxRelError(const std::vector<torch::Tensor>& actual,
                   const std::vector<torch::Tensor>& expected);

// Every tensor attribute in the module tree by dotted path.
std::map<std::string, torch::Tensor> NamedTensors(
    const torch::jit::Module& root);

// "" when `a` and `b` have structurally equal graphs and the same tensor
// attribute paths with bitwise equal tensors; otherwise what differs.
std::string DiffGraphModules(const runtime::GraphModule& a,
                             const runtime::GraphModule& b);

// Pass tests from IR text (XLA's RunAndFilecheckHloRewrite, MLIR's
// one-case-per-input tests):
//
//   std::optional<runtime::GraphModule> out;
//   ASSERT_TRUE(ExpectRewrite(root, R"(graph { ...before... })",
//                             EliminateDeadCode(), R"(graph { ...after... })",
//                             &out));
//   ... numeric checks on *out ...
//   EXPECT_TRUE(ExpectNoRewrite(root, R"(graph { ... })",
//   EliminateDeadCode()));
//
// ExpectRewrite parses `before_ir` over a copy of `root` (never modified),
// runs `pass`, which must return true, checks the result with the pipeline's
// checkers (VerifyGraph, CheckModuleReferences) and compares its canonical
// text form with that of `expected_ir`, showing both on a mismatch.
// Transform marks are left out of the comparison: their data holds
// snapshots of erased nodes, checked by the passes' Reverse tests instead.
// `rewritten`, when given, receives the rewritten module.
::testing::AssertionResult ExpectRewrite(
    const torch::jit::Module& root, absl::string_view before_ir,
    Transformation&& pass, absl::string_view expected_ir,
    std::optional<runtime::GraphModule>* rewritten = nullptr);
::testing::AssertionResult ExpectRewrite(
    const torch::jit::Module& root, absl::string_view before_ir,
    Transformation& pass, absl::string_view expected_ir,
    std::optional<runtime::GraphModule>* rewritten = nullptr);

// `pass` must not fire on `ir`: it returns false and leaves the graph and
// every tensor of the module as they were.
::testing::AssertionResult ExpectNoRewrite(const torch::jit::Module& root,
                                           absl::string_view ir,
                                           Transformation&& pass);
::testing::AssertionResult ExpectNoRewrite(const torch::jit::Module& root,
                                           absl::string_view ir,
                                           Transformation& pass);

// The canonical text form of `graph` without transform marks.
std::string PrintWithoutMarks(const ir::Graph& graph);

}  // namespace tracecut::transforms::testing

#endif  // TRACECUT_TRANSFORMS_TEST_UTIL_H_
