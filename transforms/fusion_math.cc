#include "transforms/fusion_math.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/torch_status.h"

namespace tracecut::transforms::fusion_math {
namespace {

std::string ShapeString(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

absl::Status CheckFloating(const at::Tensor& t, absl::string_view what) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is undefined"));
  }
  if (!at::isFloatingType(t.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be floating point, got ", c10::toString(t.scalar_type())));
  }
  return absl::OkStatus();
}

absl::Status CheckVector(const at::Tensor& t, int64_t n,
                         absl::string_view what) {
  if (absl::Status s = CheckFloating(t, what); !s.ok()) return s;
  if (t.dim() != 1 || t.size(0) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must have shape [", n, "], got ", ShapeString(t)));
  }
  return absl::OkStatus();
}

absl::Status CheckBatchNorm(const BatchNormParams& bn, int64_t channels) {
  if (absl::Status s = CheckVector(bn.running_mean, channels, "running_mean");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckVector(bn.running_var, channels, "running_var");
      !s.ok()) {
    return s;
  }
  if (bn.weight) {
    if (absl::Status s = CheckVector(*bn.weight, channels, "BatchNorm weight");
        !s.ok()) {
      return s;
    }
  }
  if (bn.bias) {
    if (absl::Status s = CheckVector(*bn.bias, channels, "BatchNorm bias");
        !s.ok()) {
      return s;
    }
  }
  if (!(bn.eps >= 0) || !std::isfinite(bn.eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchNorm eps must be finite and >= 0, got ", bn.eps));
  }
  return absl::OkStatus();
}

at::Tensor F64(const at::Tensor& t) {
  return t.to(t.options().dtype(at::kDouble).device(at::kCPU));
}

// s = gamma / sqrt(var + eps) and t = beta - mu * s, in float64 on the CPU.
absl::Status ScaleAndShift(const BatchNormParams& bn, at::Tensor& scale,
                           at::Tensor& shift) {
  at::Tensor var_eps = F64(bn.running_var) + bn.eps;
  if (!(var_eps > 0).all().item<bool>()) {
    return absl::InvalidArgumentError(
        "BatchNorm running_var + eps must be > 0 in every channel");
  }
  at::Tensor inv_std = var_eps.rsqrt();
  scale = bn.weight ? F64(*bn.weight) * inv_std : inv_std;
  at::Tensor beta =
      bn.bias ? F64(*bn.bias) : at::zeros_like(inv_std);  // affine=False: 0.
  shift = beta - F64(bn.running_mean) * scale;
  return absl::OkStatus();
}

// Shape [1, ..., n, ..., 1] that puts a [n] vector on `dim` of a rank-`rank`
// tensor.
std::vector<int64_t> BroadcastShape(int64_t rank, int64_t dim, int64_t n) {
  std::vector<int64_t> shape(rank, 1);
  shape[dim] = n;
  return shape;
}

}  // namespace

absl::StatusOr<WeightAndBias> FoldBatchNormIntoPreceding(
    const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const BatchNormParams& bn, int64_t out_dim) {
  return runtime::TorchCall(
      "FoldBatchNormIntoPreceding", [&]() -> absl::StatusOr<WeightAndBias> {
        if (absl::Status s = CheckFloating(weight, "weight"); !s.ok()) {
          return s;
        }
        if (out_dim < 0 || out_dim >= weight.dim()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "out_dim ", out_dim, " out of range for weight of shape ",
              ShapeString(weight)));
        }
        const int64_t channels = weight.size(out_dim);
        if (bias) {
          if (absl::Status s = CheckVector(*bias, channels, "bias"); !s.ok()) {
            return s;
          }
        }
        if (absl::Status s = CheckBatchNorm(bn, channels); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              s.message(), " (the weight has ", channels, " output channels)"));
        }
        at::Tensor scale, shift;
        if (absl::Status s = ScaleAndShift(bn, scale, shift); !s.ok()) {
          return s;
        }
        at::Tensor w = F64(weight) * scale.reshape(BroadcastShape(
                                         weight.dim(), out_dim, channels));
        // (b - mu) * s + beta == b * s + (beta - mu * s).
        at::Tensor b = bias ? F64(*bias) * scale + shift : shift;
        WeightAndBias out;
        out.weight = w.to(weight.options());
        out.bias = b.to(weight.options());
        return out;
      });
}

