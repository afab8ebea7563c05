#include "quantization/fake_quant.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/finite.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

// Each function names the compressed-tensors function it mirrors; see
// Note [Bit-exact with compressed-tensors] before "simplifying" any of them.

namespace tracecut::quantization {
namespace {

bool IsFloatingDtype(c10::ScalarType d) { return c10::isFloatingType(d); }

// _get_dtype_eps.
double DtypeEps(c10::ScalarType d) {
  switch (d) {
    case c10::ScalarType::Float8_e4m3fn:
      return 0.125;
    case c10::ScalarType::BFloat16:
      return 0.0078125;  // 2^-7
    case c10::ScalarType::Half:
      return 0.0009765625;  // 2^-10
    case c10::ScalarType::Float:
      return std::numeric_limits<float>::epsilon();
    case c10::ScalarType::Double:
      return std::numeric_limits<double>::epsilon();
    case c10::ScalarType::Float8_e5m2:
      return 0.25;  // torch.finfo(float8_e5m2).eps
    default:
      return 1;
  }
}

// round_to_quantized_type_dtype.
at::Tensor RoundToDtype(const at::Tensor& t, c10::ScalarType dtype,
                        bool cast_to_original_dtype) {
  at::Tensor rounded;
  if (IsFloatingDtype(dtype)) {
    double lo = 0, hi = 0;
    switch (dtype) {
      case c10::ScalarType::Float8_e4m3fn:
        lo = -448.0, hi = 448.0;
        break;
      case c10::ScalarType::Float8_e5m2:
        lo = -57344.0, hi = 57344.0;
        break;
      case c10::ScalarType::BFloat16:
        hi = static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
        lo = -hi;
        break;
      case c10::ScalarType::Half:
        hi = static_cast<double>(std::numeric_limits<c10::Half>::max());
        lo = -hi;
        break;
      case c10::ScalarType::Float:
        hi = std::numeric_limits<float>::max();
        lo = -hi;
        break;
      default:
        hi = std::numeric_limits<double>::max();
        lo = -hi;
        break;
    }
    rounded = at::clamp(t, lo, hi).to(dtype);
  } else {
    int64_t lo = 0, hi = 0;
    switch (dtype) {
      case c10::ScalarType::Byte:
        lo = 0, hi = 255;
        break;
      case c10::ScalarType::Char:
        lo = -128, hi = 127;
        break;
      case c10::ScalarType::Short:
        lo = -32768, hi = 32767;
        break;
      default:
        lo = std::numeric_limits<int32_t>::min();
        hi = std::numeric_limits<int32_t>::max();
        break;
    }
    rounded = at::round(at::clamp(t, lo, hi)).to(dtype);
  }
  return cast_to_original_dtype ? rounded.to(t.scalar_type()) : rounded;
}

// round_to_quantized_type_args.
at::Tensor RoundToArgs(const at::Tensor& t, const QuantizationArgs& args,
                       const at::Tensor& q_min, const at::Tensor& q_max) {
  const c10::ScalarType original = t.scalar_type();
  at::Tensor clamped = at::clamp(t, q_min, q_max);
  at::Tensor rounded;
  if (args.type == QuantType::kFloat) {
    rounded = args.num_bits == 8 ? clamped.to(c10::ScalarType::Float8_e4m3fn)
                                 : CastToFp4(clamped);
  } else {
    rounded = at::round(clamped);
  }
  return rounded.to(original);
}

// _quantize / _dequantize / _quantize_dequantize (forward_helpers.py).
at::Tensor ApplyQuantizeOp(const at::Tensor& x, at::Tensor scale,
                           const at::Tensor& zero_point,
                           const at::Tensor& q_min, const at::Tensor& q_max,
                           const QuantizationArgs& args,
                           std::optional<c10::ScalarType> dtype,
                           bool do_quantize, bool do_dequantize,
                           const at::Tensor& global_scale) {
  if (global_scale.defined()) scale = scale / global_scale;
  if (do_quantize) {
    at::Tensor scaled = x / scale;
    if (zero_point.defined()) scaled.add_(zero_point.to(x.scalar_type()));
    at::Tensor quantized = RoundToArgs(scaled, args, q_min, q_max);
    if (!do_dequantize) {
      return dtype.has_value() ? quantized.to(*dtype) : quantized;
    }
    at::Tensor dequant = quantized.to(scale.scalar_type());
    if (zero_point.defined()) {
      dequant = dequant - zero_point.to(scale.scalar_type());
    }
    return dequant * scale;
  }
  at::Tensor dequant = x.to(scale.scalar_type());
  if (zero_point.defined()) {
    dequant = dequant - zero_point.to(scale.scalar_type());
  }
  dequant = dequant * scale;
  return dtype.has_value() ? dequant.to(*dtype) : dequant;
}

// maybe_pad_tensor_for_block_quant.
at::Tensor PadForBlocks(const at::Tensor& x, int64_t bh, int64_t bw) {
  const int64_t rows = x.size(-2), cols = x.size(-1);
  const int64_t pad_rows = (bh - rows % bh) % bh;
  const int64_t pad_cols = (bw - cols % bw) % bw;
  if (pad_rows == 0 && pad_cols == 0) return x;
  return at::constant_pad_nd(x, {0, pad_cols, 0, pad_rows}, 0);
}

absl::Status CheckGroupColumns(int64_t columns, int64_t group_size,
                               const QuantizationArgs& args) {
  if (columns % group_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.ToString(), ": ", columns,
                     " columns are not divisible by group_size ", group_size));
  }
  return absl::OkStatus();
}

