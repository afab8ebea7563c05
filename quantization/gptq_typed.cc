#include "quantization/gptq_typed.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/native/BatchLinearAlgebra.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

// column_scale_window over all columns: per-row, per-column values [rows,
// cols] of a [rows or 1, groups or 1] (or block [row blocks, col blocks])
// parameter, for columns in the order `g_idx` lists their groups.
at::Tensor PerColumn(const at::Tensor& p, const QuantizationArgs& args,
                     const at::Tensor& g_idx, int64_t rows, int64_t cols) {
  switch (args.resolved_strategy()) {
    case Strategy::kTensor:
      return p.reshape({1, 1}).expand({rows, cols});
    case Strategy::kChannel:
      return p.slice(1, 0, 1).expand({rows, cols});
    case Strategy::kGroup:
    case Strategy::kTensorGroup:
      return p.index_select(1, g_idx);
    default: {  // Block.
      const int64_t bh = (*args.block_structure)[0];
      at::Tensor row_idx =
          at::floor_divide(at::arange(rows, g_idx.options()), bh);
      return p.index_select(1, g_idx).index_select(0, row_idx);
    }
  }
}

// One block's four [rows, width] fp32 buffers (contiguous).
struct BlockBuffers {
  float* w;
  float* q;
  float* err;
  float* losses;
};

// IntegerColumns: gptq_block_update for an integer scheme, by rows: within
// a block each row has its own scales and sees only its own errors, so rows
// run in parallel without a tensor op per column (which costs more than
// the arithmetic at these sizes). The operations are the tensor loop's in
// its order, each rounded where it rounds (the dequantized value in the
// scale's dtype S, the error's product before the subtraction: the library
// builds with -ffp-contract=off), so the result has the same bits; the
// test runs both.

// The scale dtype's conversions, as c10's (BFloat16: round to nearest
// even, NaN to 0x7FC0; its arithmetic is float's, rounded back), written
// without c10's branch on NaN so that the compiler vectorizes the step
// across rows.
template <typename S>
[[gnu::always_inline]] inline float Widen(S v) {
  return static_cast<float>(v);
}
template <typename S>
[[gnu::always_inline]] inline S Narrow(float f) {
  return static_cast<S>(f);
}
template <>
[[gnu::always_inline]] inline c10::BFloat16 Narrow(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t rounded = (u + 0x7FFFU + ((u >> 16) & 1U)) >> 16;
  return c10::BFloat16(static_cast<uint16_t>(f != f ? 0x7FC0U : rounded),
                       c10::BFloat16::from_bits());
}

// The element step of the column loop: column i of one row, from its
// current value x; returns the error and sets q. `dequant * s` and
// `dequant - z` are S's operations (in float, rounded to S).
template <typename S>
[[gnu::always_inline]] inline float ColumnStep(float x, S s, const float* z,
                                               float h_ii, float q_min,
                                               float q_max, float& q) {
  float scaled = x / Widen(s);
  if (z) scaled += *z;
  const float rounded =
      std::nearbyint(std::min(std::max(scaled, q_min), q_max));
  S dequant = Narrow<S>(rounded);
  if (z) dequant = Narrow<S>(Widen(dequant) - Widen(Narrow<S>(*z)));
  q = Widen(Narrow<S>(Widen(dequant) * Widen(s)));
  return (x - q) / h_ii;
}

// One row of IntegerColumns.
template <typename S>
[[gnu::always_inline]] inline void ColumnsOfRow(
    BlockBuffers b, const float* hinv, int64_t hinv_stride, const S* scale,
    const float* zero_point, int64_t param_stride, int64_t r, int64_t width,
    float q_min, float q_max) {
  float* w = b.w + r * width;
  const S* s = scale + r * param_stride;
  const float* z = zero_point ? zero_point + r * param_stride : nullptr;
  for (int64_t i = 0; i < width; ++i) {
    const float* h = hinv + i * hinv_stride;
    float q;
    const float error =
        ColumnStep(w[i], s[i], z ? z + i : nullptr, h[i], q_min, q_max, q);
    b.q[r * width + i] = q;
    b.err[r * width + i] = error;
    b.losses[r * width + i] = error * error;
    for (int64_t j = i; j < width; ++j) w[j] -= error * h[j];
  }
}

