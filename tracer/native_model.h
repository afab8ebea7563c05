#ifndef TRACECUT_TRACER_NATIVE_MODEL_H_
#define TRACECUT_TRACER_NATIVE_MODEL_H_

// Transformers decoder-only models of the Llama family built from their
// config.json alone, without Python: the module tree `tracecut export`
// would rebuild from the model's torch.export program (same module paths,
// class names, operators and float32 program dtype; or transformers' casts
// in bfloat16 / float16), written as TorchScript
// and compiled here, so that a checkpoint directory can be traced,
// partitioned and calibrated without an export step (importing torch and
// transformers and running torch.export cost seconds; this costs
// milliseconds). Note [Native models] in native_model.cc.
//
//   ASSIGN_OR_RETURN(hf::HfConfig config, hf::HfConfig::Load(dir +
//   "/config.json")); if (NativeSupport(config).ok()) {
//     ASSIGN_OR_RETURN(NativeModel m, BuildNativeModel(dir, config, true));
//   }

#include <torch/script.h>

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tracer/export/pt2_archive.h"
#include "tracer/hf/config.h"

namespace tracecut::tracer {

struct NativeModel {
  torch::jit::Module module;
  // With `defer`: the tensors left in the checkpoint (the module holds
  // stand-ins, exported::StandIn), by module path.
  std::map<std::string, exported::DeferredTensor> deferred;
  // What `tracecut export` would embed: example inputs
  // (tracecut_inputs.json), and the model class with its split modules and
  // tied parameters (tracecut_model.json).
  std::string inputs_json;
  std::string model_json;
};

// OK when `config` describes a model this file builds (LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM,
// GraniteForCausalLM, Olmo2ForCausalLM, with rope scaling none, linear or
// llama3, and unquantized weights); otherwise why not, naming the key.
absl::Status NativeSupport(const hf::HfConfig& config);

// Builds the model of checkpoint directory `dir` (config.json and
// safetensors), computing in `dtype` (float32, bfloat16 or float16).
// Tensors are the checkpoint's, converted to `dtype`; with `defer`,
// stand-ins whose values stay in the checkpoint. In float32 the program is
// the export's; in bfloat16 or float16 it casts as transformers' modules
// do (RMSNorm and rotary tables in float32, the rest in `dtype`), which is
// how llm-compressor runs a checkpoint it loads in its own dtype. Errors name
// the file and tensor: a tensor the model needs that the checkpoint lacks, or
// of another shape than the config implies.
absl::StatusOr<NativeModel> BuildNativeModel(
    const std::string& dir, const hf::HfConfig& config, bool defer,
    c10::ScalarType dtype = torch::kFloat);

}  // namespace tracecut::tracer

#endif  // TRACECUT_TRACER_NATIVE_MODEL_H_