std::string Shape(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

absl::Status CheckParamShapes(const at::Tensor& x, const QParams& q,
                              const QuantizationArgs& args) {
  if (!q.scale.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.ToString(), ": no scale"));
  }
  const Strategy s = args.resolved_strategy();
  if (s == Strategy::kTensorGroup && !q.global_scale.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.ToString(), ": tensor_group needs a global scale"));
  }
  if (s == Strategy::kGroup || s == Strategy::kTensorGroup) {
    RETURN_IF_ERROR(CheckGroupColumns(x.size(-1), *args.group_size, args));
  }
  if (s == Strategy::kBlock && x.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.ToString(), ": block quantization needs a 2-D tensor, got ",
        Shape(x)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckFinite(const at::Tensor& t, absl::string_view what) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": undefined tensor"));
  }
  if (!IsFloatingDtype(t.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", c10::toString(t.scalar_type()), " is not floating point"));
  }
  ASSIGN_OR_RETURN(const int64_t nan,
                   runtime::FirstNonFinite(t, /*allow_infinite=*/true));
  if (nan >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": contains NaN"));
  }
  ASSIGN_OR_RETURN(const int64_t inf, runtime::FirstNonFinite(t));
  if (inf >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": contains Inf"));
  }
  return absl::OkStatus();
}

std::pair<at::Tensor, at::Tensor> QuantRange(const QuantizationArgs& args,
                                             const c10::Device& device) {
  // torch.tensor(python float): 0-dim fp32.
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  double lo = 0, hi = 0;
  if (args.type == QuantType::kInt) {
    const double range = std::pow(2.0, args.num_bits);
    hi = range / 2 - 1;
    lo = -range / 2;
  } else if (args.num_bits == 8) {
    lo = -448.0, hi = 448.0;
  } else {
    lo = -6.0, hi = 6.0;
  }
  return {at::scalar_tensor(lo, options), at::scalar_tensor(hi, options)};
}

at::Tensor CastToFp4(const at::Tensor& input) {
  // cast_to_fp4 (fp4_utils.py): the masks run in this order on the values
  // the previous ones wrote.
  at::Tensor sign = at::sign(input);
  at::Tensor x = at::abs(input);
  x.masked_fill_(x.ge(0.0).logical_and_(x.le(0.25)), 0.0);
  x.masked_fill_(x.gt(0.25).logical_and_(x.lt(0.75)), 0.5);
  x.masked_fill_(x.ge(0.75).logical_and_(x.le(1.25)), 1.0);
  x.masked_fill_(x.gt(1.25).logical_and_(x.lt(1.75)), 1.5);
  x.masked_fill_(x.ge(1.75).logical_and_(x.le(2.5)), 2.0);
  x.masked_fill_(x.gt(2.5).logical_and_(x.lt(3.5)), 3.0);
  x.masked_fill_(x.ge(3.5).logical_and_(x.le(5.0)), 4.0);
  x.masked_fill_(x.gt(5.0), 6.0);
  return x * sign;
}

