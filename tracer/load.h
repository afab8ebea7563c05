#ifndef TRACECUT_TRACER_LOAD_H_
#define TRACECUT_TRACER_LOAD_H_

// Loading a TorchScript .pt with the files tracecut embeds in it, with a
// clear error for each way a file can be wrong (missing, empty, truncated,
// not a TorchScript archive) instead of LibTorch's exception text.
//
//   ASSIGN_OR_RETURN(LoadedModel m, LoadModel("llama.pt"));
//   if (m.config) ... m.config->model_type() ...

#include <torch/script.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tracer/export/pt2_archive.h"
#include "tracer/hf/config.h"
#include "tracer/hf/inputs.h"

namespace tracecut::tracer {

// Names of the extra files read from the archive.
inline constexpr char kConfigJson[] = "config.json";
inline constexpr char kInputsJson[] = "tracecut_inputs.json";
// What `tracecut export` records about the model class:
// {"model_class": ..., "no_split_modules": [...]}.
inline constexpr char kModelJson[] = "tracecut_model.json";

struct LoadedModel {
  // The model file (for a directory, the .pt2 in it).
  std::string path;
  // Whether it was a torch.export program (then `module` is rebuilt from it,
  // see tracer/export/pt2_import.h) rather than a TorchScript archive.
  bool from_torch_export = false;
  // Whether it was built from a checkpoint directory's config.json without
  // a .pt2 (tracer/native_model.h); `path` is then the directory.
  bool native = false;
  // What a native model computes in (LoadOptions::dtype resolved).
  c10::ScalarType native_dtype = c10::ScalarType::Float;
  torch::jit::Module module;
  // The embedded config.json, when present.
  std::optional<hf::HfConfig> config;
  // The embedded tracecut_inputs.json, when present.
  std::optional<hf::InputsFile> inputs;
  // Module paths the tracer must keep as leaves whatever the leaf policy
  // says (their code depends on tensor values; see tracer/export).
  std::vector<std::string> required_leaves;
  // A torch.export program's own example inputs, by forward argument name
  // (used when there is no tracecut_inputs.json).
  std::map<std::string, c10::IValue> example_inputs;
  // The raw text of the embedded files that are present (config.json,
  // tracecut_inputs.json), to carry into what is saved from this model.
  torch::jit::ExtraFilesMap extra_files;
  // With LoadOptions::defer_checkpoint_tensors, for a meta-device .pt2 next
  // to its checkpoint: the parameters and buffers left in the checkpoint
  // (the module holds stand-ins), by path, and the checkpoint directory.
  std::map<std::string, exported::DeferredTensor> deferred;
  std::string checkpoint_dir;
};

struct LoadOptions {
  // See exported::Pt2ReadOptions. No effect on TorchScript files.
  bool defer_checkpoint_tensors = false;
  // The dtype a model built from config.json computes in: "float32" (also
  // when empty), "bfloat16", "float16", or "auto" (config.json's "dtype" or
  // "torch_dtype", float32 when it names none). A program (.pt2, .pt)
  // computes in the dtypes it was saved with: for one, anything but "",
  // "auto" or "float32" is an error.
  std::string dtype;
};

// Loads `path` on the CPU: a TorchScript .pt, a torch.export .pt2, a
// directory holding exactly one .pt2 (a checkpoint directory that
// `tracecut export` wrote into), or a checkpoint directory without one
// whose architecture tracecut builds natively (tracer/native_model.h).
// Errors (all naming the file):
//   NotFoundError            the file does not exist or cannot be opened
//   InvalidArgumentError     the file is empty; is not a zip archive (e.g. a
//                            pickle, or text); is a truncated or corrupt zip;
//                            is a zip but not a TorchScript model (e.g. saved
//                            with torch.save); or an embedded JSON file is
//                            malformed or mistyped
absl::StatusOr<LoadedModel> LoadModel(const std::string& path,
                                      const LoadOptions& options = {});

}  // namespace tracecut::tracer

#endif  // TRACECUT_TRACER_LOAD_H_
