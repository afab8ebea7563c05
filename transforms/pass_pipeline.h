#ifndef TRACECUT_TRANSFORMS_PASS_PIPELINE_H_
#define TRACECUT_TRANSFORMS_PASS_PIPELINE_H_

// A pipeline of passes (Optimum's compose, XLA's HloPassPipeline, MLIR's
// PassManager): runs passes in order with invariant checks, optional IR
// dumps, reproducers of failing passes and per-pass timing, calls its
// instrumentations (instrumentation.h) around every pass, and undoes
// reversible pipelines.
//
//   PassPipeline pipeline("optimize");
//   pipeline.AddPass<ChangeTrueDivToMulByInverse>();
//   pipeline.AddPass<MergeLinears>();
//   ASSIGN_OR_RETURN(runtime::GraphModule out, pipeline.Apply(user_module));
//   ... user_module is untouched; out is the transformed copy ...
//   ASSIGN_OR_RETURN(bool undone, pipeline.Reverse(out));
//   // out's graph and parameters now equal user_module's, bit for bit.
//
// Checks: before the first pass and after every pass that reports a change,
// the pipeline runs its checkers: the IR verifier (ir/verifier.h) and
// CheckModuleReferences (every get_attr / call_module target resolves in the
// module). A failure after a pass reads
//   "failed after <pass>: <what the checker said>"
// (and "invalid input: ..." before the first pass), so a broken pass is named.
// A failing pass's own error is reported as "<pass> failed: <error>".
// The checks, dumps (PassPipelineOptions::dump_after) and reproducers
// (reproducer_dir) are instrumentations the pipeline builds from its options
// at each Run/Reverse; they run before the ones added with
// AddInstrumentation, in that order.
//
// A PassPipeline is itself a ReversibleTransformation, so pipelines nest.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/graph_module.h"
#include "transforms/instrumentation.h"
#include "transforms/transformation.h"

namespace tracecut::transforms {

// What one pass did in the last Run/Reverse.
struct PassRecord {
  std::string name;
  bool changed = false;
  absl::Duration time;
  // The application id the pass ran with (Run only; its marks carry it).
  int64_t app = 0;
  bool preserves_computation = true;
};

struct PassPipelineOptions {
  // Run the checkers at the start and after every pass that changed the
  // module. Turning this off is for benchmarks only.
  bool verify = true;
  // Checkers; empty means {VerifyGraph, CheckModuleReferences}.
  std::vector<ModuleChecker> checkers;

  // Dump the IR after each pass whose name matches this pattern
  // (PassNameMatches: a glob, or a regex after "re:"). Empty: no dumps.
  std::string dump_after;
  // Dump only after passes that changed the module.
  bool dump_only_if_changed = true;
  // Where dumps go; unset means stderr, headed "// IR after <pass>".
  DumpSink dump_sink;

  // When set, a failing pass leaves a reproducer in this directory and its
  // error names the file (Note [Reproducers]).
  std::string reproducer_dir;
};

class PassPipeline : public ReversibleTransformation {
 public:
  explicit PassPipeline(std::string name = "pipeline",
                        PassPipelineOptions options = {});

  absl::string_view name() const override { return name_; }
  // All passes preserve computation.
  bool preserves_computation() const override;
  // All passes are reversible.
  bool is_reversible() const override;
  int application_count() const override;

  // Adds a pass; returns it for further configuration.
  template <typename T, typename... Args>
  T& AddPass(Args&&... args) {
    auto pass = std::make_unique<T>(std::forward<Args>(args)...);
    T& ref = *pass;
    passes_.push_back(std::move(pass));
    return ref;
  }
  Transformation& AddPass(std::unique_ptr<Transformation> pass);

  const std::vector<std::unique_ptr<Transformation>>& passes() const {
    return passes_;
  }

  // Adds an instrumentation the pipeline owns, called around every pass of
  // every later Run and Reverse; returns it.
  template <typename T, typename... Args>
  T& AddInstrumentation(Args&&... args) {
    auto instrumentation = std::make_unique<T>(std::forward<Args>(args)...);
    T& ref = *instrumentation;
    AddInstrumentation(std::move(instrumentation));
    return ref;
  }
  Instrumentation& AddInstrumentation(
      std::unique_ptr<Instrumentation> instrumentation);

  // The added instrumentations (owned or scoped), in call order; the
  // built-in ones from the options are not listed.
  const std::vector<Instrumentation*>& instrumentations() const {
    return instrumentations_;
  }

  // Runs every pass in order on `gm`, in place (the checks and dumps above).
  // Pass i uses application id base + (ids used by passes before it), base
  // being NextApplicationId(gm.graph()) at the start.
  // Returns whether any pass changed it. On error `gm` is left as the
  // failing pass left it; use Apply to keep the input intact.
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;

  // Runs the pipeline on a clone of `gm` and returns the clone; `gm` itself
  // is never modified (Optimum's compose(inplace=False), the default here).
  absl::StatusOr<runtime::GraphModule> Apply(const runtime::GraphModule& gm);

  // Undoes the passes in reverse order (each ReversibleTransformation's
  // Reverse), with the same checks after each pass that changed something.
  // FAILED_PRECONDITION, before changing anything, when a pass is not
  // reversible.
  absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) override;

  const PassPipelineOptions& options() const { return options_; }
  PassPipelineOptions& mutable_options() { return options_; }

  // Per-pass records of the last Run or Reverse, in execution order (up to
  // and including a pass whose checks failed).
  const std::vector<PassRecord>& records() const { return records_; }
  // "merge-linears: changed, 1.2 ms" lines.
  std::string TimingReport() const;

 private:
  friend class ScopedInstrumentation;

  // The built-in instrumentations for this run, then the added ones.
  struct Active {
    std::vector<std::unique_ptr<Instrumentation>> builtin;
    std::vector<Instrumentation*> all;
  };
  Active Instrument() const;
  // Runs `body` (the pass, forward or reverse) between the
  // instrumentations' hooks; the pass's record goes to records_ when it
  // succeeds.
  absl::StatusOr<bool> RunPass(const Active& active, const PassRun& run,
                               runtime::GraphModule& gm,
                               absl::FunctionRef<absl::StatusOr<bool>()> body);

  std::string name_;
  PassPipelineOptions options_;
  std::vector<std::unique_ptr<Transformation>> passes_;
  std::vector<std::unique_ptr<Instrumentation>> owned_instrumentations_;
  std::vector<Instrumentation*> instrumentations_;
  std::vector<PassRecord> records_;
};

// Adds `instrumentation` (not owned; it must outlive the scope) to
// `pipeline` for the scope's lifetime, e.g. to observe one run of a
// pipeline the caller owns:
//
//   PassChangeRecorder recorder;
//   {
//     ScopedInstrumentation scope(pipeline, recorder);
//     RETURN_IF_ERROR(pipeline.Run(gm).status());
//   }
class ScopedInstrumentation {
 public:
  ScopedInstrumentation(PassPipeline& pipeline,
                        Instrumentation& instrumentation);
  ~ScopedInstrumentation();
  ScopedInstrumentation(const ScopedInstrumentation&) = delete;
  ScopedInstrumentation& operator=(const ScopedInstrumentation&) = delete;

 private:
  PassPipeline& pipeline_;
  Instrumentation* instrumentation_;
};

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_PASS_PIPELINE_H_
