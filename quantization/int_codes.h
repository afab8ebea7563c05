#ifndef TRACECUT_QUANTIZATION_INT_CODES_H_
#define TRACECUT_QUANTIZATION_INT_CODES_H_

// Integer codes of a weight in one pass over its memory: what writing a
// compressed-tensors checkpoint does to every quantized Linear, which as
// tensor operators (Quantize, Dequantize, compare, PackToInt32) took about a
// tenth of a GPTQ run's time.
//
//   ASSIGN_OR_RETURN(std::optional<at::Tensor> packed,
//                    PackedIntCodes(w, q, args));
//   if (!packed.has_value()) ... the tensor path (Quantize, PackToInt32) ...
//
// Note [One-pass integer codes]
// -----------------------------
// Each element goes through the operations fake_quant's tensor path applies
// to it, rounded where those round: x / scale in the dtype torch promotes the
// weight and the scale to, plus the zero point (cast to the weight's dtype),
// clamped to the range and rounded half to even; dequantized in the scale's
// dtype. So the results are the tensor path's bits (int_codes_test compares
// them on every dtype combination). The kernels apply to integer schemes of
// tensor, channel or group strategy without a global scale, on contiguous
// 2-D CPU weights of fp32 / bf16 / fp16 with scales of those dtypes; for
// anything else, and for a weight with a NaN or infinity (whose error the
// tensor path reports), they return nullopt and the caller takes the tensor
// path.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "quantization/fake_quant.h"
#include "quantization/quant_args.h"

namespace tracecut::quantization {

// pack_quantized's int32 words of w's codes, [rows, ceil(cols * bits / 32)]:
// PackToInt32(Quantize(w, q, args, kChar), args.num_bits), for num_bits 1, 2,
// 4 or 8.
absl::StatusOr<std::optional<at::Tensor>> PackedIntCodes(
    const at::Tensor& w, const QParams& q, const QuantizationArgs& args);

// How many elements of `w` its codes do not give back: the count of
// Dequantize(Quantize(w, q, args), {dequant_scale, q.zero_point},
// args).to(w.dtype) != w.
absl::StatusOr<std::optional<int64_t>> CountOffGrid(
    const at::Tensor& w, const QParams& q, const at::Tensor& dequant_scale,
    const QuantizationArgs& args);

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_INT_CODES_H_
