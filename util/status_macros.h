#ifndef TRACECUT_UTIL_STATUS_MACROS_H_
#define TRACECUT_UTIL_STATUS_MACROS_H_

// Status plumbing macros. Abseil 20220623 (Debian bookworm) ships no public
// RETURN_IF_ERROR / ASSIGN_OR_RETURN, so tracecut keeps its own.
//
//   RETURN_IF_ERROR(graph.Erase(node));
//   ASSIGN_OR_RETURN(Node* n, graph.CallFunction("aten::relu", {x}));

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TRACECUT_STATUS_CONCAT_INNER_(a, b) a##b
#define TRACECUT_STATUS_CONCAT_(a, b) TRACECUT_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status tracecut_status_ = (expr);            \
    if (!tracecut_status_.ok()) return tracecut_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  TRACECUT_ASSIGN_OR_RETURN_IMPL_(  \
      TRACECUT_STATUS_CONCAT_(tracecut_statusor_, __LINE__), lhs, expr)

#define TRACECUT_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // TRACECUT_UTIL_STATUS_MACROS_H_
