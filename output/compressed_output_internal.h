#ifndef TRACECUT_OUTPUT_COMPRESSED_OUTPUT_INTERNAL_H_
#define TRACECUT_OUTPUT_COMPRESSED_OUTPUT_INTERNAL_H_

// What compressed_output.cc (the checkpoint's files, whole or shard by shard)
// takes from compressed_output_quantization.cc (each quantized module's
// tensors and the quantization_config). Not API.

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/compressed_tensors.h"
#include "modifiers/modifier.h"

namespace tracecut::output::internal {

using Tensors = std::vector<std::pair<std::string, torch::Tensor>>;

// One quantized module for quantization_config: tracecut's integer scheme
// (`args`) or a compressed-tensors one (`typed`, the record's
// weight_quantization).
struct QuantizedModule {
  std::string path;
  checkpoint::CtWeightArgs args;
  std::string typed;
};

// Whether `r` asks for compressed output (anything quantized or observed).
bool IsQuantRecord(const modifiers::ModuleRecord& r);

// quantization_config for `modules`: all typed or all tracecut's integer
// schemes. `linear_subclasses`: modules of torch.nn.Linear's subclasses,
// which compressed-tensors' "Linear" target matches (by class ancestry): the
// ones not in `modules` are ignored by name, or transformers would look
// for their quantized weights.
absl::StatusOr<std::string> QuantizationConfigFor(
    const std::string& config_json, const std::vector<QuantizedModule>& modules,
    const std::string& kv_cache_scheme,
    const std::vector<std::string>& linear_subclasses = {});

// The attention modules' k/v scales (weight_quant_modifier.h Note [KV cache])
// and the kv_cache_scheme they share ("" when none).
absl::StatusOr<std::pair<Tensors, std::string>> KvCache(
    const modifiers::CalibrationResults& results);

// Every module `results` quantized, with its scheme; errors as
// QuantizedLinear's. FailedPrecondition when there is none.
absl::StatusOr<std::vector<QuantizedModule>> QuantizedModules(
    const modifiers::CalibrationResults& results, const std::string& where);

// Appends `weight` of the quantized Linear at `module` as the tensors its
// compressed-tensors format stores; its entry for the config.
absl::StatusOr<QuantizedModule> AppendPacked(
    const at::Tensor& weight, const std::string& module,
    const modifiers::ModuleRecord& record, Tensors& out);

}  // namespace tracecut::output::internal

#endif  // TRACECUT_OUTPUT_COMPRESSED_OUTPUT_INTERNAL_H_
