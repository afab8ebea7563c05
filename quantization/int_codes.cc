#include "quantization/int_codes.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/finite.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

// `v` rounded to D as a cast to D rounds it (to nearest even), and a D
// read as a float. bf16 by its bits, so that loops over it vectorize (c10's
// conversion has a NaN branch; the kernels see finite values only).
template <typename D>
inline float Round(float v) {
  return static_cast<float>(static_cast<D>(v));
}
template <>
inline float Round<float>(float v) {
  return v;
}
template <>
inline float Round<c10::BFloat16>(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}
template <typename D>
inline float Load(D x) {
  return static_cast<float>(x);
}
template <>
inline float Load<c10::BFloat16>(c10::BFloat16 x) {
  const uint32_t u = static_cast<uint32_t>(x.x) << 16;
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}

// nearbyint in the default rounding mode (half to even) for |v| < 2^22,
// inline: adding and taking away 1.5 * 2^23 leaves no fraction bits. (A
// zero's sign may differ from nearbyint's: codes are compared and packed as
// integers, where -0 is 0.) IEEE arithmetic without -ffast-math: the
// compiler may not fold it to v.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0F;  // 1.5 * 2^23.
  return (v + kMagic) - kMagic;
}

// The parameters as fp32 (exact for the dtypes allowed), one entry per
// group: group g of row r at r * row_stride + g.
struct Params {
  at::Tensor scale;    // q.scale.
  at::Tensor zero_w;   // q.zero_point cast to the weight's dtype.
  at::Tensor zero_d;   // ... cast to the dequantization scale's dtype.
  at::Tensor dequant;  // The dequantization scale.
  int64_t span = 0;    // Columns per group.
  int64_t row_stride = 0;
  float lo = 0, hi = 0;
  c10::ScalarType promoted = at::kFloat;  // Of the weight and q.scale.
};

bool IsKernelFloat(const at::Tensor& t) {
  const c10::ScalarType s = t.scalar_type();
  return t.device().is_cpu() &&
         (s == at::kFloat || s == at::kBFloat16 || s == at::kHalf);
}

// The Params for `w`, or nullopt where Note [One-pass integer codes] says
// the tensor path runs. `dequant` may be undefined (codes only).
absl::StatusOr<std::optional<Params>> Prepare(const at::Tensor& w,
                                              const QParams& q,
                                              const at::Tensor& dequant,
                                              const QuantizationArgs& args) {
  if (args.type != QuantType::kInt || q.global_scale.defined() ||
      w.dim() != 2 || !w.is_contiguous() || !IsKernelFloat(w) ||
      w.numel() == 0 || !q.scale.defined() || !IsKernelFloat(q.scale) ||
      (dequant.defined() &&
       (!IsKernelFloat(dequant) || !dequant.sizes().equals(q.scale.sizes())))) {
    return std::nullopt;
  }
  const int64_t rows = w.size(0), cols = w.size(1);
  Params p;
  switch (args.resolved_strategy()) {
    case Strategy::kTensor:
      if (q.scale.numel() != 1) return std::nullopt;
      p.span = cols;
      p.row_stride = 0;
      break;
    case Strategy::kChannel:
      if (q.scale.dim() != 2 || q.scale.size(0) != rows ||
          q.scale.size(1) != 1) {
        return std::nullopt;
      }
      p.span = cols;
      p.row_stride = 1;
      break;
    case Strategy::kGroup: {
      const int64_t g = args.group_size.value_or(0);
      if (g <= 0 || cols % g != 0 || q.scale.dim() != 2 ||
          q.scale.size(0) != rows || q.scale.size(1) != cols / g) {
        return std::nullopt;
      }
      p.span = g;
      p.row_stride = cols / g;
      break;
    }
    default:
      return std::nullopt;
  }
  if (q.zero_point.defined() && (!q.zero_point.device().is_cpu() ||
                                 q.zero_point.numel() != q.scale.numel())) {
    return std::nullopt;
  }
  ASSIGN_OR_RETURN(const int64_t bad, runtime::FirstNonFinite(w));
  if (bad >= 0) return std::nullopt;
  return runtime::TorchCall("integer codes", [&]() -> std::optional<Params> {
    auto flat = [](const at::Tensor& t) {
      return t.to(at::kFloat).contiguous().reshape({-1});
    };
    p.scale = flat(q.scale);
    // A zero or non-finite scale: the tensor path's NaN codes.
    if (!at::isfinite(p.scale).all().item<bool>() ||
        p.scale.eq(0).any().item<bool>()) {
      return std::nullopt;
    }
    if (q.zero_point.defined()) {
      p.zero_w = flat(q.zero_point.to(w.scalar_type()));
      if (dequant.defined()) {
        p.zero_d = flat(q.zero_point.to(dequant.scalar_type()));
      }
    }
    if (dequant.defined()) p.dequant = flat(dequant);
    auto [lo, hi] = QuantRange(args, w.device());
    p.lo = lo.item<float>();
    p.hi = hi.item<float>();
    p.promoted = at::promoteTypes(w.scalar_type(), q.scale.scalar_type());
    return p;
  });
}

