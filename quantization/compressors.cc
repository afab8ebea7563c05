#include "quantization/compressors.h"

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "quantization/int_codes.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::quantization {
namespace {

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

constexpr std::array<std::pair<CompressionFormat, const char*>, 9> kNames = {{
    {CompressionFormat::kDense, "dense"},
    {CompressionFormat::kIntQuantized, "int-quantized"},
    {CompressionFormat::kFloatQuantized, "float-quantized"},
    {CompressionFormat::kNaiveQuantized, "naive-quantized"},
    {CompressionFormat::kPackQuantized, "pack-quantized"},
    {CompressionFormat::kNvfp4PackQuantized, "nvfp4-pack-quantized"},
    {CompressionFormat::kMxfp4PackQuantized, "mxfp4-pack-quantized"},
    {CompressionFormat::kMxfp8Quantized, "mxfp8-quantized"},
    {CompressionFormat::kMixedPrecision, "mixed-precision"},
}};

// COMPRESSION_FORMAT_PRIORITY.
constexpr std::array<CompressionFormat, 7> kPriority = {
    CompressionFormat::kMxfp4PackQuantized, CompressionFormat::kMxfp8Quantized,
    CompressionFormat::kNvfp4PackQuantized, CompressionFormat::kIntQuantized,
    CompressionFormat::kPackQuantized,      CompressionFormat::kFloatQuantized,
    CompressionFormat::kNaiveQuantized,
};

bool IsFloat(const QuantizationArgs& a) { return a.type == QuantType::kFloat; }

// NaiveQuantizationCompressor.compress: the weight in its storage dtype
// (block weights padded to whole blocks, then cut back).
at::Tensor NaiveWeight(const at::Tensor& weight, const QParams& q,
                       const QuantizationArgs& args) {
  return internal::ProcessQuantization(weight, q, args, args.storage_dtype(),
                                       true, false);
}

}  // namespace

absl::string_view FormatName(CompressionFormat f) {
  for (const auto& [format, name] : kNames) {
    if (format == f) return name;
  }
  return "?";
}

absl::StatusOr<CompressionFormat> ParseFormat(absl::string_view name) {
  for (const auto& [format, n] : kNames) {
    if (name == n) return format;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown compressed-tensors format \"", name,
      "\" (dense, int-quantized, float-quantized, naive-quantized, "
      "pack-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized, "
      "mxfp8-quantized, mixed-precision)"));
}

bool CanCompress(CompressionFormat format, const QuantizationScheme& scheme) {
  if (!scheme.weights.has_value()) return format == CompressionFormat::kDense;
  const QuantizationArgs& w = *scheme.weights;
  const auto& in = scheme.input_activations;
  switch (format) {
    case CompressionFormat::kMxfp4PackQuantized:
      return w.is_fp4() && w.group_size == 32;
    case CompressionFormat::kMxfp8Quantized:
      return w.is_fp8() && w.group_size == 32 &&
             w.scale_dtype == c10::ScalarType::Byte;
    case CompressionFormat::kNvfp4PackQuantized:
      return w.is_fp4() && w.group_size == 16;
    case CompressionFormat::kIntQuantized:
      return in.has_value() && !IsFloat(w);
    case CompressionFormat::kPackQuantized:
      return !(in.has_value() && IsFloat(*in)) && !IsFloat(w) &&
             w.num_bits >= 1 && w.num_bits <= 8;
    case CompressionFormat::kFloatQuantized:
      return in.has_value() && IsFloat(w);
    case CompressionFormat::kNaiveQuantized:
      return true;
    default:
      return false;
  }
}

CompressionFormat InferFormat(const QuantizationScheme& scheme) {
  if (!scheme.weights.has_value()) return CompressionFormat::kDense;
  for (CompressionFormat f : kPriority) {
    if (CanCompress(f, scheme)) return f;
  }
  return CompressionFormat::kDense;
}

