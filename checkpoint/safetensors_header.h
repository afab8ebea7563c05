#ifndef TRACECUT_CHECKPOINT_SAFETENSORS_HEADER_H_
#define TRACECUT_CHECKPOINT_SAFETENSORS_HEADER_H_

// The header of a safetensors file, validated as the reference
// implementation (huggingface/safetensors, Rust: `Metadata::validate`) does,
// without LibTorch, so a fuzzer can drive it alone:
//
//   ASSIGN_OR_RETURN(SafetensorsHeader h,
//                    ParseSafetensorsHeader(bytes, "model.safetensors"));
//   for (const auto& [name, e] : h.tensors) ... e.dtype, e.shape, e.begin ...
//
// A file is refused (InvalidArgument, "<name>: not a valid safetensors file:
// <why>", naming the tensor where there is one) when the header length is
// over 100 MB or past the end of the file, the header is not one JSON
// object, a name appears twice at any level, "__metadata__" is not
// {string: string}, a dtype is unknown, a dimension is not a non-negative
// integer, shape x dtype overflows or differs from the byte length, or the
// byte ranges, sorted, are not contiguous from 0 to exactly the end of the
// file (no gap, no overlap, no trailing bytes).

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tracecut::checkpoint {

// The reference implementation's limit (safetensors' MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string dtype;  // "F32", "BF16", ...: one of SafetensorsDTypeBits's.
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // Byte offsets into the data section.
};

struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + header length: where the data begins.
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Bits per element of a safetensors dtype name; 0 for an unknown name.
int SafetensorsDTypeBits(absl::string_view dtype);

// Parses and validates the header of `file` (the whole file's bytes; only
// the header is copied). `name` stands for the file in errors.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view file, absl::string_view name);

}  // namespace tracecut::checkpoint

#endif  // TRACECUT_CHECKPOINT_SAFETENSORS_HEADER_H_
