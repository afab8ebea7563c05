#ifndef TRACECUT_PIPELINES_PIPELINE_H_
#define TRACECUT_PIPELINES_PIPELINE_H_

// Calibration pipelines: how calibration batches flow through a traced model
// while modifiers (modifier.h) watch and compress it (llm-compressor's
// basic, layer_sequential and sequential pipelines, natively).
//
//   PipelineOptions options;
//   options.kind = PipelineKind::kSequential;
//   options.partition.targets = {"LlamaDecoderLayer"};
//   options.run_dir = "out.pt.run";  // checkpoints, for --resume
//   GptqModifier gptq(gptq_options);
//   CalibrationResults results;
//   ASSIGN_OR_RETURN(PipelineResult r,
//                    RunPipeline(gm, data, {&gptq}, results, options));
//   RETURN_IF_ERROR(ExportQuantParams(results, gm));
//
// basic: the whole graph, batch after batch, hooks on; one compression step
// at the end. Needs the activations of the whole model for one batch.
//
// sequential: the graph is partitioned at the sequential targets
// (partition/partitioner.h). The model inputs of every batch go into an
// IntermediatesCache; then for each subgraph:
//   1. calibration pass: every batch, inputs from the cache, hooks on;
//      outputs go into the cache;
//   2. compression: the modifiers' OnSubgraphEnd;
//   3. propagation pass (propagate_error, the default), only when step 2
//      changed a weight: every batch again with the compressed weights, no
//      hooks; its outputs replace those of step 1, so later subgraphs see
//      the error of the compression so far (without propagate_error they
//      see the uncompressed activations);
//   4. values no later subgraph reads are released; a checkpoint is
//      written when a run directory is set.
// The cache holds, between subgraphs, only values later subgraphs read;
// during one it holds in addition that subgraph's outputs. With a memory
// budget, what does not fit is spilled to disk (intermediates_cache.h).
//
// layer_sequential: like sequential, for models that are a plain chain of
// target layers: the subgraphs before the first target (the head) produce
// the first target's inputs; each later target reads only the previous
// one's outputs and those captured inputs (attention mask, rotary
// embeddings). A model that is not such a chain is an error naming the
// value that breaks it (use sequential there).
//
// Checkpoints (Note [Checkpoints] in pipeline_checkpoint.cc): after each
// subgraph the run directory gets the weights changed in that subgraph
// (weights-NNNNN.pt) and, atomically replaced, state.pt: the cache's values
// (everything later subgraphs need), the results so far and the modifiers'
// state. `resume` continues after the last finished subgraph and gives the
// same bytes as an uninterrupted run. A checkpoint from a different model,
// recipe, data or options is refused.
//
// Every LibTorch error is returned as a Status naming the subgraph, batch
// and node; NaN or infinite activations are errors naming the subgraph and
// value. Autograd is off for the whole run.

#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "modifiers/modifier.h"
#include "partition/partitioner.h"
#include "pipelines/calibration_data.h"
#include "pipelines/expert_calibration.h"
#include "pipelines/intermediates_cache.h"
#include "runtime/graph_module.h"
#include "util/files.h"
#include "util/progress.h"

