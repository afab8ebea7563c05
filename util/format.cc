#include "util/format.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace tracecut::util {

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B",   "KiB", "MiB",
                                           "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  // snprintf, not absl::StrFormat: the system Abseil's str_format symbols
  // are weak and get dropped by --as-needed links.
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace tracecut::util
