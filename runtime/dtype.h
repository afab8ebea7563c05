#ifndef TRACECUT_RUNTIME_DTYPE_H_
#define TRACECUT_RUNTIME_DTYPE_H_

// Dtype names (docs/ir_conventions.md) and LibTorch scalar types: the one
// table that the IR, the interpreter, lowering, the tracer and example-input
// specs share.
//
//   ASSIGN_OR_RETURN(c10::ScalarType t, ParseDType("bfloat16"));
//   DTypeName(at::kFloat);  // "float32"

#include <c10/core/ScalarType.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tracecut::runtime {

// "float32" -> at::kFloat, ... (the canonical names, plus "torch." prefixed
// forms and PyTorch's aliases "float", "half", "long", ...).
absl::StatusOr<c10::ScalarType> ParseDType(absl::string_view name);

// at::kFloat -> "float32"; the inverse of ParseDType's canonical names
// (c10's own name for a type without one).
std::string DTypeName(c10::ScalarType type);

// The canonical names of the dense, non-quantized dtypes ("float32", ...,
// "complex128"): what example inputs may be made of.
absl::Span<const absl::string_view> InputDTypeNames();

// Whether `name` is one of InputDTypeNames() (exactly; no aliases).
bool IsInputDType(absl::string_view name);

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_DTYPE_H_
