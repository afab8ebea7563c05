#ifndef TRACECUT_TRANSFORMS_PIPELINE_H_
#define TRACECUT_TRANSFORMS_PIPELINE_H_

// A pipeline of passes (Optimum's compose, XLA's HloPassPipeline, MLIR's
// PassManager): runs passes in order with invariant checks, optional IR
// dumps and per-pass timing, and undoes reversible pipelines.
//
//   Pipeline pipeline("optimize");
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
//
// A Pipeline is itself a ReversibleTransformation, so pipelines nest.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/graph_module.h"
#include "transforms/transformation.h"

namespace tracecut::transforms {

// An invariant check run on the whole GraphModule.
using ModuleChecker =
    std::function<absl::Status(const runtime::GraphModule& gm)>;

// The IR verifier as a ModuleChecker.
absl::Status VerifyGraph(const runtime::GraphModule& gm);

// Every get_attr target names a tensor (or other attribute) of the module
// and every call_module target a submodule with a forward method; the error
// names the node.
absl::Status CheckModuleReferences(const runtime::GraphModule& gm);

// Receives an IR dump: the pass it follows and the graph's text form.
using DumpSink =
    std::function<void(absl::string_view pass, absl::string_view ir_text)>;

// What one pass did in the last Run/Reverse.
struct PassRecord {
  std::string name;
  bool changed = false;
  absl::Duration time;
  // The application id the pass ran with (Run only; its marks carry it).
  int64_t app = 0;
  bool preserves_computation = true;
};

// Called after each pass of a Run (after the checks), with what it did and
// the module as it left it. An error stops the pipeline and is returned.
using PassObserver = std::function<absl::Status(
    const PassRecord& record, const runtime::GraphModule& gm)>;

struct PipelineOptions {
  // Run the checkers at the start and after every pass that changed the
  // module. Turning this off is for benchmarks only.
  bool verify = true;
  // Checkers; empty means {VerifyGraph, CheckModuleReferences}.
  std::vector<ModuleChecker> checkers;

  // Dump the IR after each pass whose name matches this pattern: a glob
  // ("fuse-*", "*", '?' for one character) or, with a "re:" prefix, an
  // ECMAScript regex matched against the whole name. Empty: no dumps.
  std::string dump_after;
  // Dump only after passes that changed the module.
  bool dump_only_if_changed = true;
  // Where dumps go; unset means stderr, headed "// IR after <pass>".
  DumpSink dump_sink;

  // Observes every pass of Run (the layer-by-layer debugger uses it).
  PassObserver after_pass;
};

class Pipeline : public ReversibleTransformation {
 public:
  explicit Pipeline(std::string name = "pipeline",
                    PipelineOptions options = {});

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

  const PipelineOptions& options() const { return options_; }
  PipelineOptions& mutable_options() { return options_; }

  // Per-pass records of the last Run or Reverse, in execution order.
  const std::vector<PassRecord>& records() const { return records_; }
  // "merge-linears: changed, 1.2 ms" lines.
  std::string TimingReport() const;

 private:
  absl::Status Check(const runtime::GraphModule& gm,
                     absl::string_view after) const;
  void MaybeDump(const runtime::GraphModule& gm, absl::string_view pass,
                 bool changed) const;

  std::string name_;
  PipelineOptions options_;
  std::vector<std::unique_ptr<Transformation>> passes_;
  std::vector<PassRecord> records_;
};

// Whether `name` matches a dump pattern (PipelineOptions::dump_after).
bool PassNameMatches(absl::string_view pattern, absl::string_view name);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_PIPELINE_H_
