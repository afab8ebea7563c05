#ifndef TRACECUT_PIPELINES_INTERMEDIATES_CACHE_H_
#define TRACECUT_PIPELINES_INTERMEDIATES_CACHE_H_

// IntermediatesCache keeps the values that flow between the subgraphs of a
// sequential calibration pipeline, per calibration batch, until their last
// consumer has read them (llm-compressor's IntermediatesCache, with a memory
// budget and disk spilling added).
//
//   IntermediatesCacheOptions options;
//   options.memory_budget_bytes = int64_t{8} << 30;  // 8 GiB held at most.
//   ASSIGN_OR_RETURN(IntermediatesCache cache,
//                    IntermediatesCache::Create(options));
//   RETURN_IF_ERROR(cache.Put(batch, "layers.0:out", hidden));
//   ...
//   ASSIGN_OR_RETURN(c10::IValue h, cache.Take(batch, "layers.0:out"));
//
// Values: a c10::IValue made of tensors, tuples, lists and string-keyed or
// scalar-keyed dicts of those, and scalars (None, bool, int, double,
// complex, string, device). Other IValue kinds (objects, futures, ...) are
// rejected with InvalidArgument.
//
// Devices: Put moves every tensor to `offload_device` (stored detached from
// autograd, contiguous and compact: a view is copied so that its bytes, not
// its base's, are what is held). Get moves tensors to `compute_device`, or,
// when that is unset, back to the device each tensor was Put from. When
// those devices are equal no copy is made: the cache then shares storage
// with the tensors given to Put and returned by Get, and callers must not
// modify them in place.
//
// Memory budget: the tensor bytes held on the offload device never exceed
// `memory_budget_bytes` (-1: no limit). When a Put (or a Get that reads a
// value back from disk) would exceed it, the least recently used values are
// spilled to files in the spill directory until it fits. Get reads a spilled
// value back transparently (bit-identical: raw bytes with a checksum) and
// keeps it resident again, spilling others if needed. A file stays valid
// while its value lives, so spilling the same value again costs no write. A
// value larger than the whole budget is written straight to disk, never held,
// read from disk on every Get, and reported in notes().
//
// Failures (a spill directory that cannot be created or written, a full
// disk, a damaged spill file) come back as absl::Status; the cache stays
// consistent: a failed Put stores nothing, a failed spill keeps the victim in
// memory. Spill files are deleted on Release and on destruction, and a spill
// directory the cache created is removed on destruction.
//
// Thread-compatible: no internal locking; callers serialize access to one
// cache (const methods may run concurrently with each other).

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::pipelines {

struct IntermediatesCacheOptions {
  c10::Device offload_device = c10::Device(c10::kCPU);
  // Unset: each tensor returns to the device it was Put from.
  std::optional<c10::Device> compute_device;
  // Tensor bytes held on the offload device at most; -1: unlimited.
  int64_t memory_budget_bytes = -1;
  // Where spill files go. Empty: a fresh directory under $TMPDIR (or /tmp),
  // created on the first spill. A directory that does not exist is created
  // (one level) and removed again on destruction.
  std::string spill_dir;
  // Test hook, called before each write to a spill file with the file's path
  // and the offset about to be written; an error fails that write as a real
  // I/O error would (to simulate a full disk).
  std::function<absl::Status(const std::string& path, int64_t offset)>
      spill_write_hook_for_testing;
};

struct IntermediatesCacheStats {
  int64_t values = 0;           // Values held now (in memory or on disk).
  int64_t bytes_held = 0;       // Tensor bytes on the offload device now.
  int64_t peak_bytes_held = 0;  // Max of bytes_held over the cache's life.
  int64_t bytes_on_disk = 0;    // Tensor bytes in spill files now.
  int64_t bytes_spilled = 0;    // Tensor bytes written to spill files, total.
  int64_t spill_count = 0;      // Spill files written, total.
  int64_t reload_count = 0;     // Gets served from a spill file, total.
  int64_t oversized_count = 0;  // Puts larger than the whole budget, total.
};

class IntermediatesCache {
 public:
  // InvalidArgument for a budget below -1.
  static absl::StatusOr<IntermediatesCache> Create(
      IntermediatesCacheOptions options);

  IntermediatesCache(IntermediatesCache&&) noexcept;
  IntermediatesCache& operator=(IntermediatesCache&&) noexcept;
  ~IntermediatesCache();  // Deletes spill files.

  // Stores `value` as (batch, name), replacing (and first releasing) any
  // value there. On error nothing is stored under (batch, name).
  absl::Status Put(int64_t batch, absl::string_view name,
                   const c10::IValue& value);

  // The value, on the compute device. NotFound if absent.
  absl::StatusOr<c10::IValue> Get(int64_t batch, absl::string_view name);

  // Get, then Release: for the value's last consumer.
  absl::StatusOr<c10::IValue> Take(int64_t batch, absl::string_view name);

  // Frees the value and its spill file. NotFound if absent.
  absl::Status Release(int64_t batch, absl::string_view name);

  // Releases every value of `batch`; returns how many there were.
  int64_t ReleaseBatch(int64_t batch);

  bool Contains(int64_t batch, absl::string_view name) const;
  // True when the value is on disk only (not held in memory).
  bool IsSpilled(int64_t batch, absl::string_view name) const;
  // Names stored for `batch`, sorted.
  std::vector<std::string> Names(int64_t batch) const;

  const IntermediatesCacheStats& stats() const;
  // Human-readable notes (e.g. values larger than the budget), oldest first;
  // at most 64 are kept.
  const std::vector<std::string>& notes() const;
  // The spill directory; empty until the first spill when chosen
  // automatically.
  const std::string& spill_dir() const;
  const IntermediatesCacheOptions& options() const;

 private:
  struct State;
  explicit IntermediatesCache(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_INTERMEDIATES_CACHE_H_
