#ifndef TRACECUT_QUANTIZATION_COMPRESSORS_H_
#define TRACECUT_QUANTIZATION_COMPRESSORS_H_

// compressed-tensors' storage formats for a quantized Linear (0.19's
// compressors/): which format a scheme is stored in, and the tensors that
// stand for the module's weight in it, bit-exact with the compressor's own
// `compress` on the CPU.
//
//   CompressionFormat f = InferFormat(scheme);       // e.g.
//   kNvfp4PackQuantized ASSIGN_OR_RETURN(auto tensors, CompressWeight(w, q,
//   scheme, f));
//   // {"weight_packed", uint8}, {"weight_scale", fp8}, {"weight_global_scale"}
//
// Formats (names as in config.json):
// * pack-quantized: int 1..8 bits packed densely into int32 along the input
//   dimension, offset to unsigned (weight_packed, weight_scale,
//   weight_shape; an asymmetric group/channel zero point packed along the
//   output dimension);
// * int-quantized / float-quantized / naive-quantized: int8 or
//   float8_e4m3fn `weight` with weight_scale (and weight_zero_point when
//   asymmetric); int- and float- need input activations quantized;
// * nvfp4-pack-quantized: e2m1 pairs in uint8 (low nibble first, sign in
//   bit 3), weight_scale in float8_e4m3fn, weight_global_scale fp32;
// * mxfp4-pack-quantized: the same packing, weight_scale as uint8 e8m0
//   exponents; mxfp8-quantized: float8 `weight` with e8m0 scales.
// Zero points of symmetric schemes are dropped, as compressed-tensors does.

#include <ATen/core/Tensor.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "quantization/fake_quant.h"
#include "quantization/quant_args.h"

namespace tracecut::quantization {

enum class CompressionFormat {
  kDense,
  kIntQuantized,
  kFloatQuantized,
  kNaiveQuantized,
  kPackQuantized,
  kNvfp4PackQuantized,
  kMxfp4PackQuantized,
  kMxfp8Quantized,
  kMixedPrecision,
};

absl::string_view FormatName(CompressionFormat f);  // "pack-quantized", ...
absl::StatusOr<CompressionFormat> ParseFormat(absl::string_view name);

// infer_module_format for a Linear: the first format of compressed-tensors'
// priority list whose compressor can store `scheme` (dense when the scheme
// quantizes no weight).
CompressionFormat InferFormat(const QuantizationScheme& scheme);
// infer_model_format's flattening: dense for none, the one format, or
// mixed-precision.
CompressionFormat ModelFormat(const std::set<CompressionFormat>& formats);
// Whether `format`'s compressor can store `scheme` (its can_compress).
bool CanCompress(CompressionFormat format, const QuantizationScheme& scheme);

// The compressed tensors of one Linear weight [out, in] with parameters `q`
// (in the dtypes WeightQParams returns), named without the module prefix, in
// compressed-tensors' state-dict order. `weight` is the original (or the
// GPTQ-updated) weight: it is quantized here, as the compressor does.
absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> CompressWeight(
    const at::Tensor& weight, const QParams& q,
    const QuantizationScheme& scheme, CompressionFormat format);

// pack_to_int32: int8 codes of `num_bits` (1..8) packed along dim `dim`.
absl::StatusOr<at::Tensor> PackToInt32(const at::Tensor& codes, int num_bits,
                                       int dim = 1);
// pack_fp4_to_uint8: e2m1 values [m, n] (n even) to uint8 [m, n / 2].
absl::StatusOr<at::Tensor> PackFp4ToUint8(const at::Tensor& values);
// compress_mx_scale: power-of-two scales to uint8 e8m0 exponents.
at::Tensor CompressMxScale(const at::Tensor& scale);

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_COMPRESSORS_H_