namespace tracecut::pipelines {

enum class PipelineKind { kBasic, kLayerSequential, kSequential };

// "basic", "layer_sequential", "sequential".
absl::string_view PipelineKindName(PipelineKind kind);
absl::StatusOr<PipelineKind> ParsePipelineKind(absl::string_view name);

// Where a subgraph's weights come from and where its results go, for a run
// that holds one subgraph's weights at a time (weight_stream.h). The
// sequential pipelines call it around every subgraph; `basic` refuses it.
class SubgraphWeights {
 public:
  virtual ~SubgraphWeights() = default;
  // The run's subgraphs, in order, before anything runs.
  virtual absl::Status Plan(
      const std::vector<const partition::Subgraph*>& subgraphs) = 0;
  // After a checkpoint was restored: the run continues at subgraph `start`.
  virtual absl::Status Resume(int start) = 0;
  // Before subgraph `i` runs (before the modifiers' OnSubgraphStart).
  virtual absl::Status Load(int i) = 0;
  // After subgraph `i` was compressed and propagated, before its checkpoint.
  virtual absl::Status Done(int i,
                            const modifiers::CalibrationResults& results) = 0;
  // Before the modifiers' OnRunEnd: what no subgraph read.
  virtual absl::Status LoadRest() = 0;
};

// The processes of a data-parallel run, as the pipeline sees them around
// checkpoints (calibrate.cc implements it over a Collective). With one, each
// process keeps its last two checkpoints (RunCheckpoint's keep_previous) and
// all resume from one subgraph.
class CheckpointGroup {
 public:
  virtual ~CheckpointGroup() = default;
  // `kept`: the subgraphs this process's checkpoints continue at
  // (ascending; empty: none). Returns the subgraph every process continues
  // at (0: start afresh), the same on all; an error on all when one of them
  // lacks that checkpoint.
  virtual absl::StatusOr<int> AgreeOnResume(const std::vector<int>& kept) = 0;
  // Before the checkpoint after subgraph `i`: returns once every process
  // has finished subgraph i, so no process's newest checkpoint is more than
  // one subgraph ahead of another's.
  virtual absl::Status BeforeCheckpoint(int i) = 0;
};

struct PipelineOptions {
  PipelineKind kind = PipelineKind::kSequential;
  // Sequential targets (e.g. {"LlamaDecoderLayer"}) and modules never split
  // at; unused by `basic`.
  partition::PartitionOptions partition;
  // Feed later subgraphs the outputs of the compressed ones.
  bool propagate_error = true;
  IntermediatesCacheOptions cache;
  // Directory for checkpoints (created if missing); empty: none.
  std::string run_dir;
  // Continue from the checkpoint in run_dir (starts afresh when there is
  // none).
  bool resume = false;
  // Stop (PipelineResult::stopped) after checkpointing this subgraph; -1:
  // run to the end. For tests of resume: a run killed at that point.
  int stop_after_subgraph = -1;
  // Identity of what the caller runs (model file, recipe, data, options):
  // stored in checkpoints and required to match on resume.
  std::string fingerprint;
  // Checks every subgraph's (or the model's) outputs for NaN / Inf.
  bool check_finite = true;
  // Calibrate every MoE expert (modules matching expert_pattern) on all the
  // tokens of its block instead of the routed ones; the model's outputs are
  // unchanged (expert_calibration.h). llm-compressor's default.
  bool calibrate_all_experts = true;
  // Whether calibrate_all_experts was asked for: a model with no expert, or
  // with one that cannot run on all tokens, is then an error; otherwise the
  // run falls back to the routed tokens (a warning for the latter).
  bool all_experts_required = false;
  std::string expert_pattern = kDefaultExpertPattern;
  // Where subgraphs compute (Note [Devices] in pipeline.cc): their
  // weights, inputs, hooks' statistics and the modifiers' work live there
  // while they run; the model, the cache and the results stay on the host.
  c10::Device device = c10::Device(c10::kCPU);
  // Not owned; nullptr: the model holds all its weights.
  SubgraphWeights* weights = nullptr;
  // Not owned; nullptr: this process checkpoints on its own.
  CheckpointGroup* checkpoint_group = nullptr;
  util::Progress* progress = nullptr;  // nullptr: silent.
  // RunContext::measure_baselines.
  bool measure_baselines = true;
};

// What the cache held after one subgraph.
struct SubgraphCacheStats {
  int index = 0;
  std::string label;
  int64_t values = 0;      // Values in the cache (all batches).
  int64_t bytes_held = 0;  // In memory.
  int64_t bytes_on_disk = 0;
  bool propagated = false;  // A propagation pass ran.
  // The subgraph's nodes (partition::Subgraph::node_count) and the bytes
  // of the parameters it reads, measured once they are loaded.
  int64_t nodes = 0;
  int64_t param_bytes = 0;
  // With streamed weights (PipelineOptions::weights): reading the
  // subgraph's weights, and handing them to the writer after it.
  double load_seconds = 0;
  double write_seconds = 0;
  // The process's resident memory after the subgraph (0: unknown).
  int64_t rss_bytes = 0;
  // On a GPU: the most device memory LibTorch held so far (0: CPU).
  int64_t device_peak_bytes = 0;
};

struct PipelineResult {
  int num_subgraphs = 0;
  int first_subgraph = 0;  // > 0 when resumed.
  bool resumed = false;
  bool stopped = false;  // stop_after_subgraph was reached.
  // Subgraphs run by this call.
  std::vector<SubgraphCacheStats> subgraphs;
  // The cache at the end (empty for `basic`).
  IntermediatesCacheStats cache;
  // Most values (all batches) the cache held at once.
  int64_t peak_cache_values = 0;
  // Labels of the subgraphs, in order ("(head)", "model.layers.0", ...).
  std::vector<std::string> labels;
};

// Runs `modifiers` (in order, per callback) over `model` with `data`.
// Results accumulate in `results` (which a resumed run overwrites with the
// checkpoint's). The model's weights change in place.
absl::StatusOr<PipelineResult> RunPipeline(
    runtime::GraphModule& model, const CalibrationData& data,
    absl::Span<modifiers::Modifier* const> modifiers,
    modifiers::CalibrationResults& results, const PipelineOptions& options);

// How far `candidate`'s first output tensor is from `reference`'s over all
// batches of `data`: ||c - r|| / ||r|| (Frobenius, over everything) and the
// largest absolute difference. Runs the TorchScript `forward` of both.
struct OutputError {
  double relative = 0;
  double max_abs = 0;
  int64_t batches = 0;
};
absl::StatusOr<OutputError> CompareOutputs(const torch::jit::Module& reference,
                                           const torch::jit::Module& candidate,
                                           const CalibrationData& data);

// util::WriteFileAtomically, under the name code built against this header
// has used (examples/consumer). New code calls util's.
using util::WriteFileAtomically;

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_PIPELINE_H_