// kRowGroup rows of IntegerColumns at once, transposed into `scratch`
// (width x kRowGroup per buffer) so that each step runs across the rows:
// one row's columns form a chain (column i + 1 waits for column i's
// update), which left the loop waiting on its divisions; rows are
// independent, so a group fills the vector lanes. Each element sees the
// same operations in the same order as in ColumnsOfRow.
constexpr int64_t kRowGroup = 16;

template <typename S>
[[gnu::always_inline]] inline void ColumnsOfRowGroup(
    BlockBuffers b, const float* hinv, int64_t hinv_stride, const S* scale,
    const float* zero_point, int64_t param_stride, int64_t r0, int64_t width,
    float q_min, float q_max, float* scratch, S* scale_t) {
  constexpr int64_t G = kRowGroup;
  float* wt = scratch;
  float* qt = wt + width * G;
  float* et = qt + width * G;
  float* zt = et + width * G;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r = r0 + g;
    for (int64_t j = 0; j < width; ++j) {
      wt[j * G + g] = b.w[r * width + j];
      scale_t[j * G + g] = scale[r * param_stride + j];
      if (zero_point) zt[j * G + g] = zero_point[r * param_stride + j];
    }
  }
  for (int64_t i = 0; i < width; ++i) {
    const float* h = hinv + i * hinv_stride;
    const float h_ii = h[i];
    float* wi = wt + i * G;
    float* qi = qt + i * G;
    float* ei = et + i * G;
    const S* si = scale_t + i * G;
    const float* zi = zero_point ? zt + i * G : nullptr;
    for (int64_t g = 0; g < G; ++g) {
      ei[g] = ColumnStep(wi[g], si[g], zi ? zi + g : nullptr, h_ii, q_min,
                         q_max, qi[g]);
    }
    for (int64_t j = i; j < width; ++j) {
      const float h_ij = h[j];
      float* wj = wt + j * G;
      for (int64_t g = 0; g < G; ++g) wj[g] -= ei[g] * h_ij;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r = r0 + g;
    for (int64_t j = 0; j < width; ++j) {
      const float error = et[j * G + g];
      b.w[r * width + j] = wt[j * G + g];
      b.q[r * width + j] = qt[j * G + g];
      b.err[r * width + j] = error;
      b.losses[r * width + j] = error * error;
    }
  }
}

// Rows [r0, r1): groups of kRowGroup, then one at a time. Compiled twice:
// for the x86-64 baseline (SSE2) and for AVX-512, picked at run time. The
// same operations on wider vectors (no FMA: -ffp-contract=off holds for
// both), so the same bits.
template <typename S>
[[gnu::always_inline]] inline void RowsOfColumnsBody(
    BlockBuffers b, const float* hinv, int64_t hinv_stride, const S* scale,
    const float* zero_point, int64_t param_stride, int64_t r0, int64_t r1,
    int64_t width, float q_min, float q_max) {
  int64_t r = r0;
  if (r1 - r0 >= kRowGroup) {
    std::vector<float> scratch(4 * width * kRowGroup);
    std::vector<S> scale_t(width * kRowGroup);
    for (; r + kRowGroup <= r1; r += kRowGroup) {
      ColumnsOfRowGroup(b, hinv, hinv_stride, scale, zero_point, param_stride,
                        r, width, q_min, q_max, scratch.data(), scale_t.data());
    }
  }
  for (; r < r1; ++r) {
    ColumnsOfRow(b, hinv, hinv_stride, scale, zero_point, param_stride, r,
                 width, q_min, q_max);
  }
}

template <typename S>
void RowsOfColumns(BlockBuffers b, const float* hinv, int64_t hinv_stride,
                   const S* scale, const float* zero_point,
                   int64_t param_stride, int64_t r0, int64_t r1, int64_t width,
                   float q_min, float q_max) {
  RowsOfColumnsBody(b, hinv, hinv_stride, scale, zero_point, param_stride, r0,
                    r1, width, q_min, q_max);
}

#if defined(__x86_64__) && defined(__GNUC__)
template <typename S>
[[gnu::target("avx512f,avx512bw,avx512vl,prefer-vector-width=512")]] void
RowsOfColumnsAvx512(BlockBuffers b, const float* hinv, int64_t hinv_stride,
                    const S* scale, const float* zero_point,
                    int64_t param_stride, int64_t r0, int64_t r1, int64_t width,
                    float q_min, float q_max) {
  RowsOfColumnsBody(b, hinv, hinv_stride, scale, zero_point, param_stride, r0,
                    r1, width, q_min, q_max);
}

bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}
#endif