absl::StatusOr<WeightAndBias> FoldBatchNormIntoFollowingLinear(
    const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const BatchNormParams& bn) {
  return runtime::TorchCall(
      "FoldBatchNormIntoFollowingLinear",
      [&]() -> absl::StatusOr<WeightAndBias> {
        if (absl::Status s = CheckFloating(weight, "weight"); !s.ok()) return s;
        if (weight.dim() != 2) {
          return absl::InvalidArgumentError(absl::StrCat(
              "linear weight must be 2-D, got ", ShapeString(weight)));
        }
        const int64_t out = weight.size(0), in = weight.size(1);
        if (bias) {
          if (absl::Status s = CheckVector(*bias, out, "bias"); !s.ok()) {
            return s;
          }
        }
        if (absl::Status s = CheckBatchNorm(bn, in); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              s.message(), " (the linear has ", in, " input features)"));
        }
        at::Tensor scale, shift;
        if (absl::Status s = ScaleAndShift(bn, scale, shift); !s.ok()) return s;
        at::Tensor w64 = F64(weight);
        at::Tensor b = at::mv(w64, shift);
        if (bias) b = b + F64(*bias);
        WeightAndBias result;
        result.weight = (w64 * scale.unsqueeze(0)).to(weight.options());
        result.bias = b.to(weight.options());
        return result;
      });
}

std::vector<int64_t> OutFeatures(absl::Span<const WeightAndBias> parts,
                                 int64_t out_dim) {
  std::vector<int64_t> sizes;
  for (const WeightAndBias& p : parts) sizes.push_back(p.weight.size(out_dim));
  return sizes;
}

absl::StatusOr<WeightAndBias> ConcatLinears(
    absl::Span<const WeightAndBias> parts, int64_t out_dim) {
  return runtime::TorchCall(
      "ConcatLinears", [&]() -> absl::StatusOr<WeightAndBias> {
        if (parts.size() < 2) {
          return absl::InvalidArgumentError("ConcatLinears needs >= 2 parts");
        }
        if (out_dim != 0 && out_dim != 1) {
          return absl::InvalidArgumentError("out_dim must be 0 or 1");
        }
        const at::Tensor& first = parts[0].weight;
        const int64_t in_dim = 1 - out_dim;
        bool any_bias = false;
        std::vector<at::Tensor> weights;
        for (size_t i = 0; i < parts.size(); ++i) {
          const at::Tensor& w = parts[i].weight;
          if (absl::Status s = CheckFloating(w, "weight"); !s.ok()) return s;
          if (w.dim() != 2 || w.size(in_dim) != first.size(in_dim) ||
              w.scalar_type() != first.scalar_type() ||
              w.device() != first.device()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "part ", i, " (", ShapeString(w), " ",
                c10::toString(w.scalar_type()), " on ", w.device().str(),
                ") does not match part 0 (", ShapeString(first), " ",
                c10::toString(first.scalar_type()), " on ",
                first.device().str(), ")"));
          }
          if (parts[i].bias) {
            if (absl::Status s =
                    CheckVector(*parts[i].bias, w.size(out_dim), "bias");
                !s.ok()) {
              return s;
            }
            if (parts[i].bias->scalar_type() != w.scalar_type() ||
                parts[i].bias->device() != w.device()) {
              return absl::InvalidArgumentError(
                  absl::StrCat("part ", i,
                               ": bias dtype/device differ from "
                               "its weight's"));
            }
            any_bias = true;
          }
          weights.push_back(w);
        }
        WeightAndBias merged;
        merged.weight = at::cat(weights, out_dim);
        if (any_bias) {
          std::vector<at::Tensor> biases;
          for (const WeightAndBias& p : parts) {
            biases.push_back(p.bias ? *p.bias
                                    : at::zeros({p.weight.size(out_dim)},
                                                p.weight.options()));
          }
          merged.bias = at::cat(biases, 0);
        }
        return merged;
      });
}