at::Tensor RoundToPowerOf2(const at::Tensor& x) {
  // round_to_power_2 (mxfp_utils.py).
  const c10::ScalarType dtype = x.scalar_type();
  int mantissa = 0, exponent = 0;
  c10::ScalarType int_dtype = at::kUInt32;
  switch (dtype) {
    case at::kBFloat16:
      int_dtype = at::kUInt16, mantissa = 7, exponent = 8;
      break;
    case at::kHalf:
      int_dtype = at::kUInt16, mantissa = 10, exponent = 5;
      break;
    case at::kFloat:
      int_dtype = at::kUInt32, mantissa = 23, exponent = 8;
      break;
    default:
      int_dtype = at::kUInt64, mantissa = 52, exponent = 11;
      break;
  }
  at::Tensor bits =
      x.view(int_dtype).to(int_dtype == at::kUInt64 ? at::kLong : at::kInt);
  const int64_t val_to_add = int64_t{1}
                             << (mantissa - 1 - 1);  // fp4 mantissa 1
  const int64_t mask = ((int64_t{1} << (exponent + 1)) - 1) << mantissa;
  at::Tensor max_uint = at::bitwise_and(bits + val_to_add, mask);
  if (int_dtype == at::kUInt16) return max_uint.to(int_dtype).view(dtype);
  return max_uint.view(dtype);
}

