#include "runtime/finite.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::runtime {
namespace {

// Elements scanned at a time (the scan allocates a bool mask this big).
constexpr int64_t kChunk = int64_t{1} << 24;

std::string MultiIndex(int64_t flat, c10::IntArrayRef sizes) {
  std::vector<int64_t> index(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    index[d] = sizes[d] == 0 ? 0 : flat % sizes[d];
    flat = sizes[d] == 0 ? 0 : flat / sizes[d];
  }
  return absl::StrCat("[", absl::StrJoin(index, ", "), "]");
}

// FirstNonFinite on raw bits: an element is NaN or infinite when its
// exponent bits are all set, NaN when its mantissa is not zero as well.
// Blocks of kBlock elements are OR-reduced without a branch (vectorized);
// only a block with a bad element is scanned again for its index.
template <typename Bits>
int64_t FirstBadBits(const Bits* p, int64_t n, Bits exponent, Bits mantissa,
                     bool allow_infinite) {
  constexpr int64_t kBlock = 4096;
  // Without allow_infinite any mantissa, zero included, makes it bad.
  const Bits marker = allow_infinite ? mantissa : static_cast<Bits>(~Bits{0});
  const Bits some = allow_infinite ? Bits{0} : Bits{1};
  auto bad = [&](Bits x) {
    return (x & exponent) == exponent && ((x & marker) | some) != 0;
  };
  std::atomic<int64_t> first{n};
  at::parallel_for(
      0, (n + kBlock - 1) / kBlock, 64, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
          // Branch-free, so that it vectorizes: all-ones where the
          // exponent is, masked by the mantissa test.
          Bits any = 0;
          for (int64_t i = begin; i < end; ++i) {
            const Bits x = p[i];
            const Bits all_set =
                static_cast<Bits>(Bits{0} - ((x & exponent) == exponent));
            any |= all_set & ((x & marker) | some);
          }
          if (any == 0) continue;
          int64_t i = begin;
          while (!bad(p[i])) ++i;
          int64_t seen = first.load();
          while (i < seen && !first.compare_exchange_weak(seen, i)) {
          }
          return;  // Later blocks of this range hold only later elements.
        }
      });
  return first.load() == n ? -1 : first.load();
}

}  // namespace

absl::StatusOr<int64_t> FirstNonFinite(const at::Tensor& t,
                                       bool allow_infinite) {
  if (!t.defined() || !at::isFloatingType(t.scalar_type())) return -1;
  if (t.device().is_cpu() && t.is_contiguous()) {
    const int64_t n = t.numel();
    switch (t.scalar_type()) {
      case at::kFloat:
        return FirstBadBits<uint32_t>(
            static_cast<const uint32_t*>(t.const_data_ptr()), n, 0x7F800000u,
            0x007FFFFFu, allow_infinite);
      case at::kDouble:
        return FirstBadBits<uint64_t>(
            static_cast<const uint64_t*>(t.const_data_ptr()), n,
            0x7FF0000000000000ull, 0x000FFFFFFFFFFFFFull, allow_infinite);
      case at::kBFloat16:
        return FirstBadBits<uint16_t>(
            static_cast<const uint16_t*>(t.const_data_ptr()), n,
            uint16_t{0x7F80}, uint16_t{0x007F}, allow_infinite);
      case at::kHalf:
        return FirstBadBits<uint16_t>(
            static_cast<const uint16_t*>(t.const_data_ptr()), n,
            uint16_t{0x7C00}, uint16_t{0x03FF}, allow_infinite);
      default:
        break;
    }
  }
  return TorchCall("finite check", [&]() -> int64_t {
    at::Tensor flat = t.detach().reshape({-1});
    // isfinite has no 1-byte float kernels (float8 zero points, e8m0).
    if (flat.element_size() == 1) flat = flat.to(at::kFloat);
    const int64_t n = flat.numel();
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      at::Tensor part = flat.slice(0, begin, std::min(n, begin + kChunk));
      at::Tensor bad = allow_infinite ? at::isnan(part) : ~at::isfinite(part);
      if (!bad.any().item<bool>()) continue;
      return begin + bad.nonzero().select(1, 0)[0].item<int64_t>();
    }
    return -1;
  });
}

absl::Status CheckFinite(const at::Tensor& t, absl::string_view what,
                         bool allow_infinite) {
  ASSIGN_OR_RETURN(const int64_t k, FirstNonFinite(t, allow_infinite));
  if (k < 0) return absl::OkStatus();
  return TorchCall(what, [&]() -> absl::Status {
    const double v = t.detach().reshape({-1})[k].item<double>();
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf"), " at ",
        MultiIndex(k, t.sizes()), " (element ", k, " of ", t.numel(), ")"));
  });
}

absl::Status CheckModuleFinite(const torch::jit::Module& module,
                               absl::string_view source,
                               const std::set<std::string>& skip) {
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (skip.contains(p.name)) continue;
    absl::Status s =
        CheckFinite(p.value, absl::StrCat(source, ": parameter ", p.name));
    if (!s.ok()) return s;
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    if (skip.contains(b.name)) continue;
    absl::Status s =
        CheckFinite(b.value, absl::StrCat(source, ": buffer ", b.name),
                    /*allow_infinite=*/true);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tracecut::runtime
