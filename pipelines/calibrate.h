#ifndef TRACECUT_PIPELINES_CALIBRATE_H_
#define TRACECUT_PIPELINES_CALIBRATE_H_

// The whole calibration flow behind `tracecut calibrate` and `tracecut
// demo`: load and trace a TorchScript model, build the recipe's modifiers,
// make calibration data, run the pipeline (with checkpoints for --resume),
// and write the calibrated model (TorchScript, quantization parameters as
// buffers) and a JSON report, both atomically.
//
//   CalibrateOptions options;
//   options.model_path = "llama.pt";
//   ASSIGN_OR_RETURN(options.recipe, LoadRecipe("w4.textproto"));
//   options.synthetic_samples = 64;
//   options.output_path = "llama-w4.pt";
//   options.report_path = "llama-w4.json";
//   ASSIGN_OR_RETURN(CalibrateOutcome out, Calibrate(options));
//
// Nothing is written before the model, recipe and data have been checked
// (targets that match nothing, token ids out of range, ...). A run that
// fails later removes the run directory it created, so a failed run leaves
// no output behind; a run that is killed keeps its checkpoints there for
// --resume. A successful run removes the run directory unless
// keep_run_dir.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "modifiers/modifier.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"
#include "pipelines/recipe.pb.h"
#include "runtime/collective.h"
#include "runtime/graph_module.h"
#include "tracer/export/pt2_archive.h"
#include "tracer/hf/inputs.h"
#include "tracer/load.h"
#include "util/json.h"
#include "util/progress.h"

namespace tracecut::pipelines {

// The recipe's modifiers, in recipe order; with `collective`, for a
// data-parallel run (distributed.h); `whole_groups` for an output that
// stores rows as whole groups (WeightQuantOptions::whole_groups).
absl::StatusOr<std::vector<std::unique_ptr<modifiers::Modifier>>>
BuildModifiers(const recipe::Recipe& recipe,
               runtime::Collective* collective = nullptr,
               bool whole_groups = false);

// A model ready to calibrate: traced, with its embedded files.
struct LoadedForCalibration {
  runtime::GraphModule model;
  std::optional<int64_t> vocab_size;
  std::optional<int64_t> max_positions;
  // The token lengths the program is valid for (empty: any).
  std::vector<tracer::hf::LengthRange> seq_lens;
  // HF sequential targets for the model type ({"LlamaDecoderLayer"}).
  std::vector<std::string> default_targets;
  std::string model_type;  // "llama"; empty when there is no config.
  // The model file read (for a directory, the .pt2 in it; the directory
  // when the model was built from its config.json: `native`).
  std::string file;
  bool native = false;
  // What a native model computes in (tracer::LoadOptions::dtype).
  c10::ScalarType native_dtype = c10::ScalarType::Float;
  // Tensors left in the checkpoint (load with `defer_checkpoint_tensors`):
  // the model holds stand-ins for them (tracer/export/pt2_archive.h).
  std::map<std::string, tracer::exported::DeferredTensor> deferred;
  std::string checkpoint_dir;
};
// Example inputs for models that do not embed them (the command line's
// --input and --example-inputs; see tools/cli/model_flags.h).
struct ExampleInputOptions {
  std::vector<tracer::hf::InputSpec> input_specs;
  std::string example_inputs_path;  // A torch.save'd or .safetensors file.
  // A Hugging Face config.json used instead of the model's embedded one
  // (for tracing, the vocabulary of --synthetic and the default targets);
  // saved into the output in its place.
  std::string config_path;
};
absl::StatusOr<LoadedForCalibration> LoadForCalibration(
    const std::string& model_path,
    const ExampleInputOptions& example_inputs = {},
    const tracer::LoadOptions& load = {});

// The traced model's inputs with their example shapes and dtypes, and the
// token limits of its config: what calibration data is checked against.
ModelInputs CalibrationInputsOf(const LoadedForCalibration& loaded);

// Model inputs are the graph's placeholders (by target).
std::vector<std::string> ModelInputNames(const runtime::GraphModule& model);

struct CalibrateOptions {
  std::string model_path;
  recipe::Recipe recipe;
  // Modifiers of the caller's own (not owned), run after the recipe's. With
  // any, the recipe may have no modifiers of its own.
  std::vector<modifiers::Modifier*> extra_modifiers;
  std::string recipe_source = "<recipe>";  // For the report.

  // How the model is traced when it embeds no example inputs.
  ExampleInputOptions example_inputs;
  // What a model built from config.json computes in (tracer::LoadOptions).
  std::string dtype;

  // Exactly one of: a data file (LoadCalibrationData) or synthetic tokens.
  std::string data_path;
  int64_t synthetic_samples = 0;
  int64_t synthetic_seq_len = 16;
  uint64_t seed = 0;
  int64_t batch_size = 1;

  // Override the recipe.
  std::optional<PipelineKind> pipeline;
  std::optional<bool> propagate_error;
  std::vector<std::string> sequential_targets;
  std::optional<bool> calibrate_all_experts;

  std::string output_path;  // The calibrated .pt or directory (required).
  // kTorchScript: a fake-quantized .pt with the parameters as buffers;
  // kCompressedTensors: a checkpoint directory (compressed_output.h).
  enum class OutputFormat { kTorchScript, kCompressedTensors };
  OutputFormat output_format = OutputFormat::kTorchScript;
  // With a checkpoint directory whose .pt2 holds no weights (`tracecut
  // export --meta`), compressed-tensors output and a sequential pipeline:
  // read each subgraph's weights from the safetensors when it runs and
  // write and release them when it is done, so memory is one subgraph's
  // weights (weight_stream.h). Otherwise, or when false, the whole model is
  // loaded first.
  bool stream_weights = true;
  std::string report_path;  // Empty: no report file.
  // Checkpoints; default "<output_path>.run".
  std::string run_dir;
  bool resume = false;
  int stop_after_subgraph = -1;  // See PipelineOptions.
  bool keep_run_dir = false;
  // Include the "run" section (timings, cache statistics) in the report;
  // without it the report is byte-identical across identical runs.
  bool report_run_section = true;
  // PipelineOptions::measure_baselines: the report's round-to-nearest
  // errors beside GPTQ's.
  bool measure_baselines = true;

  util::Progress* progress = nullptr;

  // Where subgraphs compute (runtime::ResolveDevice; Note [Devices] in
  // pipeline.cc). Data-parallel runs compute on the CPU only.
  c10::Device device = c10::Device(c10::kCPU);

  // Data-parallel calibration (not owned; docs/distributed.md): this rank
  // calibrates its shard of the data (ShardCalibrationData), the modifiers
  // combine statistics over all ranks, and only rank 0 writes the output
  // and the report (and, streaming, the shards). Each rank checkpoints into
  // <run_dir>/rank-R-of-N; resume needs the same world size.
  runtime::Collective* collective = nullptr;
};

struct CalibrateOutcome {
  bool stopped = false;  // stop_after_subgraph reached; nothing written.
  PipelineResult pipeline;
  modifiers::CalibrationResults results;
  std::vector<std::string> targets;  // Sequential targets used.
  int64_t num_batches = 0;
  util::Json report;
  // The calibrated model (buffers added), kept for callers that evaluate it;
  // empty when the weights were streamed (the model holds none at the end).
  std::optional<runtime::GraphModule> model;
  // Streamed runs: the most bytes of checkpoint weights held at once.
  std::optional<int64_t> streamed_peak_weight_bytes;
};

absl::StatusOr<CalibrateOutcome> Calibrate(const CalibrateOptions& options);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_CALIBRATE_H_