template <typename S>
void IntegerColumns(BlockBuffers b, const float* hinv, int64_t hinv_stride,
                    const S* scale, const float* zero_point,
                    int64_t param_stride, int64_t rows, int64_t width,
                    float q_min, float q_max) {
  at::parallel_for(
      0, rows, /*grain_size=*/kRowGroup, [&](int64_t r0, int64_t r1) {
#if defined(__x86_64__) && defined(__GNUC__)
        if (HasAvx512()) {
          RowsOfColumnsAvx512(b, hinv, hinv_stride, scale, zero_point,
                              param_stride, r0, r1, width, q_min, q_max);
          return;
        }
#endif
        RowsOfColumns(b, hinv, hinv_stride, scale, zero_point, param_stride, r0,
                      r1, width, q_min, q_max);
      });
}

#if AT_BUILD_WITH_LAPACK()
// Copies one strict triangle of the row-major n x n `m` onto the other
// (the lower, r > c, onto the upper when `from_lower`), zeroing the source
// when `zero_source`. In 64 x 64 tiles: each pair of mirrored elements
// belongs to the tile of its smaller index, so threads never share one.
void Reflect(float* m, int64_t n, bool from_lower, bool zero_source) {
  constexpr int64_t kTile = 64;
  const int64_t tiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t c0 = t0 * kTile; c0 < std::min(n, t1 * kTile); c0 += kTile) {
      for (int64_t r0 = c0; r0 < n; r0 += kTile) {
        for (int64_t r = r0; r < std::min(n, r0 + kTile); ++r) {
          for (int64_t c = c0; c < std::min(r, c0 + kTile); ++c) {
            float& lower = m[r * n + c];
            float& upper = m[c * n + r];
            if (from_lower) {
              upper = lower;
              if (zero_source) lower = 0.0F;
            } else {
              lower = upper;
              if (zero_source) upper = 0.0F;
            }
          }
        }
      }
    }
  });
}

// Note [Factor without ATen's wrappers]: H'^-1's upper Cholesky factor U
// (row-major, zeros below the diagonal) from the damped H' (row-major, in
// `a`, whose buffer becomes U's), by the LAPACK calls ATen's
// linalg_cholesky_ex, cholesky_inverse and linalg_cholesky make on the CPU
// (potrf 'L', potri 'L', potrf 'U' on a column-major copy) on the same
// inputs, so the same bits; without their copies and triangle fills
// (tril_, triu_, the inverse's reflection), which run with column-major
// strides and took a third of the factorization's time on a [5632, 5632]
// Hessian. In place: LAPACK reads one triangle of a column-major matrix,
// which is the other triangle of the row-major one, so reflecting H''s
// lower triangle gives LAPACK the column-major H' it read from ATen's copy,
// and reflecting the result gives row-major U (the factorization held 3
// [in, in] matrices at once with the copies, 381 MB for an MLP's
// in = 5632; 2 now, with the caller's H). nullopt when H' is not positive
// definite (ATen's info != 0: GPTQ falls back to round-to-nearest); a
// failure after that throws, as ATen's calls do.
std::optional<at::Tensor> UpperFactorOfInverse(at::Tensor a) {
  const int64_t n = a.size(0);
  TORCH_CHECK(n <= std::numeric_limits<int>::max() / std::max<int64_t>(n, 1),
              "GPTQ: a Hessian of ", n, " columns is too large for LAPACK");
  TORCH_CHECK(a.is_contiguous() && a.scalar_type() == at::kFloat);
  float* m = a.data_ptr<float>();
  const int dim = static_cast<int>(n);
  // Column-major (i, j) is m[i + j * n]: the lower triangle LAPACK reads
  // ('L') is the row-major upper one.
  Reflect(m, n, /*from_lower=*/true, /*zero_source=*/false);
  int info = 0;
  at::native::lapackCholesky<float>('L', dim, m, dim, &info);
  if (info != 0) return std::nullopt;
  at::native::lapackCholeskyInverse<float>('L', dim, m, dim, &info);
  TORCH_CHECK(info == 0, "cholesky_inverse: U(", info, ",", info,
              ") is zero, singular U.");
  // The inverse's column-major upper triangle from its lower, as
  // cholesky_inverse completes it.
  Reflect(m, n, /*from_lower=*/false, /*zero_source=*/false);
  at::native::lapackCholesky<float>('U', dim, m, dim, &info);
  TORCH_CHECK(info == 0,
              "linalg.cholesky: The factorization could not be completed "
              "because the input is not positive-definite (the leading minor "
              "of order ",
              info, " is not positive-definite).");
  // Row-major U: U(i, j) = m[i + j * n] for j >= i, zero below.
  Reflect(m, n, /*from_lower=*/true, /*zero_source=*/true);
  return a;
}

