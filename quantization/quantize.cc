#include "quantization/quantize.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

absl::Status CheckParams(const QuantParams& params, const QuantScheme& scheme,
                         int64_t rows, int64_t columns) {
  if (!params.scale.defined() || !params.zero_point.defined()) {
    return absl::InvalidArgumentError("quantization parameters are undefined");
  }
  const int64_t want_rows = scheme.per_tensor ? 1 : rows;
  const int64_t want_groups = NumGroups(scheme, columns);
  for (const at::Tensor* t : {&params.scale, &params.zero_point}) {
    if (t->dim() != 2 || t->size(0) != want_rows || t->size(1) != want_groups) {
      return absl::InvalidArgumentError(absl::StrCat(
          "quantization parameters for ", scheme.ToString(), " on a [", rows,
          ", ", columns, "] weight must be [", want_rows, ", ", want_groups,
          "], got ", internal::DescribeTensor(*t)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status QuantScheme::Validate() const {
  if (bits < 2 || bits > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("bits must be in [2, 8], got ", bits));
  }
  // Bounded so group arithmetic cannot overflow (2^63 - 1 once did).
  if (group_size != -1 && (group_size <= 0 || group_size > (1 << 24))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_size must be in [1, 16777216] or -1 (per-channel), got ",
        group_size));
  }
  if (per_tensor && group_size != -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "per_tensor needs group_size -1, got group_size ", group_size));
  }
  return absl::OkStatus();
}

std::string QuantScheme::ToString() const {
  std::string granularity =
      per_tensor
          ? "per-tensor"
          : (group_size == -1 ? "per-channel" : absl::StrCat("g", group_size));
  return absl::StrCat("int", bits, " ", symmetric ? "sym" : "asym", " ",
                      granularity);
}

absl::StatusOr<QuantScheme> QuantScheme::Parse(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ' ');
  QuantScheme scheme;
  bool ok = parts.size() == 3;
  if (ok) {
    absl::string_view bits = parts[0], granularity = parts[2];
    ok = absl::ConsumePrefix(&bits, "int") &&
         absl::SimpleAtoi(bits, &scheme.bits) &&
         (parts[1] == "sym" || parts[1] == "asym");
    scheme.symmetric = parts[1] == "sym";
    scheme.per_tensor = granularity == "per-tensor";
    if (ok && !scheme.per_tensor && granularity != "per-channel") {
      ok = absl::ConsumePrefix(&granularity, "g") &&
           absl::SimpleAtoi(granularity, &scheme.group_size);
    }
  }
  if (!ok || !scheme.Validate().ok() || scheme.ToString() != text) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a quantization scheme: '", text, "'"));
  }
  return scheme;
}

int64_t NumGroups(const QuantScheme& scheme, int64_t columns) {
  if (scheme.per_tensor || scheme.group_size <= 0) return 1;
  return (columns + scheme.group_size - 1) / scheme.group_size;
}

namespace internal {

QuantParams MinMaxParams(const at::Tensor& w, const QuantScheme& scheme,
                         bool per_tensor) {
  at::Tensor x = per_tensor ? w.reshape({1, -1}) : w;
  const double qmin = static_cast<double>(scheme.qmin());
  const double qmax = static_cast<double>(scheme.qmax());
  QuantParams p;
  at::Tensor zero_width;
  if (scheme.symmetric) {
    at::Tensor amax = x.abs().amax({1}, /*keepdim=*/true);
    zero_width = amax == 0;
    p.scale = at::where(zero_width, at::ones_like(amax), amax / qmax);
    p.zero_point = at::zeros_like(amax, at::kInt);
  } else {
    at::Tensor lo = x.amin({1}, /*keepdim=*/true).clamp_max(0);
    at::Tensor hi = x.amax({1}, /*keepdim=*/true).clamp_min(0);
    at::Tensor scale = (hi - lo) / (qmax - qmin);
    zero_width = scale == 0;
    p.scale = at::where(zero_width, at::ones_like(scale), scale);
    at::Tensor zp = at::round(qmin - lo / p.scale).clamp(qmin, qmax);
    p.zero_point = at::where(zero_width, at::zeros_like(zp), zp).to(at::kInt);
  }
  return p;
}

at::Tensor FakeQuantizeFp32(const at::Tensor& w, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t qmin,
                            int64_t qmax) {
  at::Tensor zp = zero_point.to(at::kFloat);
  at::Tensor q = at::clamp(at::round(w / scale) + zp, qmin, qmax);
  return (q - zp) * scale;
}

at::Tensor ExpandToColumns(const at::Tensor& param, const QuantScheme& scheme,
                           int64_t rows, int64_t columns) {
  at::Tensor per_column = param;
  if (!scheme.per_tensor && scheme.group_size > 0) {
    at::Tensor group_of_column =
        at::arange(columns, param.options().dtype(at::kLong))
            .div(scheme.group_size, "floor");
    per_column = param.index_select(1, group_of_column);
  }
  return per_column.expand({rows, columns});
}

std::string DescribeTensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::string dtype;
  switch (t.scalar_type()) {
    case at::kFloat:
      dtype = "float32";
      break;
    case at::kDouble:
      dtype = "float64";
      break;
    case at::kHalf:
      dtype = "float16";
      break;
    case at::kBFloat16:
      dtype = "bfloat16";
      break;
    case at::kLong:
      dtype = "int64";
      break;
    case at::kInt:
      dtype = "int32";
      break;
    case at::kShort:
      dtype = "int16";
      break;
    case at::kChar:
      dtype = "int8";
      break;
    case at::kByte:
      dtype = "uint8";
      break;
    case at::kBool:
      dtype = "bool";
      break;
    default:
      dtype = c10::toString(t.scalar_type());
  }
  return absl::StrCat(dtype, "[", absl::StrJoin(t.sizes(), ", "), "]");
}

