// Loading a model for calibration (calibrate.h): the model traced with
// what its config and embedded files say.

#include <caffe2/serialize/inline_container.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pipelines/calibrate.h"
#include "runtime/torch_status.h"
#include "tracer/hf/config.h"
#include "tracer/input_files.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

// The embedded files of a TorchScript archive ("config.json", ...), read
// without loading the model again.
absl::StatusOr<torch::jit::ExtraFilesMap> ReadExtraFiles(
    const std::string& path) {
  return runtime::TorchCall(
      absl::StrCat("reading the extra files of '", path, "'"),
      [&]() -> torch::jit::ExtraFilesMap {
        caffe2::serialize::PyTorchStreamReader reader(path);
        torch::jit::ExtraFilesMap files;
        for (const std::string& record : reader.getAllRecords()) {
          if (!absl::StartsWith(record, "extra/")) continue;
          auto [data, size] = reader.getRecord(record);
          files[record.substr(6)] =
              std::string(static_cast<const char*>(data.get()), size);
        }
        return files;
      });
}

}  // namespace

std::vector<std::string> ModelInputNames(const runtime::GraphModule& model) {
  std::vector<std::string> names;
  for (const ir::Node* p : model.graph().placeholders()) {
    names.push_back(p->target());
  }
  return names;
}

absl::StatusOr<LoadedForCalibration> LoadForCalibration(
    const std::string& model_path, const ExampleInputOptions& example_inputs,
    const tracer::LoadOptions& load) {
  ASSIGN_OR_RETURN(tracer::LoadedModel loaded,
                   tracer::LoadModel(model_path, load));
  tracer::TraceOptions base;
  base.input_specs = example_inputs.input_specs;
  base.config_path = example_inputs.config_path;
  if (!example_inputs.example_inputs_path.empty()) {
    ASSIGN_OR_RETURN(base.example_inputs,
                     tracer::ReadExampleInputs(
                         example_inputs.example_inputs_path, loaded.module));
  }
  ASSIGN_OR_RETURN(tracer::TraceOptions options,
                   tracer::WithModelFiles(loaded, std::move(base)));
  absl::StatusOr<runtime::GraphModule> gm =
      tracer::Trace(loaded.module, options);
  if (!gm.ok()) return tracer::TraceErrorOf(model_path, gm.status());
  LoadedForCalibration out{std::move(*gm)};
  out.file = loaded.path;
  out.native = loaded.native;
  out.native_dtype = loaded.native_dtype;
  out.deferred = std::move(loaded.deferred);
  out.checkpoint_dir = std::move(loaded.checkpoint_dir);
  if (loaded.inputs.has_value()) out.seq_lens = loaded.inputs->seq_lens;
  if (loaded.from_torch_export || loaded.native) {
    // A .pt2 (or a directory holding one or a natively built model): the
    // files LoadModel read or made.
    out.model.mutable_extra_files() = loaded.extra_files;
  } else {
    ASSIGN_OR_RETURN(out.model.mutable_extra_files(),
                     ReadExtraFiles(model_path));
  }
  if (!options.config_path.empty() && options.config.has_value()) {
    out.model.mutable_extra_files()[tracer::kConfigJson] =
        options.config->text();
  }
  if (options.config.has_value()) {
    const tracer::hf::HfConfig& config = *options.config;
    ASSIGN_OR_RETURN(out.vocab_size, config.FindInt("vocab_size"));
    ASSIGN_OR_RETURN(out.max_positions,
                     config.FindInt("max_position_embeddings"));
    tracer::hf::HfDefaults defaults = tracer::hf::DefaultsFor(config);
    out.default_targets = defaults.sequential_targets;
    out.model_type = config.model_type();
  }
  return out;
}

ModelInputs CalibrationInputsOf(const LoadedForCalibration& loaded) {
  ModelInputs out;
  for (const ir::Node* p : loaded.model.graph().placeholders()) {
    ModelInput in;
    in.name = p->target();
    if (p->meta().outputs.size() == 1) {
      in.dtype = p->meta().outputs[0].dtype;
      in.shape = p->meta().outputs[0].shape;
    }
    out.inputs.push_back(std::move(in));
  }
  out.limits.vocab_size = loaded.vocab_size;
  out.limits.max_seq_len = loaded.max_positions;
  out.limits.seq_lens = loaded.seq_lens;
  out.limits.program = loaded.file;
  return out;
}

}  // namespace tracecut::pipelines