// Calls f(T{}) for the C++ type of a kernel dtype.
template <typename F>
void DispatchFloat(c10::ScalarType type, F&& f) {
  switch (type) {
    case at::kBFloat16:
      f(c10::BFloat16());
      break;
    case at::kHalf:
      f(c10::Half());
      break;
    default:
      f(0.0F);
      break;
  }
}

// The codes of x[0, n), all of one group (scale s, zero point z in the
// weight's dtype), as floats holding integers: Note [One-pass integer
// codes]. Simple loops over plain pointers, so that they vectorize.
template <typename T, typename P, bool kZero>
void GroupCodes(const T* x, int64_t n, float s, float z, float lo, float hi,
                float* out) {
  for (int64_t c = 0; c < n; ++c) {
    float v = Round<P>(Load<T>(x[c]) / s);
    if constexpr (kZero) v = Round<P>(v + z);
    out[c] = RoundHalfEven(std::min(std::max(v, lo), hi));
  }
}

// How many of x[0, n) the codes do not give back, dequantized in R with
// scale s and zero point z (in R).
template <typename T, typename R, bool kZero>
int64_t GroupOff(const T* x, const float* codes, int64_t n, float s, float z) {
  int64_t off = 0;
  for (int64_t c = 0; c < n; ++c) {
    float d = Round<R>(codes[c]);
    if constexpr (kZero) d = Round<R>(d - z);
    d = Round<R>(d * s);
    off += Round<T>(d) != Load<T>(x[c]);
  }
  return off;
}

// Rows [r0, r1) of `w`, group by group: the group's codes go to
// `visit(row, first column, codes, count, group index)`.
template <typename T, typename P, bool kZero, typename Visit>
void ForEachGroup(const T* w, int64_t cols, const Params& p, int64_t r0,
                  int64_t r1, Visit&& visit) {
  const float* scale = p.scale.const_data_ptr<float>();
  const float* zero = kZero ? p.zero_w.const_data_ptr<float>() : nullptr;
  std::vector<float> codes(p.span);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t g = 0, c0 = 0; c0 < cols; ++g, c0 += p.span) {
      const int64_t k = r * p.row_stride + g;
      GroupCodes<T, P, kZero>(w + r * cols + c0, p.span, scale[k],
                              kZero ? zero[k] : 0.0F, p.lo, p.hi, codes.data());
      visit(r, c0, codes.data(), k);
    }
  }
}

// Calls f(T{}, P{}, std::bool_constant<zero point>{}) for `w`'s kernel.
template <typename F>
void DispatchCodes(const at::Tensor& w, const Params& p, F&& f) {
  DispatchFloat(w.scalar_type(), [&](auto t) {
    DispatchFloat(p.promoted, [&](auto pt) {
      if (p.zero_w.defined()) {
        f(t, pt, std::true_type());
      } else {
        f(t, pt, std::false_type());
      }
    });
  });
}