namespace internal {

QParams CalculateQParams(const at::Tensor& min_in, const at::Tensor& max_in,
                         const QuantizationArgs& args,
                         const at::Tensor& global_scale) {
  at::Tensor min_vals = at::min(min_in, at::zeros_like(min_in));
  at::Tensor max_vals = at::max(max_in, at::zeros_like(max_in));
  const c10::Device device = min_vals.device();
  auto [bit_min, bit_max] = QuantRange(args, device);
  at::Tensor bit_range = bit_max - bit_min;

  at::Tensor scales, zero_points;
  if (args.symmetric) {
    at::Tensor max_val_pos = at::max(at::abs(min_vals), at::abs(max_vals));
    if (args.is_mx()) {
      // generate_mx_scales: floor(log2(max)) - floor(log2(type max)) + 127.
      const int offset = args.num_bits == 4 ? 2 : 8;
      at::Tensor pow2 = RoundToPowerOf2(max_val_pos);
      scales = (127 + at::floor(at::log2(pow2))) - offset;
    } else {
      scales = max_val_pos / (bit_range.to(max_val_pos.scalar_type()) / 2);
    }
    zero_points = at::zeros(
        scales.sizes(),
        at::TensorOptions().device(device).dtype(min_vals.scalar_type()));
  } else {
    scales = (max_vals - min_vals) / bit_range.to(max_vals.scalar_type());
    zero_points = bit_min - (min_vals / scales);
    zero_points = at::clamp(zero_points, bit_min, bit_max);
  }
  if (global_scale.defined()) scales = global_scale * scales;
  if (args.scale_dtype.has_value()) {
    scales = RoundToDtype(scales, *args.scale_dtype, true);
  }
  if (args.is_mx()) {  // maybe_convert_from_mx_exp
    const c10::ScalarType original = scales.scalar_type();
    at::Tensor exp = scales.to(at::kInt) - 127;
    scales = at::pow(2.0, exp.to(at::kFloat)).to(original);
  }
  const double eps = DtypeEps(
      args.scale_dtype.has_value() ? *args.scale_dtype : scales.scalar_type());
  scales =
      at::where(scales == 0, at::scalar_tensor(eps, scales.options()), scales);
  zero_points = RoundToDtype(zero_points, *args.zp_dtype, false);
  if (scales.dim() == 0) {
    scales = scales.reshape({1});
    zero_points = zero_points.reshape({1});
  }
  return {scales, zero_points, global_scale};
}

at::Tensor ProcessQuantization(const at::Tensor& x, const QParams& q,
                               const QuantizationArgs& args,
                               std::optional<c10::ScalarType> dtype,
                               bool do_quantize, bool do_dequantize) {
  auto [q_min, q_max] = QuantRange(args, x.device());
  const Strategy s = args.resolved_strategy();
  if (s == Strategy::kBlock) {  // _process_block
    const int64_t bh = (*args.block_structure)[0];
    const int64_t bw = (*args.block_structure)[1];
    at::Tensor padded = PadForBlocks(x, bh, bw);
    const auto padded_shape = padded.sizes().vec();
    at::Tensor blocks =
        padded.reshape({padded_shape[0] / bh, bh, padded_shape[1] / bw, bw})
            .transpose(1, 2);
    at::Tensor sb = q.scale.unsqueeze(-1).unsqueeze(-1);
    at::Tensor zb = q.zero_point.defined()
                        ? q.zero_point.unsqueeze(-1).unsqueeze(-1)
                        : at::Tensor();
    at::Tensor out =
        ApplyQuantizeOp(blocks, sb, zb, q_min, q_max, args, dtype, do_quantize,
                        do_dequantize, q.global_scale);
    out = out.transpose(1, 2).reshape(padded_shape);
    if (!x.sizes().equals(padded.sizes())) {
      out = out.slice(0, 0, x.size(0)).slice(1, 0, x.size(1));
    }
    return out;
  }
  if (s == Strategy::kGroup || s == Strategy::kTensorGroup) {  // _process_group
    const int64_t group_size = *args.group_size;
    const c10::ScalarType output_dtype =
        dtype.has_value() ? *dtype : x.scalar_type();
    at::Tensor scale = q.scale, zero_point = q.zero_point;
    while (scale.dim() < 2) {
      scale = scale.unsqueeze(1);
      if (zero_point.defined()) zero_point = zero_point.unsqueeze(1);
    }
    const int64_t groups = (x.size(-1) + group_size - 1) / group_size;
    at::Tensor grouped = x.unflatten(-1, {groups, group_size});
    at::Tensor out = ApplyQuantizeOp(
        grouped, scale.unsqueeze(-1),
        zero_point.defined() ? zero_point.unsqueeze(-1) : at::Tensor(), q_min,
        q_max, args, dtype, do_quantize, do_dequantize, q.global_scale);
    return out.flatten(-2).to(output_dtype);
  }
  return ApplyQuantizeOp(x, q.scale, q.zero_point, q_min, q_max, args, dtype,
                         do_quantize, do_dequantize, q.global_scale);
}

}  // namespace internal

absl::StatusOr<QParams> CalculateQParams(const at::Tensor& min_vals,
                                         const at::Tensor& max_vals,
                                         const QuantizationArgs& args,
                                         const at::Tensor& global_scale) {
  RETURN_IF_ERROR(CheckFinite(min_vals, "min values"));
  RETURN_IF_ERROR(CheckFinite(max_vals, "max values"));
  if (!args.zp_dtype.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.ToString(), ": args are not resolved"));
  }
  return runtime::TorchCall("calculating quantization parameters", [&] {
    return internal::CalculateQParams(min_vals, max_vals, args, global_scale);
  });
}

absl::StatusOr<at::Tensor> GenerateGlobalScale(const at::Tensor& min_in,
                                               const at::Tensor& max_in) {
  return runtime::TorchCall("computing a global scale", [&] {
    // generate_gparam with FP8_E4M3 scales over FP4_E2M1 values.
    at::Tensor min_vals = at::min(min_in, at::zeros_like(min_in));
    at::Tensor max_vals = at::max(max_in, at::zeros_like(max_in));
    at::Tensor max_val_pos = at::max(at::abs(min_vals), at::abs(max_vals));
    double tiny = 0;
    switch (max_val_pos.scalar_type()) {
      case at::kBFloat16:
        tiny = std::pow(2.0, -126);
        break;
      case at::kHalf:
        tiny = std::pow(2.0, -14);
        break;
      case at::kDouble:
        tiny = std::numeric_limits<double>::min();
        break;
      default:
        tiny = std::numeric_limits<float>::min();
        break;
    }
    max_val_pos = at::clamp(max_val_pos, tiny, std::nullopt);
    // Python: 448.0 * 6.0 / tensor, i.e. (a python float) / tensor.
    at::Tensor global_scale = at::reciprocal(max_val_pos) * (448.0 * 6.0);
    global_scale = at::nan_to_num(global_scale, 1.0, 1.0, 1.0);
    return global_scale.to(at::kFloat).reshape({1});
  });
}

