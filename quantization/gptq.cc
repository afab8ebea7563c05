#include "quantization/gptq.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quantization/quantize.h"
#include "runtime/finite.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

bool Grouped(const QuantScheme& scheme) {
  return !scheme.per_tensor && scheme.group_size > 0;
}

absl::Status CheckOptions(const GptqOptions& options) {
  RETURN_IF_ERROR(options.scheme.Validate());
  if (!(options.dampening_frac >= 0) ||
      !std::isfinite(options.dampening_frac)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dampening_frac must be finite and >= 0, got ",
                     options.dampening_frac));
  }
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be > 0, got ", options.block_size));
  }
  return absl::OkStatus();
}

// The upper Cholesky factor of the inverse of damped `h`, or an explanation
// of why there is none. `h` is modified (damped) in place.
absl::StatusOr<at::Tensor> InverseHessianFactor(at::Tensor& h,
                                                double dampening_frac) {
  const double damp = dampening_frac * h.diagonal().mean().item<double>();
  h.diagonal().add_(damp);
  at::Tensor lower;
  at::Tensor info;
  std::tie(lower, info) =
      at::linalg_cholesky_ex(h, /*upper=*/false, /*check_errors=*/false);
  if (int64_t minor = info.item<int64_t>(); minor != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the Hessian is not positive definite after dampening by ",
                     damp, " (Cholesky failed at leading minor ", minor, ")"));
  }
  at::Tensor inverse = at::cholesky_inverse(lower, /*upper=*/false);
  at::Tensor upper;
  std::tie(upper, info) =
      at::linalg_cholesky_ex(inverse, /*upper=*/true, /*check_errors=*/false);
  if (int64_t minor = info.item<int64_t>(); minor != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the inverse Hessian is not positive definite (Cholesky failed at "
        "leading minor ",
        minor, ")"));
  }
  if (!at::isfinite(upper).all().item<bool>()) {
    return absl::FailedPreconditionError(
        "the inverse Hessian factor has NaN or infinite entries");
  }
  return upper;
}

// The Hessian as the solver uses it: an fp32 copy on the weight's device,
// dead columns (zero diagonal) given 1 on the diagonal and their weights in
// `wt` zeroed. A non-finite one makes `result` fall back to
// round-to-nearest.
absl::StatusOr<at::Tensor> SolverHessian(const at::Tensor& weight,
                                         const at::Tensor& hessian,
                                         at::Tensor& wt, GptqResult& result) {
  const int64_t columns = weight.size(1);
  if (!hessian.defined() || hessian.dim() != 2 || hessian.size(0) != columns ||
      hessian.size(1) != columns ||
      !at::isFloatingType(hessian.scalar_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Hessian of a ", internal::DescribeTensor(weight),
                     " weight must be a floating [", columns, ", ", columns,
                     "] tensor, got ", internal::DescribeTensor(hessian)));
  }

  at::Tensor h = hessian.to(wt.device(), at::kFloat, /*non_blocking=*/false,
                            /*copy=*/true);

  const bool finite_h = at::isfinite(h).all().item<bool>();
  if (!finite_h) {
    result.fell_back_to_rtn = true;
    result.warning =
        "GPTQ: the Hessian has NaN or infinite entries; fell back to "
        "round-to-nearest";
  } else {
    at::Tensor dead = (h.diagonal() == 0).nonzero().squeeze(1);
    result.num_dead_columns = dead.numel();
    if (dead.numel() > 0) {
      h.index_put_({dead, dead}, 1.0);
      wt.index_fill_(0, dead, 0.0);
    }
  }
  return h;
}