// h[i][j] = source[perm[i]][perm[j]]: apply_activation_ordering's two
// gathers in one copy, without the intermediate [in, in] matrix.
at::Tensor PermutedCopy(const at::Tensor& source, const at::Tensor& perm) {
  const int64_t n = source.size(0);
  at::Tensor h = at::empty({n, n}, source.options());
  const at::Tensor p = perm.to(at::kLong).contiguous();
  const int64_t* idx = p.data_ptr<int64_t>();
  const float* src = source.data_ptr<float>();
  float* dst = h.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = src + idx[r] * n;
      for (int64_t c = 0; c < n; ++c) dst[r * n + c] = row[idx[c]];
    }
  });
  return h;
}
#endif

}  // namespace

absl::StatusOr<HessianFactor> FactorizeHessian(const at::Tensor& hessian,
                                               ActOrder actorder,
                                               double dampening_frac) {
  if (hessian.dim() != 2 || hessian.size(0) != hessian.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPTQ needs a square Hessian, got ", c10::str(hessian.sizes())));
  }
  if (dampening_frac < 0) {
    return absl::InvalidArgumentError("GPTQ needs dampening_frac >= 0");
  }
  // Shapes and operators follow quantize_weight with a batch of one ([1,
  // rows, cols]), so the same ATen kernels (bmm, not mm) see the same data.
  return runtime::TorchCall("GPTQ", [&]() -> HessianFactor {
    HessianFactor f;
    const int64_t cols = hessian.size(0);
    const at::Tensor source = hessian.to(at::kFloat).unsqueeze(0);
    at::Tensor h;
    if (actorder != ActOrder::kNone) {  // apply_activation_ordering
      f.perm = at::argsort(at::diagonal(source, 0, -2, -1), /*dim=*/-1,
                           /*descending=*/true);  // [1, cols]
#if AT_BUILD_WITH_LAPACK()
      if (source.device().is_cpu() && source.is_contiguous()) {
        h = PermutedCopy(source[0], f.perm[0]).unsqueeze(0);
      }
#endif
      if (!h.defined()) {
        h = at::gather(source, -1, f.perm.unsqueeze(-2).expand({-1, cols, -1}));
        h = at::gather(h, -2, f.perm.unsqueeze(-1).expand({-1, -1, cols}));
      }
    } else {
      h = source.clone();
    }
    // factorize_hessian (the per-item path of small batches).
    at::Tensor diag = at::diagonal(h, 0, -2, -1);
    f.dead = diag == 0;
    if (f.dead.any().item<bool>()) diag.masked_fill_(f.dead, 1.0);
    at::Tensor h0 = h[0];
    at::Tensor damp = at::mean(at::diag(h0)) * dampening_frac;
    f.damp = damp.item<double>();
    at::diagonal(h0).add_(damp);
    const auto options = h0.options();
#if AT_BUILD_WITH_LAPACK()
    if (h0.device().is_cpu()) {
      diag.reset();
      at::Tensor a = h0.contiguous();
      h0.reset();
      h.reset();
      std::optional<at::Tensor> upper = UpperFactorOfInverse(std::move(a));
      if (upper.has_value()) {
        f.hinv = upper->unsqueeze(0);
      } else {
        f.hinv = at::eye(cols, options).unsqueeze(0);
        f.fell_back_to_rtn = true;
      }
      return f;
    }
#endif
    auto [factor, info] = at::linalg_cholesky_ex(h0);
    // Each [in, in] matrix is released when the next is made: at most two
    // are held at once (an MLP's in = 5632: 127 MB each).
    diag.reset();
    h0.reset();
    h.reset();
    if (info.item<int>() == 0) {
      at::Tensor inverse = at::cholesky_inverse(factor);
      factor.reset();
      at::Tensor upper = at::linalg_cholesky(inverse, /*upper=*/true);
      inverse.reset();
      f.hinv = upper.contiguous().unsqueeze(0);
    } else {
      f.hinv = at::eye(cols, options).unsqueeze(0);
      f.fell_back_to_rtn = true;
    }
    return f;
  });
}