absl::Status CheckWeight(const at::Tensor& weight, absl::string_view what) {
  if (!weight.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is an undefined tensor"));
  }
  if (weight.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be 2-D [out, in], got ", DescribeTensor(weight)));
  }
  if (!at::isFloatingType(weight.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be floating point, got ", DescribeTensor(weight)));
  }
  if (weight.numel() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has no elements: ", DescribeTensor(weight)));
  }
  if (!at::isfinite(weight).all().item<bool>()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", DescribeTensor(weight), " has NaN or infinite entries"));
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::StatusOr<QuantParams> ComputeQuantParams(const at::Tensor& weight,
                                               const QuantScheme& scheme) {
  return runtime::TorchCall(
      "ComputeQuantParams", [&]() -> absl::StatusOr<QuantParams> {
        RETURN_IF_ERROR(scheme.Validate());
        RETURN_IF_ERROR(internal::CheckWeight(weight, "weight"));
        at::Tensor w = weight.to(at::kFloat);
        if (scheme.per_tensor || scheme.group_size == -1) {
          return internal::MinMaxParams(w, scheme, scheme.per_tensor);
        }
        const int64_t columns = w.size(1);
        std::vector<at::Tensor> scales;
        std::vector<at::Tensor> zero_points;
        for (int64_t c = 0; c < columns; c += scheme.group_size) {
          const int64_t width = std::min(scheme.group_size, columns - c);
          QuantParams g = internal::MinMaxParams(w.narrow(1, c, width), scheme,
                                                 /*per_tensor=*/false);
          scales.push_back(g.scale);
          zero_points.push_back(g.zero_point);
        }
        return QuantParams{at::cat(scales, 1), at::cat(zero_points, 1)};
      });
}

absl::StatusOr<at::Tensor> Quantize(const at::Tensor& weight,
                                    const QuantParams& params,
                                    const QuantScheme& scheme) {
  return runtime::TorchCall("Quantize", [&]() -> absl::StatusOr<at::Tensor> {
    RETURN_IF_ERROR(scheme.Validate());
    RETURN_IF_ERROR(internal::CheckWeight(weight, "weight"));
    const int64_t rows = weight.size(0);
    const int64_t columns = weight.size(1);
    RETURN_IF_ERROR(CheckParams(params, scheme, rows, columns));
    at::Tensor scale = internal::ExpandToColumns(params.scale.to(at::kFloat),
                                                 scheme, rows, columns);
    at::Tensor zp = internal::ExpandToColumns(params.zero_point.to(at::kFloat),
                                              scheme, rows, columns);
    at::Tensor q = at::clamp(at::round(weight.to(at::kFloat) / scale) + zp,
                             scheme.qmin(), scheme.qmax());
    return q.to(at::kChar);
  });
}

absl::StatusOr<at::Tensor> Dequantize(const at::Tensor& codes,
                                      const QuantParams& params,
                                      const QuantScheme& scheme,
                                      at::ScalarType dtype) {
  return runtime::TorchCall("Dequantize", [&]() -> absl::StatusOr<at::Tensor> {
    RETURN_IF_ERROR(scheme.Validate());
    if (!codes.defined() || codes.dim() != 2 ||
        at::isFloatingType(codes.scalar_type())) {
      return absl::InvalidArgumentError(
          absl::StrCat("codes must be a 2-D integer tensor, got ",
                       internal::DescribeTensor(codes)));
    }
    const int64_t rows = codes.size(0);
    const int64_t columns = codes.size(1);
    RETURN_IF_ERROR(CheckParams(params, scheme, rows, columns));
    at::Tensor scale = internal::ExpandToColumns(params.scale.to(at::kFloat),
                                                 scheme, rows, columns);
    at::Tensor zp = internal::ExpandToColumns(params.zero_point.to(at::kFloat),
                                              scheme, rows, columns);
    return ((codes.to(at::kFloat) - zp) * scale).to(dtype);
  });
}

absl::StatusOr<at::Tensor> FakeQuantize(const at::Tensor& weight,
                                        const QuantParams& params,
                                        const QuantScheme& scheme) {
  return runtime::TorchCall(
      "FakeQuantize", [&]() -> absl::StatusOr<at::Tensor> {
        RETURN_IF_ERROR(scheme.Validate());
        RETURN_IF_ERROR(internal::CheckWeight(weight, "weight"));
        const int64_t rows = weight.size(0);
        const int64_t columns = weight.size(1);
        RETURN_IF_ERROR(CheckParams(params, scheme, rows, columns));
        at::Tensor scale = internal::ExpandToColumns(
            params.scale.to(at::kFloat), scheme, rows, columns);
        at::Tensor zp =
            internal::ExpandToColumns(params.zero_point, scheme, rows, columns);
        return internal::FakeQuantizeFp32(weight.to(at::kFloat), scale, zp,
                                          scheme.qmin(), scheme.qmax())
            .to(weight.scalar_type());
      });
}

absl::StatusOr<RtnResult> QuantizeRtn(const at::Tensor& weight,
                                      const QuantScheme& scheme) {
  RtnResult result;
  ASSIGN_OR_RETURN(result.params, ComputeQuantParams(weight, scheme));
  ASSIGN_OR_RETURN(result.weight, FakeQuantize(weight, result.params, scheme));
  return result;
}

}  // namespace tracecut::quantization
