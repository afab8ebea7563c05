#ifndef TRACECUT_UTIL_STATUS_H_
#define TRACECUT_UTIL_STATUS_H_

// Adding context to an error on its way up.
//
//   absl::Status s = cache.Store(name, value);
//   if (!s.ok()) return util::Annotate(s, absl::StrCat("subgraph ", i));
//
// gives "subgraph 3: <the original message>" with the original code and
// every payload (e.g. runtime's full LibTorch message, the CLI's exit code)
// kept. Building a new Status from `s.message()` by hand drops them.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::util {

// "<prefix>: <message>", same code and payloads; OK stays OK. An empty
// prefix returns `status` unchanged.
absl::Status Annotate(const absl::Status& status, absl::string_view prefix);

template <typename T>
absl::StatusOr<T> Annotate(absl::StatusOr<T> value, absl::string_view prefix) {
  if (value.ok()) return value;
  return Annotate(value.status(), prefix);
}

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_STATUS_H_
