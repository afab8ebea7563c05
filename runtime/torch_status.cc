#include "runtime/torch_status.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "util/format.h"

namespace tracecut::runtime {
namespace {

constexpr absl::string_view kInterpreterHeader =
    "The following operation failed in the TorchScript interpreter.";

// "RuntimeError: msg" -> {"RuntimeError", "msg"}; the prefix must be an
// identifier ending in "Error" or "Exception" at the start of the line.
bool SplitPythonErrorLine(absl::string_view line, absl::string_view* type,
                          absl::string_view* message) {
  size_t colon = line.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view prefix = line.substr(0, colon);
  for (char c : prefix) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        c != '.') {
      return false;
    }
  }
  if (!absl::EndsWith(prefix, "Error") &&
      !absl::EndsWith(prefix, "Exception")) {
    return false;
  }
  *type = prefix;
  *message = line.substr(colon + 2);
  return true;
}

// For TorchScript interpreter errors: the last "XError: message" line (the
// original error; the rest is a TorchScript traceback). Returns false when
// there is none.
bool InterpreterErrorLine(absl::string_view text, absl::string_view* type,
                          absl::string_view* message) {
  bool found = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() ||
        absl::ascii_isspace(static_cast<unsigned char>(line[0])))
      continue;
    absl::string_view t, m;
    if (SplitPythonErrorLine(absl::StripTrailingAsciiWhitespace(line), &t,
                             &m)) {
      *type = t;
      *message = m;
      found = true;
    }
  }
  return found;
}

absl::StatusCode CodeForPythonErrorType(absl::string_view type) {
  if (type == "IndexError") return absl::StatusCode::kOutOfRange;
  if (type == "NotImplementedError") return absl::StatusCode::kUnimplemented;
  return absl::StatusCode::kInvalidArgument;
}

// The message without C++ backtrace.
std::string FullMessage(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

absl::StatusCode CodeFor(const std::exception& e, absl::string_view full) {
  if (IsOutOfMemory(e)) return absl::StatusCode::kResourceExhausted;
  if (dynamic_cast<const c10::IndexError*>(&e) != nullptr) {
    return absl::StatusCode::kOutOfRange;
  }
  if (dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr) {
    return absl::StatusCode::kUnimplemented;
  }
  if (absl::StrContains(full, "INTERNAL ASSERT FAILED")) {
    return absl::StatusCode::kInternal;
  }
  if (absl::StrContains(full, "No such file or directory")) {
    return absl::StatusCode::kNotFound;
  }
  if (absl::StartsWith(full, kInterpreterHeader)) {
    absl::string_view type, message;
    if (InterpreterErrorLine(full, &type, &message)) {
      return CodeForPythonErrorType(type);
    }
  }
  return absl::StatusCode::kInvalidArgument;
}

std::string Summary(absl::string_view full) {
  if (absl::StartsWith(full, kInterpreterHeader)) {
    absl::string_view type, message;
    if (InterpreterErrorLine(full, &type, &message)) {
      return std::string(message);
    }
  }
  // The first non-empty line; when it only introduces the next one
  // ("aten::relu(Tensor self) -> Tensor:" then "Expected a value of type
  // ..."), both.
  std::vector<absl::string_view> lines;
  for (absl::string_view line : absl::StrSplit(full, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) lines.push_back(line);
    if (lines.size() == 2) break;
  }
  if (lines.empty()) return "unknown LibTorch error";
  if (lines.size() == 2 && absl::EndsWith(lines[0], ":") &&
      !absl::StartsWith(lines[1], "File \"")) {
    return absl::StrCat(lines[0], " ", lines[1]);
  }
  return std::string(lines[0]);
}

// One line for an allocation failure: "out of memory: cannot allocate 7.8
// MiB" when LibTorch's allocator says how much ("... you tried to allocate
// 8192000 bytes ..."), else "out of memory (<summary>)".
std::string OutOfMemorySummary(absl::string_view full,
                               absl::string_view summary) {
  constexpr absl::string_view kTried = "tried to allocate ";
  size_t at = full.find(kTried);
  if (at != absl::string_view::npos) {
    absl::string_view rest = full.substr(at + kTried.size());
    size_t end = 0;
    while (end < rest.size() && absl::ascii_isdigit(rest[end])) ++end;
    int64_t bytes = 0;
    if (absl::SimpleAtoi(rest.substr(0, end), &bytes)) {
      return absl::StrCat("out of memory: cannot allocate ",
                          util::HumanBytes(bytes));
    }
  }
  return absl::StrCat("out of memory (", summary, ")");
}

}  // namespace

bool IsOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
      dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) {
    return true;
  }
  // The CPU allocator fails with a plain c10::Error (an enforce):
  // "DefaultCPUAllocator: can't allocate memory: you tried to allocate N
  // bytes. Error code 12 (Cannot allocate memory)", which the TorchScript
  // interpreter may rethrow as another exception type with that message.
  return absl::StrContains(FullMessage(e), "can't allocate memory");
}

std::string TorchErrorSummary(const std::exception& e) {
  return Summary(FullMessage(e));
}

absl::Status StatusFromException(std::exception_ptr e,
                                 absl::string_view context) {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string full;
  std::string summary;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    full = FullMessage(ex);
    code = CodeFor(ex, full);
    summary = Summary(full);
    if (code == absl::StatusCode::kResourceExhausted) {
      summary = OutOfMemorySummary(full, summary);
    }
  } catch (...) {
    summary = "unknown exception (not a std::exception)";
    full = summary;
  }
  absl::Status status(
      code, context.empty() ? summary : absl::StrCat(context, ": ", summary));
  status.SetPayload(kTorchMessagePayload, absl::Cord(full));
  return status;
}

}  // namespace tracecut::runtime
