#ifndef TRACECUT_QUANTIZATION_QUANT_ARGS_H_
#define TRACECUT_QUANTIZATION_QUANT_ARGS_H_

// The typed quantization scheme, as compressed-tensors (0.19, the pinned
// version) defines it: QuantizationArgs mirrors `QuantizationArgs`,
// QuantizationScheme mirrors `QuantizationScheme`, QuantizationConfig the
// `quantization_config` of a checkpoint's config.json; the presets are
// compressed-tensors' PRESET_SCHEMES (quant_scheme.py), field for field.
//
//   ASSIGN_OR_RETURN(QuantizationScheme scheme, PresetScheme("NVFP4",
//   {"Linear"})); util::Json j = scheme.ToJson();        // ==
//   QuantizationScheme.model_dump() ASSIGN_OR_RETURN(QuantizationScheme back,
//   QuantizationScheme::FromJson(j, "recipe"));
//
// Construction never validates; Resolve() does, the way compressed-tensors'
// model validators do (infers `strategy` from `group_size` and the default
// `zp_dtype`), and additionally refuses what tracecut cannot compute or store
// (see Note [What tracecut refuses]). Every error is one InvalidArgument line
// naming the field: "weights.group_size: float 4-bit ...".
//
// Note [What tracecut refuses]
// ----------------------------
// Beyond compressed-tensors' own checks: int num_bits outside 2..8; float
// num_bits other than 4 and 8; asymmetric float (no serving kernel reads a
// float zero point); float 4-bit that is neither NVFP4 (tensor_group, group
// 16, float8_e4m3fn scales) nor MXFP4 (group, group 32, uint8 e8m0 scales);
// dynamic or token/attn_head weights; observers other than minmax,
// static_minmax, memoryless_minmax, mse and memoryless_mse.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/json.h"

namespace tracecut::quantization {

enum class QuantType { kInt, kFloat };
enum class Strategy {
  kTensor,
  kChannel,
  kGroup,
  kBlock,
  kToken,
  kTensorGroup,
  kAttnHead,
};
// compressed-tensors' `dynamic`: false, true, or "local" (only the per-group
// scales are dynamic; the global scale is calibrated; NVFP4 activations).
enum class Dynamic { kStatic, kDynamic, kLocal };
// GPTQ's activation ordering. "static" is compressed-tensors' alias of
// "weight"; it is kept as written so the JSON round-trips.
enum class ActOrder { kNone, kWeight, kStatic };

absl::string_view QuantTypeName(QuantType t);  // "int", "float"
absl::string_view StrategyName(Strategy s);    // "tensor", ..., "attn_head"
absl::string_view ActOrderName(ActOrder a);    // "", "weight", "static"
// "torch.float8_e4m3fn"-style name of a dtype, as compressed-tensors writes it.
std::string TorchDtypeName(c10::ScalarType dtype);

struct QuantizationArgs {
  int num_bits = 8;
  QuantType type = QuantType::kInt;
  bool symmetric = true;
  std::optional<int64_t> group_size;
  std::optional<Strategy> strategy;  // Inferred by Resolve() when unset.
  std::optional<std::vector<int64_t>> block_structure;  // [rows, cols].
  Dynamic dynamic = Dynamic::kStatic;
  ActOrder actorder = ActOrder::kNone;
  std::optional<c10::ScalarType> scale_dtype;
  std::optional<c10::ScalarType> zp_dtype;  // Defaulted by Resolve().
  std::optional<std::string> observer;
  util::Json observer_kwargs = util::Json::object();

  // Infers strategy and zp_dtype as compressed-tensors does and validates;
  // `field` names this set of args in errors ("weights").
  absl::Status Resolve(absl::string_view field);

  // The strategy after Resolve() (tensor when unresolved and no group).
  Strategy resolved_strategy() const;
  bool is_fp4() const { return type == QuantType::kFloat && num_bits == 4; }
  bool is_fp8() const { return type == QuantType::kFloat && num_bits == 8; }
  // MX scales: float 4/8-bit, group 32, uint8 (e8m0) scale_dtype
  // (compressed-tensors' should_generate_mx_scales).
  bool is_mx() const;
  // The dtype quantized values are stored in (compressed-tensors'
  // pytorch_dtype): int8/int16/int32 by bits, float8_e4m3fn for float 8-bit.
  // Float 4-bit has none (it is packed); kUndefined then.
  c10::ScalarType storage_dtype() const;
  // "int4 sym group128", "float8 sym channel", "float4 tensor_group16".
  std::string ToString() const;

  // QuantizationArgs.model_dump(): every field, in compressed-tensors' order.
  util::Json ToJson() const;
  // Parses and resolves; unknown fields are refused (extra="forbid").
  static absl::StatusOr<QuantizationArgs> FromJson(const util::Json& j,
                                                   absl::string_view field);

  bool operator==(const QuantizationArgs& other) const;
};

struct QuantizationScheme {
  std::vector<std::string> targets;
  std::optional<QuantizationArgs> weights;
  std::optional<QuantizationArgs> input_activations;
  std::optional<QuantizationArgs> output_activations;
  std::optional<std::string> format;

  // Resolves each set of args and checks the scheme-level rules (activation
  // strategies, no actorder on activations, no "mixed-precision" format).
  absl::Status Resolve(absl::string_view field = "scheme");

  util::Json ToJson() const;
  static absl::StatusOr<QuantizationScheme> FromJson(const util::Json& j,
                                                     absl::string_view field);

  bool operator==(const QuantizationScheme& other) const;
};

// A checkpoint's `quantization_config` (compressed-tensors'
// QuantizationConfig): config groups, the modules left alone, the format.
struct QuantizationConfig {
  // In order ("group_0", "group_1", ...), as compressed-tensors writes them.
  std::vector<std::pair<std::string, QuantizationScheme>> config_groups;
  std::string quant_method = "compressed-tensors";
  std::optional<QuantizationArgs> kv_cache_scheme;
  std::string format = "dense";
  std::string quantization_status = "initialized";
  std::optional<double> global_compression_ratio;
  std::vector<std::string> ignore;

  util::Json ToJson() const;
  static absl::StatusOr<QuantizationConfig> FromJson(const util::Json& j,
                                                     absl::string_view field);
};

// Names of compressed-tensors' presets, in PRESET_SCHEMES' order.
const std::vector<std::string>& PresetNames();
// The preset `name` (case-insensitive, as compressed-tensors) applied to
// `targets`, resolved. Unknown names: InvalidArgument listing the known ones.
absl::StatusOr<QuantizationScheme> PresetScheme(
    absl::string_view name, std::vector<std::string> targets);

}  // namespace tracecut::quantization

#endif  // TRACECUT_QUANTIZATION_QUANT_ARGS_H_
