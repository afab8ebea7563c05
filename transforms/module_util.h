#ifndef TRACECUT_TRANSFORMS_MODULE_UTIL_H_
#define TRACECUT_TRANSFORMS_MODULE_UTIL_H_

// What the fusion passes need to know about leaf modules and how they add
// new ones to a GraphModule. Internal to transforms/.
//
// Leaf modules are recognised by their demangled TorchScript type and
// checked by their attributes; their hyperparameters are read from class
// constants (torch.jit.script) or from the constants of the traced forward
// graph (torch.jit.trace), whichever the module has:
//
//   ASSIGN_OR_RETURN(torch::jit::Module m, gm.GetSubmodule(node->target()));
//   if (ClassifyLeaf(m) == LeafKind::kConv2d) {
//     ASSIGN_OR_RETURN(Conv2dLeaf conv, ReadConv2d(m));
//   }
//
// Modules the passes create (MakeLinearModule, ...) are TorchScript modules
// with a compiled forward, typed like the module they stand for
// ("torch.nn.modules.linear.Linear", mangled unique in the root's
// compilation unit), so later passes, the interpreter, calibration and export
// treat them like the originals.

#include <torch/script.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/graph_module.h"
#include "transforms/fusion_math.h"

namespace tracecut::transforms {

enum class LeafKind {
  kOther,
  kLinear,       // torch.nn.Linear: weight [O, I], optional bias [O].
  kConv1D,       // Hugging Face Conv1D: weight [I, O], bias [O].
  kConv2d,       // torch.nn.Conv2d.
  kBatchNorm1d,  // torch.nn.BatchNorm1d.
  kBatchNorm2d,  // torch.nn.BatchNorm2d.
};

absl::string_view LeafKindName(LeafKind kind);

// The demangled qualified type: "torch.nn.modules.linear.Linear".
std::string ModuleType(const torch::jit::Module& m);

// The leaf kind of `m` by type (shape checks are left to Read*).
LeafKind ClassifyLeaf(const torch::jit::Module& m);

// The tensor attribute `name`, or nullopt when absent or None.
std::optional<torch::Tensor> TensorAttr(const torch::jit::Module& m,
                                        const std::string& name);

struct LinearLeaf {
  torch::Tensor weight;  // [O, I] for Linear, [I, O] for Conv1D.
  std::optional<torch::Tensor> bias;
  bool conv1d = false;
  int64_t in_features = 0;
  int64_t out_features = 0;
  // The dimension of `weight` holding output features (0 or 1).
  int64_t out_dim() const { return conv1d ? 1 : 0; }
};
// Reads a kLinear or kConv1D module; errors say what does not fit.
absl::StatusOr<LinearLeaf> ReadLinear(const torch::jit::Module& m);

struct Conv2dLeaf {
  torch::Tensor weight;  // [O, I/groups, kH, kW]
  std::optional<torch::Tensor> bias;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
};
// Reads a kConv2d module: zero padding mode, not transposed, integer
// padding (string padding "same" is refused), from class constants
// (scripted) or from the single convolution of its traced forward.
absl::StatusOr<Conv2dLeaf> ReadConv2d(const torch::jit::Module& m);

// Reads a kBatchNorm1d/2d module in inference mode with running statistics.
// FAILED_PRECONDITION when it would use batch statistics (training, or no
// running stats), since folding is then wrong.
absl::StatusOr<fusion_math::BatchNormParams> ReadBatchNorm(
    const torch::jit::Module& m);

// New leaf modules, created in `root`'s compilation unit. Parameters keep
// the tensors given (no copy) and requires_grad is left as is.
absl::StatusOr<torch::jit::Module> MakeLinearModule(
    const torch::jit::Module& root, const torch::Tensor& weight,
    const std::optional<torch::Tensor>& bias);
// A Hugging Face style Conv1D (weight [I, O]); `type` is the demangled
// qualified type to give it (that of the modules it replaces).
absl::StatusOr<torch::jit::Module> MakeConv1DModule(
    const torch::jit::Module& root, const torch::Tensor& weight,
    const std::optional<torch::Tensor>& bias, absl::string_view type);
absl::StatusOr<torch::jit::Module> MakeConv2dModule(
    const torch::jit::Module& root, const Conv2dLeaf& conv);

// Registers `child` under the module at `parent_path` with an attribute name
// derived from `name_hint` (made a unique identifier), and returns its dotted
// path. When other modules in the tree share the parent's ClassType, the
// parent first gets a private type (as GraphModule::SetTensor does), so they
// are unaffected. Module handles taken from `gm` before the call may then be
// stale: fetch them again by path.
absl::StatusOr<std::string> AddSubmodule(runtime::GraphModule& gm,
                                         absl::string_view parent_path,
                                         absl::string_view name_hint,
                                         const torch::jit::Module& child);

// Removes the attribute (module, tensor, ...) at a dotted path that a pass
// added. Its parent's type must not be shared with other modules.
absl::Status RemoveAttribute(runtime::GraphModule& gm, absl::string_view path);

// "a.b.c" -> {"a.b", "c"}; "c" -> {"", "c"}.
std::pair<std::string, std::string> SplitParentPath(absl::string_view path);

// "a.b" + "c" -> "a.b.c"; "" + "c" -> "c".
std::string JoinPath(absl::string_view parent, absl::string_view name);

// Number of call_module nodes per target in `graph`.
absl::flat_hash_map<std::string, int> CallSiteCounts(const ir::Graph& graph);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_MODULE_UTIL_H_
