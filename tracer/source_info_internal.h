#ifndef TRACECUT_TRACER_SOURCE_INFO_INTERNAL_H_
#define TRACECUT_TRACER_SOURCE_INFO_INTERNAL_H_

// Where TorchScript nodes come from (file, line, source text), for error
// messages and IR source locations. Not part of the API.

#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/ir.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tracecut::tracer::internal {

// Where a TorchScript node came from.
struct SourceInfo {
  std::string file;
  int64_t line = 0;
  std::string line_text;  // The source line, trimmed; "" when unknown.
  std::string expr;       // The node's own source text when on one line.
};

// The range a node's source info comes from: the code that generated it
// when the model recorded that (scripted models), else its own.
std::optional<torch::jit::SourceRange> SourceRangeOf(const torch::jit::Node* n);
std::optional<SourceInfo> SourceInfoOf(const torch::jit::SourceRange& range);
std::optional<SourceInfo> SourceOf(const torch::jit::Node* n);

// What identifies a range's source info without reading its text (see
// source_info.cc).
std::string SourceKey(const torch::jit::SourceRange& range);

}  // namespace tracecut::tracer::internal

#endif  // TRACECUT_TRACER_SOURCE_INFO_INTERNAL_H_