absl::StatusOr<GptqResult> GptqQuantizeImpl(const at::Tensor& weight,
                                            const at::Tensor& hessian,
                                            const GptqOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  RETURN_IF_ERROR(internal::CheckWeight(weight, "weight"));
  const QuantScheme& scheme = options.scheme;
  const int64_t rows = weight.size(0);
  const int64_t columns = weight.size(1);
  GptqResult result;
  // Columns are rows here: wt[c] is column c of the weight, contiguous.
  at::Tensor wt = weight.to(at::kFloat).t().contiguous();
  ASSIGN_OR_RETURN(at::Tensor h, SolverHessian(weight, hessian, wt, result));
  const bool finite_h = !result.fell_back_to_rtn;

  // Note [GPTQ in tracecut] 8: parameters of the original groups, now.
  std::vector<at::Tensor> group_scales;
  std::vector<at::Tensor> group_zeros;
  const bool grouped = Grouped(scheme);
  const bool static_groups = grouped && options.static_groups;
  if (static_groups) {
    for (int64_t col = 0; col < columns; col += scheme.group_size) {
      const int64_t width = std::min(scheme.group_size, columns - col);
      QuantParams p = internal::MinMaxParams(wt.narrow(0, col, width).t(),
                                             scheme, /*per_tensor=*/false);
      group_scales.push_back(p.scale);
      group_zeros.push_back(p.zero_point);
    }
  }

  at::Tensor perm;
  if (options.act_order && finite_h) {
    perm = at::argsort(h.diagonal(), /*stable=*/true, /*dim=*/0,
                       /*descending=*/true);
    wt = wt.index_select(0, perm);
    h = h.index_select(0, perm).index_select(1, perm);
  }

  at::Tensor hinv;
  if (finite_h) {
    absl::StatusOr<at::Tensor> factor =
        InverseHessianFactor(h, options.dampening_frac);
    if (factor.ok()) {
      hinv = *std::move(factor);
    } else {
      result.fell_back_to_rtn = true;
      result.warning =
          absl::StrCat("GPTQ: ", factor.status().message(),
                       "; fell back to round-to-nearest (consider a larger "
                       "dampening_frac or more calibration samples)");
    }
  }
  h = at::Tensor();  // Free the [in, in] copy early.
  if (!hinv.defined()) {
    hinv = at::eye(columns, wt.options());
  }
  const at::Tensor hinv_diag = hinv.diagonal().to(at::kCPU).contiguous();
  const auto d_of = hinv_diag.accessor<float, 1>();

  // Per-tensor / per-channel parameters are fixed up front; groups are
  // found on entry (Note [GPTQ in tracecut] 5).
  at::Tensor scale;
  at::Tensor zero;
  if (!grouped) {
    QuantParams p = internal::MinMaxParams(wt.t(), scheme,
                                           /*per_tensor=*/scheme.per_tensor);
    result.scale = p.scale;
    result.zero_point = p.zero_point;
    scale = p.scale.reshape({-1});  // [rows] or [1], broadcasts over rows.
    zero = p.zero_point.reshape({-1}).to(at::kFloat);
  }

  const int64_t qmin = scheme.qmin();
  const int64_t qmax = scheme.qmax();
  at::Tensor qt = at::empty_like(wt);
  // The original column at each position (static groups).
  const at::Tensor original =
      perm.defined() ? perm.to(at::kCPU).contiguous()
                     : at::arange(columns, at::TensorOptions(at::kLong));
  const auto original_of = original.accessor<int64_t, 1>();
  int64_t current_group = -1;
  double loss = 0;
  for (int64_t i1 = 0; i1 < columns; i1 += options.block_size) {
    const int64_t i2 = std::min(i1 + options.block_size, columns);
    const int64_t count = i2 - i1;
    at::Tensor w1 = wt.narrow(0, i1, count);  // A view: updated in place.
    at::Tensor hinv1 = hinv.narrow(0, i1, count).narrow(1, i1, count);
    at::Tensor err1 = at::empty({count, rows}, wt.options());
    for (int64_t i = 0; i < count; ++i) {
      const int64_t col = i1 + i;
      if (static_groups) {
        const int64_t g = original_of[col] / scheme.group_size;
        if (g != current_group) {
          scale = group_scales[g].reshape({-1});
          zero = group_zeros[g].reshape({-1}).to(at::kFloat);
          current_group = g;
        }
      } else if (grouped && col % scheme.group_size == 0) {
        const int64_t width = std::min(scheme.group_size, columns - col);
        QuantParams p = internal::MinMaxParams(wt.narrow(0, col, width).t(),
                                               scheme, /*per_tensor=*/false);
        group_scales.push_back(p.scale);
        group_zeros.push_back(p.zero_point);
        scale = p.scale.reshape({-1});
        zero = p.zero_point.reshape({-1}).to(at::kFloat);
      }
      at::Tensor w = w1[i];
      at::Tensor q = internal::FakeQuantizeFp32(w, scale, zero, qmin, qmax);
      qt[col].copy_(q);
      at::Tensor err = (w - q).div_(d_of[col]);
      err1[i].copy_(err);
      if (i + 1 < count) {
        w1.narrow(0, i + 1, count - i - 1)
            .addr_(hinv1[i].narrow(0, i + 1, count - i - 1), err,
                   /*beta=*/1, /*alpha=*/-1);
      }
    }
    // sum (w - q)^2 / d^2 = sum err^2; halved as the reference reports it.
    loss += err1.to(at::kDouble).square().sum().item<double>() / 2;
    if (i2 < columns) {
      wt.narrow(0, i2, columns - i2)
          .addmm_(hinv.narrow(0, i1, count).narrow(1, i2, columns - i2).t(),
                  err1, /*beta=*/1, /*alpha=*/-1);
    }
  }
  result.loss = loss;

  at::Tensor q = qt.t();
  at::Tensor inverse_perm;
  if (perm.defined()) {
    inverse_perm = at::argsort(perm);
    q = q.index_select(1, inverse_perm);
  }
  result.weight = q.to(weight.scalar_type()).contiguous();
  if (grouped) {
    result.scale = at::cat(group_scales, 1);
    result.zero_point = at::cat(group_zeros, 1);
    if (options.act_order && !static_groups) {
      at::Tensor group_of_position =
          at::arange(columns, wt.options().dtype(at::kLong))
              .div(scheme.group_size, "floor");
      result.g_idx = (inverse_perm.defined()
                          ? group_of_position.index_select(0, inverse_perm)
                          : group_of_position)
                         .to(at::kInt);
    }
  }
  return result;
}

