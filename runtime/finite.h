#ifndef TRACECUT_RUNTIME_FINITE_H_
#define TRACECUT_RUNTIME_FINITE_H_

// Checks that tensors hold no NaN or infinity, naming the first bad element:
// what calibration checks on a model's weights at load and on every
// quantization parameter before anything is written.
//
//   RETURN_IF_ERROR(CheckFinite(scale, "model.layers.0.mlp.up_proj "
//                                      "weight_scale"));
//   RETURN_IF_ERROR(CheckModuleFinite(module, "llama.pt"));

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/api/module.h>

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::runtime {

// The row-major index of the first NaN (or, with allow_infinite false,
// +-inf) in `t`; -1 when there is none, for an undefined tensor and for
// non-floating dtypes. Contiguous CPU tensors of 2- to 8-byte floats are
// scanned in place by their bits (no mask tensor), others in chunks.
absl::StatusOr<int64_t> FirstNonFinite(const at::Tensor& t,
                                       bool allow_infinite = false);

// InvalidArgument "WHAT has NaN at [i, j] (element k of N)" for the first
// NaN (or, with allow_infinite false, +-inf) in row-major order; OK for an
// undefined tensor and for non-floating dtypes. Scans in chunks, so the
// extra memory is bounded whatever the tensor's size.
absl::Status CheckFinite(const at::Tensor& t, absl::string_view what,
                         bool allow_infinite = false);

// Every parameter of `module` (recursively) finite, and every buffer free of
// NaN: buffers may hold infinities on purpose (additive attention masks are
// filled with -inf). Errors name `source` and the tensor's path. Paths in
// `skip` are not checked (tensors not loaded yet, checked when they are).
absl::Status CheckModuleFinite(const torch::jit::Module& module,
                               absl::string_view source,
                               const std::set<std::string>& skip = {});

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_FINITE_H_
