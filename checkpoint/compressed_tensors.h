#ifndef TRACECUT_CHECKPOINT_COMPRESSED_TENSORS_H_
#define TRACECUT_CHECKPOINT_COMPRESSED_TENSORS_H_

// compressed-tensors checkpoints (the format vLLM serves and transformers
// loads with `quant_method: compressed-tensors`): integer weights packed
// into int32, in the layout of the pinned compressed-tensors version's
// "pack-quantized" format (third_party/python: 0.19.0).
//
//   ASSIGN_OR_RETURN(auto tensors, CompressLinear(linear));  // weight_packed..
//   ASSIGN_OR_RETURN(std::string config,
//                    ConfigWithQuantization(config_json, {linear}));
//
// Note [pack-quantized layout]
// * Integer codes are signed, q in [-2^(b-1), 2^(b-1) - 1] (tracecut's own
//   convention, quantization/quantize.h); dequantized weight = (q - zero_point)
//   * scale, in fp32.
// * `weight_packed` int32 [out, ceil(in * b / 32)]: each row's codes, offset
//   by 2^(b-1) to be unsigned, as one little-endian bit stream (code k at
//   bits k*b .. k*b + b - 1), cut into 32-bit words.
// * `weight_scale` [out, groups] (fp32 here), `weight_shape` int64 [2].
// * `weight_zero_point`: only for asymmetric schemes, packed the same way
//   but along the output dimension: int32 [ceil(out * b / 32), groups].
// * Groups are runs of group_size consecutive input columns. This version
//   has no g_idx (it dropped actorder="group"): GPTQ with act order writes
//   it with static groups (quantization/gptq.h Note [GPTQ in tracecut] 8).

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tracecut::checkpoint {

// How one Linear's weight is quantized.
struct CtWeightArgs {
  int num_bits = 4;
  bool symmetric = true;
  int64_t group_size = -1;  // -1: one scale per output channel.

  friend bool operator==(const CtWeightArgs& a, const CtWeightArgs& b) {
    return a.num_bits == b.num_bits && a.symmetric == b.symmetric &&
           a.group_size == b.group_size;
  }
};

// A quantized Linear as calibration leaves it.
struct CtLinear {
  std::string path;  // "model.layers.0.mlp.down_proj".
  CtWeightArgs args;
  torch::Tensor weight;      // [out, in]: the dequantized values.
  torch::Tensor scale;       // fp32 [out, groups].
  torch::Tensor zero_point;  // int32 [out, groups].
};

// Packs int8 `codes` [rows, cols] of `num_bits` (1..8) bits into int32
// words along `dim` (1: each row; 0: each column), as compressed-tensors'
// pack_to_int32 does.
absl::StatusOr<torch::Tensor> PackToInt32(const torch::Tensor& codes,
                                          int num_bits, int dim = 1);

// The tensors that stand for `linear.weight` in a compressed-tensors
// checkpoint, named "<path>.weight_packed" and so on, in a fixed order. The
// integer codes are recovered from the dequantized weight; unless
// dequantizing them gives back exactly `linear.weight` (bit for bit),
// FailedPrecondition naming the module: never a checkpoint that decodes to
// other weights than tracecut's own model has.
absl::StatusOr<std::vector<std::pair<std::string, torch::Tensor>>>
CompressLinear(const CtLinear& linear);

// `config_json` (a model's config.json) with a compressed-tensors
// `quantization_config`: one config group per distinct CtWeightArgs, whose
// targets are its modules' paths, format "pack-quantized", status
// "compressed". Pretty-printed, keys in their original order.
absl::StatusOr<std::string> ConfigWithQuantization(
    const std::string& config_json,
    const std::vector<std::pair<std::string, CtWeightArgs>>& modules);

}  // namespace tracecut::checkpoint

#endif  // TRACECUT_CHECKPOINT_COMPRESSED_TENSORS_H_