CompressionFormat ModelFormat(const std::set<CompressionFormat>& formats) {
  std::set<CompressionFormat> quantized = formats;
  quantized.erase(CompressionFormat::kDense);
  if (quantized.empty()) return CompressionFormat::kDense;
  if (quantized.size() == 1) return *quantized.begin();
  return CompressionFormat::kMixedPrecision;
}

absl::StatusOr<at::Tensor> PackToInt32(const at::Tensor& codes, int num_bits,
                                       int dim) {
  if (codes.scalar_type() != at::kChar || codes.dim() != 2) {
    return absl::InvalidArgumentError("pack_to_int32 needs 2-D int8 codes");
  }
  if (num_bits < 1 || num_bits > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("pack_to_int32 packs 1..8 bits, got ", num_bits));
  }
  return runtime::TorchCall("packing to int32", [&] {
    at::Tensor value = codes.to(at::kInt) + (int64_t{1} << (num_bits - 1));
    if (dim == 0) value = value.transpose(0, 1);
    const int64_t rows = value.size(0), cols = value.size(1);
    const int64_t packed_cols = (cols * num_bits + 31) / 32;
    const int64_t padded_cols = (cols + 31) / 32 * 32;
    if (padded_cols > cols) {
      value = at::constant_pad_nd(value, {0, padded_cols - cols}, 0);
    }
    const int64_t groups = padded_cols / 32;
    const int64_t rows_g = rows * groups;
    at::Tensor value_g = value.reshape({rows_g, 32});
    at::Tensor out = at::zeros({rows_g, num_bits}, value.options());
    at::Tensor bit_starts = at::arange(32, value.options()) * num_bits;
    at::Tensor word_idx = at::floor_divide(bit_starts, 32).to(at::kLong);
    at::Tensor bit_offset = at::remainder(bit_starts, 32);
    out.scatter_add_(1, word_idx.unsqueeze(0).expand({rows_g, -1}),
                     at::bitwise_left_shift(value_g, bit_offset.unsqueeze(0)));
    at::Tensor ov = bit_offset + num_bits - 32;
    at::Tensor ov_mask = ov > 0;
    if (ov_mask.any().item<bool>()) {
      at::Tensor idx = ov_mask.nonzero().squeeze(1);
      at::Tensor ov_vals = at::bitwise_right_shift(
          value_g.index_select(1, idx),
          (num_bits - ov.index_select(0, idx)).unsqueeze(0));
      out.scatter_add_(
          1,
          (word_idx.index_select(0, idx) + 1).unsqueeze(0).expand({rows_g, -1}),
          ov_vals);
    }
    at::Tensor packed =
        out.view({rows, groups * num_bits}).slice(1, 0, packed_cols);
    if (dim == 0) packed = packed.transpose(0, 1);
    return packed;
  });
}

absl::StatusOr<at::Tensor> PackFp4ToUint8(const at::Tensor& x) {
  if (x.dim() != 2 || x.size(1) % 2 != 0) {
    return absl::InvalidArgumentError(
        "nvfp4 packing needs a 2-D tensor with an even number of columns");
  }
  return runtime::TorchCall("packing fp4", [&] {
    at::Tensor sign = at::signbit(x).to(at::kByte);
    at::Tensor v = (x * 2).to(at::kChar).abs_();
    at::Tensor idx = at::zeros_like(v, v.options().dtype(at::kByte));
    const std::array<std::pair<int, int>, 6> exact = {
        {{1, 1}, {2, 2}, {3, 3}, {4, 4}, {6, 5}, {8, 6}}};
    for (const auto& [twice, code] : exact) {
      idx.masked_fill_(v == twice, code);
    }
    idx.masked_fill_(v >= 12, 7);
    idx = at::bitwise_or(idx, at::bitwise_left_shift(sign, 3));
    idx = idx.reshape({-1, 2});
    at::Tensor packed = at::bitwise_or(
        idx.select(1, 0), at::bitwise_left_shift(idx.select(1, 1), 4));
    return packed.reshape({x.size(0), x.size(1) / 2});
  });
}