absl::StatusOr<at::Tensor> AppendBiasColumn(const at::Tensor& weight,
                                            const at::Tensor& bias) {
  return runtime::TorchCall(
      "AppendBiasColumn", [&]() -> absl::StatusOr<at::Tensor> {
        if (absl::Status s = CheckFloating(weight, "weight"); !s.ok()) return s;
        if (weight.dim() != 2) {
          return absl::InvalidArgumentError(
              absl::StrCat("weight must be 2-D, got ", ShapeString(weight)));
        }
        if (absl::Status s = CheckVector(bias, weight.size(0), "bias");
            !s.ok()) {
          return s;
        }
        if (bias.scalar_type() != weight.scalar_type() ||
            bias.device() != weight.device()) {
          return absl::InvalidArgumentError(
              "bias dtype/device differ from the weight's");
        }
        return at::cat({weight, bias.unsqueeze(1)}, 1);
      });
}

absl::StatusOr<WeightAndBias> SplitBiasColumn(const at::Tensor& fused) {
  return runtime::TorchCall(
      "SplitBiasColumn", [&]() -> absl::StatusOr<WeightAndBias> {
        if (absl::Status s = CheckFloating(fused, "weight"); !s.ok()) return s;
        if (fused.dim() != 2 || fused.size(1) < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("fused weight must be 2-D with >= 1 column, got ",
                           ShapeString(fused)));
        }
        const int64_t in = fused.size(1) - 1;
        WeightAndBias out;
        out.weight = fused.narrow(1, 0, in).clone(at::MemoryFormat::Contiguous);
        out.bias = fused.select(1, in).clone(at::MemoryFormat::Contiguous);
        return out;
      });
}

std::optional<double> ExactReciprocal(double d, int max_exponent) {
  if (!std::isfinite(d) || d == 0) return std::nullopt;
  int exp = 0;
  const double mantissa = std::frexp(std::fabs(d), &exp);  // |d| = m * 2^exp.
  if (mantissa != 0.5) return std::nullopt;                // Not a power of 2.
  const int log2 = exp - 1;
  if (log2 > max_exponent || -log2 > max_exponent) return std::nullopt;
  const double r = 1.0 / d;
  if (r * d != 1.0) return std::nullopt;
  return r;
}

int MaxExactExponent(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return 14;
    case at::kBFloat16:
    case at::kFloat:
      return 126;
    case at::kDouble:
      return 1022;
    default:
      return 0;
  }
}

std::optional<at::Tensor> ExactReciprocalTensor(const at::Tensor& divisor) {
  try {
    if (!divisor.defined() || !at::isFloatingType(divisor.scalar_type())) {
      return std::nullopt;
    }
    const int max_exp = MaxExactExponent(divisor.scalar_type());
    at::Tensor d = F64(divisor).contiguous();
    const double* p = d.data_ptr<double>();
    for (int64_t i = 0; i < d.numel(); ++i) {
      if (!ExactReciprocal(p[i], max_exp)) return std::nullopt;
    }
    at::Tensor r = (1.0 / d).to(divisor.options());
    // Every reciprocal must survive the cast back unchanged.
    if (!at::equal(F64(r) * d, at::ones_like(d))) return std::nullopt;
    return r;
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  at::Tensor x = a.to(at::kCPU).contiguous();
  at::Tensor y = b.to(at::kCPU).contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

ErrorStats CompareTensors(const at::Tensor& actual,
                          const at::Tensor& expected) {
  ErrorStats stats;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  try {
    if (actual.sizes() != expected.sizes()) return {kInf, kInf};
    if (actual.numel() == 0) return stats;
    at::Tensor a = F64(actual);
    at::Tensor e = F64(expected);
    at::Tensor diff = (a - e).abs();
    // Matching non-finite values (inf == inf, NaN vs NaN) count as equal.
    at::Tensor same = (a == e) | (a.isnan() & e.isnan());
    diff = at::where(same, at::zeros_like(diff), diff);
    diff = at::where(diff.isnan(), at::full_like(diff, kInf), diff);
    stats.max_abs = diff.max().item<double>();
    at::Tensor finite_e = at::where(e.isfinite(), e.abs(), at::zeros_like(e));
    const double scale = finite_e.max().item<double>();
    if (stats.max_abs == 0) {
      stats.max_rel = 0;
    } else {
      stats.max_rel = scale > 0 ? stats.max_abs / scale : kInf;
    }
  } catch (const c10::Error&) {
    return {kInf, kInf};
  }
  return stats;
}

}  // namespace tracecut::transforms::fusion_math