// Note [Symmetric accumulation]: (first column, width) of each block;
// one block below 2 * kMinSymmetricBlock columns, at most 8.
constexpr int64_t kMinSymmetricBlock = 512;

std::vector<std::pair<int64_t, int64_t>> SymmetricBlocks(int64_t columns) {
  const int64_t count = std::clamp<int64_t>(columns / kMinSymmetricBlock, 1, 8);
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t begin = columns * b / count;
    blocks.emplace_back(begin, columns * (b + 1) / count - begin);
  }
  return blocks;
}

}  // namespace

HessianAccumulator::HessianAccumulator(int64_t columns)
    : columns_(columns),
      hessian_(at::zeros(
          {std::max<int64_t>(columns, 0), std::max<int64_t>(columns, 0)},
          at::kFloat)) {}

HessianAccumulator HessianAccumulator::Summing(int64_t columns) {
  HessianAccumulator h(columns);
  h.summing_ = true;
  return h;
}

HessianAccumulator HessianAccumulator::FromSum(at::Tensor sum,
                                               int64_t num_samples,
                                               int64_t num_tokens) {
  HessianAccumulator h(0);
  h.columns_ = sum.size(0);
  h.num_samples_ = num_samples;
  h.num_tokens_ = num_tokens;
  h.hessian_ = num_samples > 0 ? sum.to(at::kFloat) *
                                     (2.0 / static_cast<double>(num_samples))
                               : sum.to(at::kFloat);
  return h;
}

HessianAccumulator HessianAccumulator::Clone() const {
  HessianAccumulator h = *this;
  h.hessian_ = hessian_.clone();
  return h;
}

absl::Status HessianAccumulator::Add(const at::Tensor& inputs) {
  return runtime::TorchCall("HessianAccumulator::Add", [&]() -> absl::Status {
    if (columns_ <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "HessianAccumulator was built with ", columns_, " columns"));
    }
    if (!inputs.defined() || inputs.dim() < 1 || inputs.size(-1) != columns_ ||
        !at::isFloatingType(inputs.scalar_type())) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer inputs must be a floating [..., ", columns_,
                       "] tensor, got ", internal::DescribeTensor(inputs)));
    }
    int64_t samples = 1;
    for (int64_t d = 0; d + 2 < inputs.dim(); ++d) samples *= inputs.size(d);
    const int64_t tokens = inputs.numel() / columns_;
    if (tokens == 0) return absl::OkStatus();
    if (num_samples_ == 0 && hessian_.device() != inputs.device()) {
      hessian_ = hessian_.to(inputs.device());
    }
    at::Tensor x =
        inputs.reshape({tokens, columns_}).to(hessian_.device(), at::kFloat);
    ASSIGN_OR_RETURN(const int64_t bad, runtime::FirstNonFinite(x));
    if (bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer inputs ", internal::DescribeTensor(inputs),
                       " have NaN or infinite entries"));
    }
    // Allocations first, then the in-place updates: an allocation failure
    // leaves the accumulator as it was.
    const int64_t total = num_samples_ + samples;
    if (!summing_) x = x * std::sqrt(2.0 / static_cast<double>(total));
    const double keep =
        static_cast<double>(num_samples_) / static_cast<double>(total);
    // Note [Symmetric accumulation]: the whole matrix is one block.
    const std::vector<std::pair<int64_t, int64_t>> blocks =
        hessian_.device().is_cpu()
            ? SymmetricBlocks(columns_)
            : std::vector<std::pair<int64_t, int64_t>>{{0, columns_}};
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto [ri, ni] = blocks[i];
      for (size_t j = i; j < blocks.size(); ++j) {
        const auto [rj, nj] = blocks[j];
        at::Tensor h = hessian_.narrow(0, ri, ni).narrow(1, rj, nj);
        if (!summing_) h.mul_(keep);
        h.addmm_(x.narrow(1, ri, ni).t(), x.narrow(1, rj, nj));
      }
    }
    lower_stale_ = lower_stale_ || blocks.size() > 1;
    num_samples_ = total;
    num_tokens_ += tokens;
    return absl::OkStatus();
  });
}