absl::StatusOr<at::Tensor> Quantize(const at::Tensor& x, const QParams& q,
                                    const QuantizationArgs& args,
                                    std::optional<c10::ScalarType> dtype) {
  RETURN_IF_ERROR(CheckFinite(x, "quantize input"));
  RETURN_IF_ERROR(CheckParamShapes(x, q, args));
  return runtime::TorchCall(absl::StrCat("quantizing ", args.ToString()), [&] {
    return internal::ProcessQuantization(x, q, args, dtype, true, false);
  });
}

absl::StatusOr<at::Tensor> Dequantize(const at::Tensor& x_q, const QParams& q,
                                      const QuantizationArgs& args,
                                      std::optional<c10::ScalarType> dtype) {
  RETURN_IF_ERROR(CheckParamShapes(x_q, q, args));
  return runtime::TorchCall(
      absl::StrCat("dequantizing ", args.ToString()), [&] {
        return internal::ProcessQuantization(
            x_q, q, args, dtype.has_value() ? *dtype : q.scale.scalar_type(),
            false, true);
      });
}

absl::StatusOr<at::Tensor> FakeQuantize(const at::Tensor& x, const QParams& q,
                                        const QuantizationArgs& args) {
  RETURN_IF_ERROR(CheckFinite(x, "fake-quantize input"));
  RETURN_IF_ERROR(CheckParamShapes(x, q, args));
  return runtime::TorchCall(absl::StrCat("fake-quantizing ", args.ToString()),
                            [&] {
                              return internal::ProcessQuantization(
                                  x, q, args, std::nullopt, true, true);
                            });
}

absl::StatusOr<QParams> DynamicQParams(const at::Tensor& value,
                                       const QuantizationArgs& args,
                                       const at::Tensor& global_scale) {
  RETURN_IF_ERROR(CheckFinite(value, "activation"));
  const Strategy s = args.resolved_strategy();
  if (s == Strategy::kGroup || s == Strategy::kTensorGroup) {
    RETURN_IF_ERROR(CheckGroupColumns(value.size(-1), *args.group_size, args));
  } else if (s != Strategy::kToken && s != Strategy::kTensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        args.ToString(),
        ": dynamic quantization needs strategy token, tensor, group or "
        "tensor_group"));
  }
  return runtime::TorchCall("computing dynamic quantization parameters", [&] {
    at::Tensor min_val, max_val;
    if (s == Strategy::kToken) {
      std::vector<int64_t> dims;
      for (int64_t d = 0; d < value.dim(); ++d) {
        if (d != 0 && d != 1) dims.push_back(d);
      }
      if (dims.empty()) {  // `not reduce_dims`: aminmax over everything.
        std::tie(min_val, max_val) = at::aminmax(value);
      } else {
        min_val = at::amin(value, dims, /*keepdim=*/true);
        max_val = at::amax(value, dims, /*keepdim=*/true);
      }
    } else if (s == Strategy::kTensor) {
      std::tie(min_val, max_val) = at::aminmax(value);
    } else {
      const int64_t group_size = *args.group_size;
      at::Tensor grouped = value.unflatten(
          -1, {(value.size(-1) + group_size - 1) / group_size, group_size});
      min_val = at::amin(grouped, {-1}, /*keepdim=*/false);
      max_val = at::amax(grouped, {-1}, /*keepdim=*/false);
    }
    return internal::CalculateQParams(min_val, max_val, args, global_scale);
  });
}

}  // namespace tracecut::quantization
