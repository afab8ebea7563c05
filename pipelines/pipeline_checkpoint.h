#ifndef TRACECUT_PIPELINES_PIPELINE_CHECKPOINT_H_
#define TRACECUT_PIPELINES_PIPELINE_CHECKPOINT_H_

// The checkpoints a partitioned calibration run keeps in its run directory
// so that `resume` continues after the last finished subgraph (Note
// [Checkpoints] in pipeline_checkpoint.cc has the format).
//
//   RunCheckpoint checkpoint(options.run_dir, identity);
//   ASSIGN_OR_RETURN(std::optional<int> next,
//                    checkpoint.Restore(ctx, modifiers, n, put));
//   RETURN_IF_ERROR(checkpoint.CreateDir());
//   for (int i = next.value_or(0); i < n; ++i) {
//     ...  // Run subgraph i.
//     RETURN_IF_ERROR(checkpoint.Write(i + 1, ctx, modifiers, cache));
//   }

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "modifiers/modifier.h"
#include "pipelines/intermediates_cache.h"

namespace tracecut::pipelines {

class RunCheckpoint {
 public:
  // Receives each cached value of a restored checkpoint.
  using PutFn = std::function<absl::Status(
      int64_t batch, const std::string& name, const c10::IValue& value)>;

  // `identity` says what made the run (pipeline, subgraphs, data,
  // modifiers, the caller's fingerprint); Restore refuses a checkpoint made
  // with another. `keep_previous` (a rank of a data-parallel run): the
  // state is written as state.pt.NNNNN (NNNNN: the next subgraph) and the
  // one before it is kept, so that ranks whose last checkpoints are one
  // subgraph apart can all resume from the earlier one.
  RunCheckpoint(std::string dir, std::string identity,
                bool keep_previous = false);

  const std::string& dir() const { return dir_; }

  // Creates the run directory (and missing parents).
  absl::Status CreateDir() const;

  // Checkpoints the run before subgraph `next`: the tensors changed since
  // the last call (ctx.TakeUpdatedTensors) go to a new weight file for
  // subgraph next - 1, then state.pt is replaced. Both writes are atomic.
  absl::Status Write(int next, modifiers::RunContext& ctx,
                     absl::Span<modifiers::Modifier* const> modifiers,
                     IntermediatesCache& cache);

  // With keep_previous: the subgraphs the kept states continue at,
  // ascending (empty: none), from their file names.
  std::vector<int> Kept() const;
  // With keep_previous: removes the kept states that continue after
  // subgraph `start` (left by an earlier run that got further), so Kept()
  // only ever names states of this run.
  absl::Status DiscardAfter(int start) const;

  // Loads the checkpoint in the run directory: its weights into ctx's model,
  // its results into ctx.results(), each modifier's state, and every cached
  // value through `put`. Returns the subgraph to continue at, or nullopt when
  // the directory holds no checkpoint. DataLoss for a damaged checkpoint,
  // FailedPrecondition for one of another version or another run. With
  // keep_previous, `at` picks the kept state that continues at subgraph
  // `at` (one of Kept()); without, the state is state.pt.
  absl::StatusOr<std::optional<int>> Restore(
      modifiers::RunContext& ctx,
      absl::Span<modifiers::Modifier* const> modifiers, int num_subgraphs,
      const PutFn& put, std::optional<int> at = std::nullopt);

 private:
  std::string StatePath(int next) const;

  std::string dir_;
  std::string identity_;
  bool keep_previous_;
  std::vector<std::string> weight_files_;  // Relative to dir_, in order.
};

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_PIPELINE_CHECKPOINT_H_
