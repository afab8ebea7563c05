#ifndef TRACECUT_IR_NAMES_H_
#define TRACECUT_IR_NAMES_H_

// What the IR accepts as a name, defined once for the verifier, the text and
// protobuf forms, DOT, the tracer and the command line's module patterns.
//
//  * Node names, kwarg names and call_method targets are identifiers,
//    [A-Za-z_][A-Za-z0-9_]*, so that `%name` needs no quoting.
//  * Module paths (get_attr and call_module targets, scope entries' paths)
//    follow PyTorch: nn.Module.add_module / register_buffer /
//    register_parameter accept any non-empty name without '.', so a segment
//    may hold '-', start with a digit, be non-ASCII or contain spaces:
//    "trunk_output.block1.block1-0.proj.0" (torchvision's RegNet).
//
//   if (!IsModulePath(target)) return error(kModulePathRule);
//   std::string name = SanitizeName("block1-0.proj");  // "block1_0_proj"

#include <string>

#include "absl/strings/string_view.h"

namespace tracecut::ir {

// Separates the segments of a module path.
inline constexpr char kModulePathSeparator = '.';

// What a module path must look like, for error messages:
//   malformed call_module target "a..b": expected <kModulePathRule>
inline constexpr absl::string_view kModulePathRule =
    "a dotted path of non-empty segments without '.' (any other characters "
    "allowed, as in PyTorch), e.g. \"model.layers.0.mlp\"";

// [A-Za-z_][A-Za-z0-9_]*.
bool IsIdentifier(absl::string_view s);

// One submodule, parameter or buffer name as PyTorch accepts it: non-empty
// and without '.'. Any other byte is fine ("block1-0", "0", "a b", "\xc3\xa9").
bool IsModulePathSegment(absl::string_view segment);

// One or more IsModulePathSegment segments joined by '.': "fc", "a.0.b-1".
// Not "", ".a", "a.", "a..b".
bool IsModulePath(absl::string_view path);

// A scope entry's path: "" (the root module) or a module path.
bool IsScopePath(absl::string_view path);

// An identifier made from `hint`, for naming nodes after module paths and
// operators (as torch.fx does): every character other than [A-Za-z0-9_]
// becomes one '_' (a multi-byte UTF-8 character counts as one), a leading
// digit gets a '_' in front, and "" becomes "_". Identifiers stay as they
// are. Uniqueness is the caller's job (Graph::UniqueName).
//   SanitizeName("block1.block1-0")  // "block1_block1_0"
//   SanitizeName("0.weight")         // "_0_weight"
std::string SanitizeName(absl::string_view hint);

}  // namespace tracecut::ir

#endif  // TRACECUT_IR_NAMES_H_
