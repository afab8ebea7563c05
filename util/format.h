#ifndef TRACECUT_UTIL_FORMAT_H_
#define TRACECUT_UTIL_FORMAT_H_

// Numbers as people read them in messages and tables.

#include <cstdint>
#include <string>

namespace tracecut::util {

// "512 B", "7.8 MiB", "1.0 GiB" (binary units, one decimal from KiB up).
std::string HumanBytes(int64_t bytes);

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_FORMAT_H_
