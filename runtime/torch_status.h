#ifndef TRACECUT_RUNTIME_TORCH_STATUS_H_
#define TRACECUT_RUNTIME_TORCH_STATUS_H_

// Converts LibTorch exceptions into absl::Status at tracecut's boundary.
//
// LibTorch reports errors by throwing (c10::Error and its subclasses,
// torch::jit::ErrorReport, std::runtime_error from the TorchScript
// interpreter). tracecut never lets them escape: every call into LibTorch
// that can throw goes through TorchCall, which returns a Status whose message
// is "<context>: <the useful line of the LibTorch message>".
//
//   ASSIGN_OR_RETURN(torch::jit::Module m,
//                    TorchCall(absl::StrCat("loading ", path),
//                              [&] { return torch::jit::load(path); }));
//   RETURN_IF_ERROR(TorchCall("saving", [&] { m.save(path); }));
//
// The full message (without C++ backtrace) travels as the status payload
// kTorchMessagePayload, for callers that want to show everything.
//
// This header includes no LibTorch headers: only the .cc knows c10::Error.

#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::runtime {

// Status payload URL under which the full LibTorch message is attached.
inline constexpr absl::string_view kTorchMessagePayload =
    "tracecut/torch-message";

// The line of a LibTorch exception message worth showing: for c10::Error the
// first line of the message without backtrace; for TorchScript interpreter
// errors ("The following operation failed in the TorchScript interpreter.
// ...") the final "SomeError: message" line without its prefix; otherwise
// the first non-empty line.
std::string TorchErrorSummary(const std::exception& e);

// True for allocation failures: std::bad_alloc, c10::OutOfMemoryError and
// the CPU allocator's "can't allocate memory" c10::Error.
bool IsOutOfMemory(const std::exception& e);

// Converts an exception to a Status: "<context>: <summary>" (just the summary
// when `context` is empty). Codes: c10::IndexError -> OUT_OF_RANGE,
// ValueError/TypeError and ordinary operator failures -> INVALID_ARGUMENT,
// NotImplementedError -> UNIMPLEMENTED, out of memory (std::bad_alloc,
// c10::OutOfMemoryError) -> RESOURCE_EXHAUSTED with the summary "out of
// memory: cannot allocate 7.8 MiB" (the size when LibTorch reports it),
// "No such file" -> NOT_FOUND, internal asserts -> INTERNAL, anything that is
// not a std::exception -> UNKNOWN.
absl::Status StatusFromException(std::exception_ptr e,
                                 absl::string_view context);

namespace internal {

template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {};

// The Status type TorchCall returns for a callable returning R.
template <typename R>
using TorchCallResult = std::conditional_t<
    std::is_void_v<R> || std::is_same_v<R, absl::Status>, absl::Status,
    std::conditional_t<IsStatusOr<R>::value, R, absl::StatusOr<R>>>;

}  // namespace internal

// Runs `fn()` and converts any exception it throws into a Status (see
// StatusFromException). Returns absl::Status when `fn` returns void or
// absl::Status, the StatusOr itself when it returns a StatusOr, and
// absl::StatusOr<R> when it returns anything else.
template <typename F>
auto TorchCall(absl::string_view context, F&& fn)
    -> internal::TorchCallResult<std::invoke_result_t<F&&>> {
  using R = std::invoke_result_t<F&&>;
  try {
    if constexpr (std::is_void_v<R>) {
      std::forward<F>(fn)();
      return absl::OkStatus();
    } else {
      return std::forward<F>(fn)();
    }
  }
#if defined(__GLIBCXX__)
  // Thread cancellation unwinds with this; it must not be swallowed.
  catch (abi::__forced_unwind&) {
    throw;
  }
#endif
  catch (...) {
    return StatusFromException(std::current_exception(), context);
  }
}

}  // namespace tracecut::runtime

#endif  // TRACECUT_RUNTIME_TORCH_STATUS_H_
