#include "runtime/finite.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"

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

}  // namespace

absl::Status CheckFinite(const at::Tensor& t, absl::string_view what,
                         bool allow_infinite) {
  if (!t.defined() || !at::isFloatingType(t.scalar_type())) {
    return absl::OkStatus();
  }
  return TorchCall(what, [&]() -> absl::Status {
    at::Tensor flat = t.detach().reshape({-1});
    // isfinite has no 1-byte float kernels (float8 zero points, e8m0).
    if (flat.element_size() == 1) flat = flat.to(at::kFloat);
    const int64_t n = flat.numel();
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      at::Tensor part = flat.slice(0, begin, std::min(n, begin + kChunk));
      at::Tensor bad = allow_infinite ? at::isnan(part) : ~at::isfinite(part);
      if (!bad.any().item<bool>()) continue;
      const int64_t k = begin + bad.nonzero().select(1, 0)[0].item<int64_t>();
      const double v = flat[k].item<double>();
      return absl::InvalidArgumentError(absl::StrCat(
          what, " has ", std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf"),
          " at ", MultiIndex(k, t.sizes()), " (element ", k, " of ", n, ")"));
    }
    return absl::OkStatus();
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