const at::Tensor& HessianAccumulator::hessian() const {
  if (!lower_stale_) return hessian_;
  // Below the diagonal blocks, each element from its mirror image above,
  // in tiles (both reads and writes stay in cache lines). The diagonal
  // blocks keep what their products gave. CPU fp32 contiguous, no
  // allocation: it cannot fail.
  const std::vector<std::pair<int64_t, int64_t>> blocks =
      SymmetricBlocks(columns_);
  float* h = hessian_.data_ptr<float>();
  const int64_t n = columns_;
  constexpr int64_t kTile = 64;
  at::parallel_for(
      0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t b0, int64_t b1) {
        for (int64_t j = b0; j < b1; ++j) {  // Block row j, columns of i < j.
          const auto [rj, nj] = blocks[j];
          const int64_t lower_end = rj;  // Columns [0, rj) are below block j.
          for (int64_t r0 = rj; r0 < rj + nj; r0 += kTile) {
            for (int64_t c0 = 0; c0 < lower_end; c0 += kTile) {
              const int64_t r1 = std::min(rj + nj, r0 + kTile);
              const int64_t c1 = std::min(lower_end, c0 + kTile);
              for (int64_t r = r0; r < r1; ++r) {
                for (int64_t c = c0; c < c1; ++c) h[r * n + c] = h[c * n + r];
              }
            }
          }
        }
      });
  lower_stale_ = false;
  return hessian_;
}

absl::StatusOr<double> SymmetricQuadraticForm(const at::Tensor& x,
                                              const at::Tensor& h) {
  if (x.dim() != 2 || h.dim() != 2 || h.size(0) != h.size(1) ||
      x.size(1) != h.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a quadratic form needs x [rows, n] and H [n, n], got ",
        internal::DescribeTensor(x), " and ", internal::DescribeTensor(h)));
  }
  return runtime::TorchCall("output error", [&]() -> double {
    const at::Tensor xf = x.detach().to(at::kFloat);
    const at::Tensor hf = h.detach().to(at::kFloat);
    const std::vector<std::pair<int64_t, int64_t>> blocks =
        SymmetricBlocks(h.size(0));
    double total = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto [ri, ni] = blocks[i];
      for (size_t j = i; j < blocks.size(); ++j) {
        const auto [rj, nj] = blocks[j];
        at::Tensor part =
            xf.narrow(1, ri, ni).mm(hf.narrow(0, ri, ni).narrow(1, rj, nj));
        const double sum = part.mul_(xf.narrow(1, rj, nj)).sum().item<double>();
        total += i == j ? sum : 2 * sum;
      }
    }
    return total;
  });
}

absl::StatusOr<GptqResult> GptqQuantize(const at::Tensor& weight,
                                        const at::Tensor& hessian,
                                        const GptqOptions& options) {
  return runtime::TorchCall("GptqQuantize", [&] {
    return GptqQuantizeImpl(weight, hessian, options);
  });
}

absl::StatusOr<at::Tensor> GptqRequantize(const GptqResult& result,
                                          const QuantScheme& scheme) {
  return runtime::TorchCall(
      "GptqRequantize", [&]() -> absl::StatusOr<at::Tensor> {
        RETURN_IF_ERROR(scheme.Validate());
        RETURN_IF_ERROR(internal::CheckWeight(result.weight, "result.weight"));
        const int64_t rows = result.weight.size(0);
        const int64_t columns = result.weight.size(1);
        at::Tensor scale;
        at::Tensor zero;
        if (result.g_idx.defined()) {
          at::Tensor g = result.g_idx.to(at::kLong);
          scale = result.scale.index_select(1, g);
          zero = result.zero_point.index_select(1, g);
        } else {
          scale =
              internal::ExpandToColumns(result.scale, scheme, rows, columns);
          zero = internal::ExpandToColumns(result.zero_point, scheme, rows,
                                           columns);
        }
        return internal::FakeQuantizeFp32(result.weight.to(at::kFloat),
                                          scale.to(at::kFloat), zero,
                                          scheme.qmin(), scheme.qmax());
      });
}

}  // namespace tracecut::quantization
