#include "util/hash.h"

namespace tracecut::util {

uint64_t Fnv1a64(absl::string_view bytes, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace tracecut::util
