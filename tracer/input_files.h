#ifndef TRACECUT_TRACER_INPUT_FILES_H_
#define TRACECUT_TRACER_INPUT_FILES_H_

// Files of tensors for a model's forward arguments: what
// `--example-inputs=FILE` and `calibrate --data=FILE` read.
//
//   std::vector<ForwardArgument> args = ForwardArguments(module);
//   ASSIGN_OR_RETURN(c10::IValue v, ReadTensorFile("in.pt",
//   "--example-inputs")); ASSIGN_OR_RETURN(auto by_name,
//                    MatchForwardArguments(v, args, "--example-inputs: "
//                                                   "'in.pt'"));
//
// A file is read by its content, not its name:
//  * a `.safetensors` file: a dict of tensors by name;
//  * a `torch.save` file (zip or legacy pickle): whatever LibTorch's
//    unpickler reads (tensors, lists, tuples, dicts, numbers, strings).
// Matching: a dict by argument name (string keys, each an argument), a
// tuple or list by position, anything else is the first argument.

#include <torch/script.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::tracer {

// An argument of forward (without self).
struct ForwardArgument {
  std::string name;
  std::string type;  // "Tensor", "Optional[Tensor]", ...
};

std::vector<ForwardArgument> ForwardArguments(const torch::jit::Module& module);

// "input_ids: Tensor, attention_mask: Optional[Tensor]".
std::string DescribeForward(const std::vector<ForwardArgument>& args);

// Whether `bytes` start like a safetensors file (an 8-byte little-endian
// header length that fits, then a JSON object).
bool LooksLikeSafetensors(absl::string_view bytes);

// Reads a safetensors or torch.save file (see above) into one value (a
// safetensors file becomes a dict of tensors). Errors start with
// "<what>: '<path>'" and say what is wrong with the file.
absl::StatusOr<c10::IValue> ReadTensorFile(const std::string& path,
                                           absl::string_view what);

// Matches `value` to `args` (see above), in the value's order. Errors start
// with `where` ("--example-inputs: 'in.pt'") and list the forward's
// arguments with their types.
absl::StatusOr<std::vector<std::pair<std::string, c10::IValue>>>
MatchForwardArguments(const c10::IValue& value,
                      const std::vector<ForwardArgument>& args,
                      absl::string_view where);

// --example-inputs=FILE: ReadTensorFile, then MatchForwardArguments with
// module's forward, by argument name.
absl::StatusOr<std::map<std::string, c10::IValue>> ReadExampleInputs(
    const std::string& path, const torch::jit::Module& module);

}  // namespace tracecut::tracer

#endif  // TRACECUT_TRACER_INPUT_FILES_H_
