#ifndef TRACECUT_RUNTIME_OP_SCHEMA_H_
#define TRACECUT_RUNTIME_OP_SCHEMA_H_

// How IR call_function nodes meet LibTorch operator schemas
// (docs/ir_conventions.md): resolving a target to its registered operator,
// binding a node's args/kwargs to schema arguments, and turning constant
// Arguments (dtypes, devices, lists, ...) into IValues. Shared by the
// interpreter and lowering; the tracer can use ParseDType/DTypeName to stay
// in step with them.
//
//   ASSIGN_OR_RETURN(auto op, ResolveOperator("aten::add.Tensor"));
//   ASSIGN_OR_RETURN(std::vector<const ir::Argument*> bound,
//                    BindArguments(node, op->schema()));

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "runtime/dtype.h"

namespace tracecut::runtime {

// The one call_function target that is not a registered operator: element
// `index` of a tuple, list or dict value (args: value, index).
inline constexpr absl::string_view kGetItemTarget = "getitem";

// Splits "aten::add.Tensor" into {"aten::add", "Tensor"} ("aten::linear" has
// overload ""). The dot is searched after the "ns::" prefix.
c10::OperatorName ParseOperatorName(absl::string_view target);

// The registered operator for a call_function target, or NOT_FOUND naming
// the target and listing the overloads that do exist.
absl::StatusOr<std::shared_ptr<torch::jit::Operator>> ResolveOperator(
    absl::string_view target);

// Which of `node`'s Arguments feeds each argument of `schema`, from schema
// argument `first` on (1 skips a method's self): positional args in order,
// then kwargs by name. nullptr where the node omits an argument that has a
// default. For vararg schemas, extra positional args are appended after the
// declared ones. Errors (INVALID_ARGUMENT) name the node and show the schema:
// too many args, unknown or duplicate kwargs, missing required arguments.
absl::StatusOr<std::vector<const ir::Argument*>> BindArguments(
    const ir::Node& node, const c10::FunctionSchema& schema, size_t first = 0);

// ParseDType and DTypeName: runtime/dtype.h.
// "cpu", "cuda:0", ...
absl::StatusOr<c10::Device> ParseDevice(absl::string_view name);

// The element type of a list type, looking through Optional; nullptr when
// `type` is not a list (or is null).
c10::TypePtr ListElementType(const c10::TypePtr& type);

// A constant Argument as an IValue for a schema argument of type `type`
// (nullptr: no schema, e.g. graph outputs). Int converts to float where the
// schema wants a float; DType becomes a ScalarType (an int IValue); Device a
// c10::Device; lists get the schema's element type, or one unified from the
// elements when there is no schema or the schema's is generic (t[]).
// Errors on node references.
absl::StatusOr<c10::IValue> ConstantToIValue(const ir::Argument& arg,
                                             const c10::TypePtr& type);

// The type of the list made of `elements`: Tensor when all are tensors,
// otherwise their unified type (INVALID_ARGUMENT if there is none); Any for
// an empty list.
absl::StatusOr<c10::TypePtr> UnifiedElementType(
    const std::vector<c10::IValue>& elements);

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_OP_SCHEMA_H_
