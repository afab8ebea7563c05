#include "util/status.h"

#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tracecut::util {

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok() || prefix.empty()) return status;
  absl::Status out(status.code(), absl::StrCat(prefix, ": ", status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) {
        out.SetPayload(url, payload);
      });
  return out;
}

}  // namespace tracecut::util
