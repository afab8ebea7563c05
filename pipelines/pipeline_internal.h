#ifndef TRACECUT_PIPELINES_PIPELINE_INTERNAL_H_
#define TRACECUT_PIPELINES_PIPELINE_INTERNAL_H_

// What the basic (pipeline_basic.cc) and the partitioned (pipeline.cc, its
// subgraphs in pipeline_subgraph.cc) pipelines share. Not API: pipeline.h is.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "modifiers/modifier.h"
#include "partition/subgraph.h"
#include "pipelines/calibration_data.h"
#include "pipelines/expert_calibration.h"
#include "pipelines/intermediates_cache.h"
#include "pipelines/pipeline.h"
#include "pipelines/pipeline_checkpoint.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "util/progress.h"

namespace tracecut::pipelines::internal {

// Finds a NaN or infinite entry in a floating tensor inside `v`.
// Returns "NaN" / "infinite" / "" (all finite).
std::string NonFiniteKind(const c10::IValue& v);

absl::Status ForEachModifier(
    absl::Span<modifiers::Modifier* const> modifiers,
    const std::function<absl::Status(modifiers::Modifier*)>& fn);

// The tensors of `results`' module records (quantization parameters) on
// the host, where the writers and checkpoints read them (Note [Devices] in
// pipeline.cc).
absl::Status RecordsToHost(modifiers::CalibrationResults& results);

// Dispatches module-hook calls to the modifiers that want them.
class HookDispatcher {
 public:
  HookDispatcher(modifiers::RunContext& ctx,
                 absl::Span<modifiers::Modifier* const> modifiers);

  // With `routed`, calls of modules inside its experts are not passed on:
  // the experts' calibration data comes from their runs on all tokens.
  // Returns the hooks added to `interp` (module calls, and function calls
  // when a modifier wants any).
  std::vector<runtime::Interpreter::HookId> Attach(
      runtime::Interpreter& interp, int subgraph,
      const AllExpertsRunner* routed = nullptr);

  void set_batch(int64_t batch) { batch_ = batch; }
  const absl::Status& status() const { return status_; }

 private:
  struct Route {
    const modifiers::LeafModule* leaf = nullptr;
    std::vector<modifiers::Modifier*> modifiers;
  };
  modifiers::RunContext& ctx_;
  std::vector<modifiers::Modifier*>
      function_modifiers_;  // WantsFunction on some node.
  absl::flat_hash_map<std::string, Route> routes_;
  int64_t batch_ = 0;
  absl::Status status_;
};

// One step of a partitioned run: a subgraph, its interpreter and what to
// keep of its results.
struct Step {
  const partition::Subgraph* subgraph = nullptr;
  std::unique_ptr<runtime::Interpreter> interp;
  std::string label;
  modifiers::SubgraphInfo info;
  // Output positions (in subgraph->output_names) that later subgraphs read.
  std::vector<size_t> keep_outputs;
  // Names released from the cache once this subgraph is done.
  std::vector<std::string> release;
};

class PartitionedRun {
 public:
  PartitionedRun(runtime::GraphModule& model, const CalibrationData& data,
                 absl::Span<modifiers::Modifier* const> modifiers,
                 modifiers::CalibrationResults& results,
                 const PipelineOptions& options)
      : model_(model),
        data_(data),
        modifiers_(modifiers),
        results_(results),
        options_(options),
        progress_(options.progress != nullptr ? options.progress : &silent_) {}

  absl::StatusOr<PipelineResult> Run();

 private:
  absl::Status Plan();
  absl::Status PlanLayerChain();
  std::string RunIdentity() const;
  // `transform_hooks`: non-null when transforms get a pass of their own
  // (Note [Transforms first]); `hooks` then routes to the other modifiers.
  absl::Status RunStep(int i, modifiers::RunContext& ctx, HookDispatcher& hooks,
                       HookDispatcher* transform_hooks);
  // With `experts`, they run on all tokens after each batch.
  // RunContext::ReplaySubgraph for subgraph `i`.
  absl::Status Replay(int i, modifiers::RunContext& ctx,
                      const modifiers::RunContext::CallVisitor& visit);
  absl::Status RunBatches(int i, const char* stage, bool store,
                          HookDispatcher* hooks, AllExpertsRunner* experts);
  // Returns the subgraph to start at (0 without a checkpoint).
  absl::StatusOr<int> Restore(modifiers::RunContext& ctx);
  absl::Status PutTracked(int64_t batch, const std::string& name,
                          const c10::IValue& value);
  // The cache's value, on the run's device.
  absl::StatusOr<c10::IValue> GetInput(int64_t batch, const std::string& name);
  util::ProgressPoint Point(int i, const char* stage, int64_t batch,
                            int64_t batches) const;

  runtime::GraphModule& model_;
  const CalibrationData& data_;
  absl::Span<modifiers::Modifier* const> modifiers_;
  // With a transform pass: the transforms and the other modifiers.
  std::vector<modifiers::Modifier*> transforms_;
  std::vector<modifiers::Modifier*> others_;
  modifiers::CalibrationResults& results_;
  const PipelineOptions& options_;
  util::Progress silent_ = util::Progress::Silent();
  util::Progress* progress_;

  partition::Partition partition_;
  std::vector<Step> steps_;
  std::vector<std::string> model_inputs_used_;  // Cache keys of model inputs.
  std::vector<size_t> model_input_index_;       // Into data_.input_names.
  std::optional<IntermediatesCache> cache_;
  std::optional<RunCheckpoint> checkpoint_;  // With a run directory.
  PipelineResult result_;
};

// The `basic` pipeline: the whole model, batch after batch.
absl::StatusOr<PipelineResult> RunBasic(
    runtime::GraphModule& model, const CalibrationData& data,
    absl::Span<modifiers::Modifier* const> modifiers,
    modifiers::CalibrationResults& results, const PipelineOptions& options);

}  // namespace tracecut::pipelines::internal

#endif  // TRACECUT_PIPELINES_PIPELINE_INTERNAL_H_