int64_t Grain(int64_t cols) { return std::max<int64_t>(1, 65536 / cols); }

}  // namespace

absl::StatusOr<std::optional<at::Tensor>> PackedIntCodes(
    const at::Tensor& w, const QParams& q, const QuantizationArgs& args) {
  const int bits = args.num_bits;
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8) return std::nullopt;
  ASSIGN_OR_RETURN(std::optional<Params> p, Prepare(w, q, {}, args));
  if (!p.has_value()) return std::nullopt;
  const int64_t rows = w.size(0), cols = w.size(1);
  const int64_t words_per_row = (cols * bits + 31) / 32;
  const uint32_t offset = uint32_t{1} << (bits - 1);
  const int64_t per = int64_t{32} / bits;
  return runtime::TorchCall("packing integer codes", [&] {
    at::Tensor packed = at::zeros({rows, words_per_row}, at::kInt);
    uint32_t* words = static_cast<uint32_t*>(packed.data_ptr());
    DispatchCodes(w, *p, [&](auto t, auto pt, auto zero) {
      using T = decltype(t);
      using P = decltype(pt);
      at::parallel_for(0, rows, Grain(cols), [&](int64_t r0, int64_t r1) {
        ForEachGroup<T, P, decltype(zero)::value>(
            w.const_data_ptr<T>(), cols, *p, r0, r1,
            [&](int64_t r, int64_t c0, const float* codes, int64_t) {
              uint32_t* row = words + r * words_per_row;
              auto value = [&](int64_t c) {
                return static_cast<uint32_t>(static_cast<int32_t>(codes[c])) +
                       offset;
              };
              if (c0 % per == 0 && p->span % per == 0) {  // Whole words.
                for (int64_t c = 0; c < p->span; c += per) {
                  uint32_t word = 0;
                  for (int64_t j = 0; j < per; ++j) {
                    word |= value(c + j) << (j * bits);
                  }
                  row[(c0 + c) / per] = word;
                }
                return;
              }
              for (int64_t c = 0; c < p->span; ++c) {
                const int64_t at = c0 + c;
                row[at / per] |= value(c) << ((at % per) * bits);
              }
            });
      });
    });
    return std::optional<at::Tensor>(packed);
  });
}

absl::StatusOr<std::optional<int64_t>> CountOffGrid(
    const at::Tensor& w, const QParams& q, const at::Tensor& dequant_scale,
    const QuantizationArgs& args) {
  if (!dequant_scale.defined()) return std::nullopt;
  ASSIGN_OR_RETURN(std::optional<Params> p, Prepare(w, q, dequant_scale, args));
  if (!p.has_value()) return std::nullopt;
  const int64_t rows = w.size(0), cols = w.size(1);
  std::atomic<int64_t> off{0};
  RETURN_IF_ERROR(runtime::TorchCall("checking integer codes", [&] {
    const float* ds = p->dequant.const_data_ptr<float>();
    const float* zd =
        p->zero_d.defined() ? p->zero_d.const_data_ptr<float>() : nullptr;
    DispatchCodes(w, *p, [&](auto t, auto pt, auto zero) {
      using T = decltype(t);
      using P = decltype(pt);
      constexpr bool kZero = decltype(zero)::value;
      DispatchFloat(dequant_scale.scalar_type(), [&](auto rt) {
        using R = decltype(rt);
        at::parallel_for(0, rows, Grain(cols), [&](int64_t r0, int64_t r1) {
          int64_t mine = 0;
          const T* x = w.const_data_ptr<T>();
          ForEachGroup<T, P, kZero>(
              x, cols, *p, r0, r1,
              [&](int64_t r, int64_t c0, const float* codes, int64_t k) {
                mine += GroupOff<T, R, kZero>(x + r * cols + c0, codes, p->span,
                                              ds[k], kZero ? zd[k] : 0.0F);
              });
          off += mine;
        });
      });
    });
  }));
  return std::optional<int64_t>(off.load());
}

}  // namespace tracecut::quantization
