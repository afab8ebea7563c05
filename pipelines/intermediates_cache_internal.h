#ifndef TRACECUT_PIPELINES_INTERMEDIATES_CACHE_INTERNAL_H_
#define TRACECUT_PIPELINES_INTERMEDIATES_CACHE_INTERNAL_H_

// The intermediates cache's spill files (intermediates_cache_spill.cc).
// Not API: intermediates_cache.h is.

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tracecut::pipelines::internal {

// (batch, name) of a cached value.
using CacheKey = std::pair<int64_t, std::string>;

// "batch 3 'layers.0:out'".
std::string Describe(const CacheKey& key);

// One tensor of a stored value, in depth-first order.
struct TensorMeta {
  bool defined = false;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes;
  c10::Device onload_device = c10::Device(c10::kCPU);
  int64_t nbytes = 0;
};

// IntermediatesCacheOptions::spill_write_hook_for_testing.
using SpillWriteHook =
    std::function<absl::Status(const std::string& path, int64_t offset)>;

// Creates the spill file `path` (it must not exist) holding the CPU tensors
// `cpu` (contiguous; the defined, non-empty tensors of `metas`, in order)
// of the value at `key`, `bytes` in all: a header from `metas`, the raw
// bytes and a checksum. On failure the file is removed.
absl::Status WriteSpillFile(const std::string& path, const CacheKey& key,
                            const std::vector<at::Tensor>& cpu,
                            const std::vector<TensorMeta>& metas, int64_t bytes,
                            const SpillWriteHook& hook);

// The CPU tensors (undefined where `metas` says so) of a file WriteSpillFile
// wrote for `metas`. DataLoss if it is missing, truncated, for other
// tensors or damaged.
absl::StatusOr<std::vector<at::Tensor>> ReadSpillFile(
    const std::string& path, const CacheKey& key,
    const std::vector<TensorMeta>& metas);

}  // namespace tracecut::pipelines::internal

#endif  // TRACECUT_PIPELINES_INTERMEDIATES_CACHE_INTERNAL_H_