absl::StatusOr<TypedGptqResult> TypedGptq(const at::Tensor& weight,
                                          const at::Tensor& hessian,
                                          const QParams& q,
                                          const QuantizationArgs& args,
                                          const TypedGptqOptions& options) {
  if (weight.dim() != 2 || hessian.dim() != 2 ||
      hessian.size(0) != weight.size(1) || hessian.size(1) != weight.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPTQ needs a weight [out, in] and a Hessian [in, in], got ",
        c10::str(weight.sizes()), " and ", c10::str(hessian.sizes())));
  }
  ASSIGN_OR_RETURN(HessianFactor f, FactorizeHessian(hessian, args.actorder,
                                                     options.dampening_frac));
  return TypedGptq(weight, f, q, args, options);
}

absl::StatusOr<TypedGptqResult> TypedGptq(const at::Tensor& weight,
                                          const HessianFactor& factor,
                                          const QParams& q,
                                          const QuantizationArgs& args,
                                          const TypedGptqOptions& options) {
  RETURN_IF_ERROR(CheckFinite(weight, "weight"));
  if (weight.dim() != 2 || !factor.hinv.defined() || factor.hinv.dim() != 3 ||
      factor.hinv.size(1) != weight.size(1) ||
      factor.perm.defined() != (args.actorder != ActOrder::kNone)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPTQ needs a weight [out, in] and the factor of a Hessian [in, in] "
        "with the scheme's actorder, got ",
        c10::str(weight.sizes()), " and ",
        factor.hinv.defined() ? c10::str(factor.hinv.sizes()) : "none"));
  }
  if (options.block_size <= 0 || options.dampening_frac < 0) {
    return absl::InvalidArgumentError(
        "GPTQ needs block_size > 0 and dampening_frac >= 0");
  }
  if (!q.scale.defined()) {
    return absl::InvalidArgumentError("GPTQ needs the weight's parameters");
  }
  return runtime::TorchCall("GPTQ", [&]() -> TypedGptqResult {
    TypedGptqResult result;
    const int64_t rows = weight.size(0), cols = weight.size(1);
    at::Tensor w = weight.to(at::kFloat).unsqueeze(0).clone();

    // Columns' groups in their original order, then permuted.
    const auto idx_options =
        at::TensorOptions().dtype(at::kLong).device(weight.device());
    at::Tensor g_idx = at::arange(cols, idx_options);
    const Strategy s = args.resolved_strategy();
    if (s == Strategy::kGroup || s == Strategy::kTensorGroup) {
      g_idx = at::floor_divide(g_idx, *args.group_size);
    } else if (s == Strategy::kBlock) {
      g_idx = at::floor_divide(g_idx, (*args.block_structure)[1]);
    }
    const at::Tensor& perm = factor.perm;
    if (perm.defined()) {
      w = at::gather(w, -1, perm.unsqueeze(-2).expand({-1, rows, -1}));
      g_idx = g_idx.index_select(0, perm[0]);
    }
    if (factor.dead.any().item<bool>()) {
      w.masked_fill_(factor.dead.unsqueeze(1), 0);
    }
    if (factor.fell_back_to_rtn) {
      result.fell_back_to_rtn = true;
      result.warning =
          "the Hessian is not positive definite even after damping: "
          "quantized round-to-nearest";
    }
    const at::Tensor& hinv = factor.hinv;

    // column_scale_window: each column of [i1, i2)'s scale (global scale
    // folded in) and zero point, made per block (for all columns at once
    // they were two more [rows, cols] matrices).
    at::Tensor eff, zp;
    auto column_params = [&](int64_t i1, int64_t i2) {
      const at::Tensor block_idx = g_idx.slice(0, i1, i2);
      eff = PerColumn(q.scale, args, block_idx, rows, i2 - i1).unsqueeze(0);
      if (q.global_scale.defined()) {
        eff = eff / q.global_scale.reshape({1, 1, 1});
      }
      eff = eff.contiguous();
      if (!args.symmetric && q.zero_point.defined()) {
        zp = PerColumn(q.zero_point, args, block_idx, rows, i2 - i1)
                 .unsqueeze(0)
                 .to(at::kFloat)
                 .contiguous();
      }
    };
    QuantizationArgs column_args = args;
    column_args.strategy = Strategy::kChannel;
    column_args.group_size.reset();
    column_args.block_structure.reset();

    // Integer schemes run the column loop row by row on raw pointers
    // (IntegerColumns); the others, and a forced reference run, as tensors.
    const at::ScalarType scale_type = q.scale.scalar_type();
    const bool by_rows =
        options.row_kernel && args.type == QuantType::kInt &&
        !q.global_scale.defined() && w.device().is_cpu() &&
        hinv.is_contiguous() &&
        (scale_type == at::kFloat || scale_type == at::kBFloat16 ||
         scale_type == at::kHalf);
    float q_min = 0, q_max = 0;
    if (by_rows) {
      auto [lo, hi] = QuantRange(args, w.device());
      q_min = lo.item().toFloat();
      q_max = hi.item().toFloat();
    }
    at::Tensor losses = at::zeros({1, rows}, w.options());
    for (int64_t i1 = 0; i1 < cols; i1 += options.block_size) {
      const int64_t i2 = std::min(i1 + options.block_size, cols);
      at::Tensor w1 = w.slice(2, i1, i2).clone();
      at::Tensor q1 = at::zeros_like(w1);
      at::Tensor err1 = at::zeros_like(w1);
      at::Tensor losses1 = at::zeros_like(w1);
      at::Tensor hinv1 = hinv.slice(1, i1, i2).slice(2, i1, i2);
      column_params(i1, i2);
      if (by_rows) {
        AT_DISPATCH_FLOATING_TYPES_AND2(
            at::kBFloat16, at::kHalf, eff.scalar_type(), "gptq_columns", [&] {
              IntegerColumns<scalar_t>(
                  {w1.data_ptr<float>(), q1.data_ptr<float>(),
                   err1.data_ptr<float>(), losses1.data_ptr<float>()},
                  hinv.data_ptr<float>() + i1 * cols + i1, cols,
                  eff.data_ptr<scalar_t>(),
                  zp.defined() ? zp.data_ptr<float>() : nullptr, i2 - i1, rows,
                  i2 - i1, q_min, q_max);
            });
      } else {
        for (int64_t i = 0; i < i2 - i1; ++i) {  // gptq_block_update
          at::Tensor col = w1.select(2, i);      // [1, rows]
          QParams cq;
          cq.scale = eff.select(2, i).transpose(0, 1);
          if (zp.defined()) {
            cq.zero_point = zp.select(2, i).transpose(0, 1);
          }
          at::Tensor qc = internal::ProcessQuantization(
                              col.transpose(0, 1), cq, column_args,
                              std::nullopt, true, true)
                              .transpose(0, 1);
          at::Tensor diagonal = hinv1.select(1, i).select(1, i);  // [1]
          at::Tensor error = (col - qc) / diagonal.unsqueeze(1);
          q1.select(2, i).copy_(qc);
          err1.select(2, i).copy_(error);
          losses1.select(2, i).copy_(error.square());
          w1.slice(2, i).sub_(error.unsqueeze(-1) *
                              hinv1.select(1, i).slice(1, i).unsqueeze(1));
        }
      }
      w.slice(2, i1, i2).copy_(q1);
      losses += at::sum(losses1, {2}) / 2;
      // In place: the same bits as bmm then sub_ (one rounding of the
      // product, then the subtraction), without the [rows, rest] product.
      w.slice(2, i2).baddbmm_(err1, hinv.slice(1, i1, i2).slice(2, i2),
                              /*beta=*/1, /*alpha=*/-1);
    }
    eff.reset();
    zp.reset();
    if (!factor.fell_back_to_rtn) {  // Note [Output error from the errors].
      // W' - Q, with W' made again from `weight` now that the loop's
      // buffers are gone (Q is 0 where W' is: on dead columns).
      at::Tensor d = weight.to(at::kFloat).unsqueeze(0);
      if (perm.defined()) {
        d = at::gather(d, -1, perm.unsqueeze(-2).expand({-1, rows, -1}));
      }
      d = (d - w).masked_fill_(factor.dead.unsqueeze(1), 0)[0];
      result.row_output_errors =
          losses[0].to(at::kDouble) * 2 -
          d.square_().sum(1).to(at::kDouble) * factor.damp;
    }
    if (perm.defined()) {
      at::Tensor inverse = at::argsort(perm, /*dim=*/-1, /*descending=*/false);
      w = at::gather(w, -1, inverse.unsqueeze(-2).expand({-1, rows, -1}));
    }
    result.loss = losses.sum(1)[0].item<double>();
    result.row_losses = losses[0];
    result.weight = w[0].to(weight.scalar_type());
    return result;
  });
}

}  // namespace tracecut::quantization
