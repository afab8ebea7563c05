#ifndef TRACECUT_UTIL_HASH_H_
#define TRACECUT_UTIL_HASH_H_

// The one content hash tracecut persists (checkpoint fingerprints, run
// identities). absl::Hash is for hash tables only: it is salted per process.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tracecut::util {

// FNV-1a 64 of `bytes`, chained from `seed` (the offset basis by default):
// stable across runs and machines.
uint64_t Fnv1a64(absl::string_view bytes,
                 uint64_t seed = 0xcbf29ce484222325ULL);

}  // namespace tracecut::util

#endif  // TRACECUT_UTIL_HASH_H_
