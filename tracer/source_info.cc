#include <torch/csrc/jit/frontend/source_range.h>
#include <torch/csrc/jit/ir/ir.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "tracer/source_info_internal.h"

namespace tracecut::tracer::internal {
namespace {

namespace jit = torch::jit;

// Traced graphs record the Python stack as their "source": lines like
// "path/to/file.py(42): forward", innermost frame first. They are not code.
bool LooksLikeTraceStack(absl::string_view text, absl::string_view file) {
  return !file.empty() && text.size() > file.size() &&
         absl::StartsWith(text, file) && text[file.size()] == '(';
}

// The frame of a traced stack worth pointing at: the innermost one outside
// torch's own Python package (operator overloads such as Tensor.__rsub__
// live there), else the innermost.
std::optional<std::pair<std::string, int64_t>> ModelFrame(
    absl::string_view stack) {
  std::optional<std::pair<std::string, int64_t>> first;
  for (absl::string_view line : absl::StrSplit(stack, '\n')) {
    size_t close = line.find("): ");
    size_t open = line.rfind('(', close);
    if (close == absl::string_view::npos || open == absl::string_view::npos) {
      continue;
    }
    int64_t lineno;
    if (!absl::SimpleAtoi(line.substr(open + 1, close - open - 1), &lineno)) {
      continue;
    }
    std::pair<std::string, int64_t> frame(std::string(line.substr(0, open)),
                                          lineno);
    if (!first.has_value()) first = frame;
    if (frame.first.find("/torch/") == std::string::npos) return frame;
  }
  return first;
}

}  // namespace

std::optional<jit::SourceRange> SourceRangeOf(const jit::Node* n) {
  try {
    jit::SourceRange range = n->sourceRange();
    if (!range.source()) return std::nullopt;
    if (auto original = range.findSourceRangeThatGenerated()) {
      range = *original;
    }
    return range;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<SourceInfo> SourceInfoOf(const jit::SourceRange& range) {
  try {
    auto flc = range.file_line_col();
    if (!flc.has_value()) return std::nullopt;
    SourceInfo info;
    info.file = std::get<0>(*flc);
    info.line = static_cast<int64_t>(std::get<1>(*flc));
    if (info.file.empty()) return std::nullopt;
    const std::shared_ptr<jit::Source>& src = range.source();
    if (range.start() < src->size()) {
      size_t lineno = src->lineno_for_offset(range.start());
      std::string line = src->get_line(lineno).str();
      absl::string_view t = absl::StripAsciiWhitespace(line);
      if (!LooksLikeTraceStack(t, info.file)) {
        info.line_text = std::string(t);
      } else if (auto frame = ModelFrame(src->text_str().str())) {
        info.file = frame->first;
        info.line = frame->second;
      }
      // Only a short range can be a one-line expression (traced stacks,
      // which are long, are not copied).
      if (range.end() <= src->size() && range.end() > range.start() &&
          range.end() - range.start() <= 200) {
        std::string expr = range.text().str();
        if (expr.find('\n') == std::string::npos &&
            !LooksLikeTraceStack(expr, info.file)) {
          info.expr = std::string(absl::StripAsciiWhitespace(expr));
        }
      }
    }
    return info;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<SourceInfo> SourceOf(const jit::Node* n) {
  std::optional<jit::SourceRange> range = SourceRangeOf(n);
  if (!range.has_value()) return std::nullopt;
  return SourceInfoOf(*range);
}

// What identifies a range's source info without reading its text: the
// range, the source's file and first line, and the memory of its text.
// Loaded models keep one copy of each distinct source text (TorchScript's
// serializer deduplicates them) that all Source objects with that text view,
// so the nodes of every instance of a module share a key.
std::string SourceKey(const jit::SourceRange& range) {
  jit::Source& src = *range.source();
  const jit::StringCordView& text = src.text_str();
  std::string key =
      absl::StrCat(range.start(), ":", range.end(), ":", src.starting_line_no(),
                   ":", src.filename().value_or(""), ":");
  for (size_t i = 0, covered = 0; covered < text.size(); ++i) {
    c10::string_view piece = text.piece(i);
    absl::StrAppend(&key, reinterpret_cast<uintptr_t>(piece.data()), "+",
                    piece.size(), ";");
    covered += piece.size();
  }
  return key;
}

}  // namespace tracecut::tracer::internal
