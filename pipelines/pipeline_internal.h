#ifndef TRACECUT_PIPELINES_PIPELINE_INTERNAL_H_
#define TRACECUT_PIPELINES_PIPELINE_INTERNAL_H_

// What the basic (pipeline_basic.cc) and the partitioned (pipeline.cc)
// pipelines share. Not API: pipeline.h is.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "modifiers/modifier.h"
#include "pipelines/calibration_data.h"
#include "pipelines/expert_calibration.h"
#include "pipelines/pipeline.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"

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

// The `basic` pipeline: the whole model, batch after batch.
absl::StatusOr<PipelineResult> RunBasic(
    runtime::GraphModule& model, const CalibrationData& data,
    absl::Span<modifiers::Modifier* const> modifiers,
    modifiers::CalibrationResults& results, const PipelineOptions& options);

}  // namespace tracecut::pipelines::internal

#endif  // TRACECUT_PIPELINES_PIPELINE_INTERNAL_H_