at::Tensor CompressMxScale(const at::Tensor& scale) {
  return (at::floor(at::log2(scale)).to(at::kInt) + 127).to(at::kByte);
}

absl::StatusOr<Tensors> CompressWeight(const at::Tensor& weight,
                                       const QParams& q,
                                       const QuantizationScheme& scheme,
                                       CompressionFormat format) {
  if (!scheme.weights.has_value()) {
    return absl::InvalidArgumentError("scheme quantizes no weight");
  }
  const QuantizationArgs& args = *scheme.weights;
  if (!CanCompress(format, scheme)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format ", FormatName(format), " cannot store ", args.ToString(),
        scheme.input_activations.has_value()
            ? absl::StrCat(" with input activations ",
                           scheme.input_activations->ToString())
            : std::string(" (weights only)")));
  }
  RETURN_IF_ERROR(CheckFinite(weight, "weight"));
  if (weight.dim() != 2) {
    return absl::InvalidArgumentError("compressing needs a 2-D weight");
  }
  Tensors out;
  const bool keep_zp = !args.symmetric && q.zero_point.defined();
  switch (format) {
    case CompressionFormat::kPackQuantized: {
      ASSIGN_OR_RETURN(std::optional<at::Tensor> packed,
                       PackedIntCodes(weight, q, args));
      if (!packed.has_value()) {
        ASSIGN_OR_RETURN(at::Tensor codes,
                         Quantize(weight, q, args, at::kChar));
        ASSIGN_OR_RETURN(packed, PackToInt32(codes, args.num_bits));
      }
      out.emplace_back("weight_packed", *packed);
      out.emplace_back("weight_scale", q.scale);
      out.emplace_back("weight_shape",
                       at::tensor(weight.sizes().vec(), at::kLong));
      if (keep_zp) {
        const Strategy s = args.resolved_strategy();
        if (s == Strategy::kGroup || s == Strategy::kChannel) {
          ASSIGN_OR_RETURN(at::Tensor zp,
                           PackToInt32(q.zero_point, args.num_bits, 0));
          out.emplace_back("weight_zero_point", zp.contiguous());
        } else {
          out.emplace_back("weight_zero_point", q.zero_point);
        }
      }
      return out;
    }
    case CompressionFormat::kNvfp4PackQuantized:
    case CompressionFormat::kMxfp4PackQuantized: {
      ASSIGN_OR_RETURN(at::Tensor values, Quantize(weight, q, args));
      ASSIGN_OR_RETURN(at::Tensor packed, PackFp4ToUint8(values));
      out.emplace_back("weight_packed", packed);
      if (format == CompressionFormat::kNvfp4PackQuantized) {
        out.emplace_back("weight_scale", q.scale.to(args.scale_dtype.value_or(
                                             c10::ScalarType::Float8_e4m3fn)));
        if (q.global_scale.defined()) {
          out.emplace_back("weight_global_scale", q.global_scale);
        }
      } else {
        out.emplace_back("weight_scale", CompressMxScale(q.scale));
      }
      if (keep_zp) out.emplace_back("weight_zero_point", q.zero_point);
      return out;
    }
    default: {  // int-, float-, naive-quantized, mxfp8-quantized.
      RETURN_IF_ERROR(Quantize(weight, q, args).status());  // Checks shapes.
      ASSIGN_OR_RETURN(at::Tensor stored, runtime::TorchCall("quantizing", [&] {
                         return NaiveWeight(weight, q, args);
                       }));
      out.emplace_back("weight", stored);
      out.emplace_back("weight_scale",
                       format == CompressionFormat::kMxfp8Quantized
                           ? CompressMxScale(q.scale)
                           : q.scale);
      if (keep_zp) out.emplace_back("weight_zero_point", q.zero_point);
      return out;
    }
  }
}

}  // namespace tracecut::quantization
