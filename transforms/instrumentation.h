#ifndef TRACECUT_TRANSFORMS_INSTRUMENTATION_H_
#define TRACECUT_TRANSFORMS_INSTRUMENTATION_H_

// Pass instrumentation (MLIR's PassInstrumentation): observers a PassPipeline
// calls around every pass it runs. The pipeline's own checks and dumps are
// instrumentations too (VerifierInstrumentation, IrDumpInstrumentation), and
// so are the per-pass observers of the per-subgraph runner, the
// layer-by-layer debugger and the `tracecut transform` / `debug` commands.
//
//   PassPipeline pipeline;
//   pipeline.AddPass<MergeLinears>();
//   pipeline.AddInstrumentation(
//       std::make_unique<ReproducerInstrumentation>("/tmp/repro"));
//   absl::StatusOr<bool> changed = pipeline.Run(gm);
//   // On a failing pass: "merge-linears failed: ... [reproducer:
//   // /tmp/repro/merge-linears.ir]"; the file holds the pass's input IR.
//
// For each pass the pipeline calls, in the order the instrumentations were
// added: RunBeforePass on all; then the pass; then RunAfterPass on all (the
// first error stops the rest). When the pass or an after-pass hook fails,
// every instrumentation's RunAfterPassFailed sees the error in turn and
// returns the error to report, with context added where it has some.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"
#include "transforms/transformation.h"

namespace tracecut::transforms {

// One pass as the pipeline runs it.
struct PassRun {
  const Transformation* pass = nullptr;
  // What the pipeline reports: pass->name(), or "<name> (reverse)" when it
  // undoes the pass.
  std::string name;
  // The application id the pass runs with (Run only; 0 when reversing).
  int64_t app = 0;
  bool reverse = false;
};

class Instrumentation {
 public:
  virtual ~Instrumentation() = default;

  // Before the first pass, on the pipeline's input. An error stops the
  // pipeline before any pass runs.
  virtual absl::Status RunBeforePipeline(const runtime::GraphModule& gm) {
    return absl::OkStatus();
  }
  // Just before `pass` runs on `gm`. An error stops the pipeline.
  virtual absl::Status RunBeforePass(const PassRun& pass,
                                     const runtime::GraphModule& gm) {
    return absl::OkStatus();
  }
  // After `pass` succeeded; `changed` is what it returned. An error fails
  // the pass (RunAfterPassFailed follows).
  virtual absl::Status RunAfterPass(const PassRun& pass,
                                    const runtime::GraphModule& gm,
                                    bool changed) {
    return absl::OkStatus();
  }
  // After `pass` or an after-pass hook failed with `error`; `gm` is as the
  // pass left it. Returns the error to report (never OK): `error` itself or
  // `error` with context added.
  virtual absl::Status RunAfterPassFailed(const PassRun& pass,
                                          const runtime::GraphModule& gm,
                                          absl::Status error) {
    return error;
  }
};

// An invariant check run on the whole GraphModule.
using ModuleChecker =
    std::function<absl::Status(const runtime::GraphModule& gm)>;

// The IR verifier as a ModuleChecker.
absl::Status VerifyGraph(const runtime::GraphModule& gm);

// Every get_attr target names a tensor (or other attribute) of the module
// and every call_module target a submodule with a forward method; the error
// names the node.
absl::Status CheckModuleReferences(const runtime::GraphModule& gm);

// Runs `checkers` on the pipeline's input ("invalid input: <error>") and
// after every pass that reports a change ("failed after <pass>: <error>"),
// keeping the error's code and payloads. A pass that claims to have changed
// nothing is not checked.
class VerifierInstrumentation : public Instrumentation {
 public:
  // Empty `checkers`: {VerifyGraph, CheckModuleReferences}.
  explicit VerifierInstrumentation(std::vector<ModuleChecker> checkers = {});

  absl::Status RunBeforePipeline(const runtime::GraphModule& gm) override;
  absl::Status RunAfterPass(const PassRun& pass, const runtime::GraphModule& gm,
                            bool changed) override;

 private:
  absl::Status Check(const runtime::GraphModule& gm,
                     absl::string_view prefix) const;

  std::vector<ModuleChecker> checkers_;
};

// Whether `name` matches a pass-name pattern: a glob ("fuse-*", "*", '?'
// for one character) or, with a "re:" prefix, an ECMAScript regex matched
// against the whole name. An empty or malformed pattern matches nothing.
bool PassNameMatches(absl::string_view pattern, absl::string_view name);

// Receives an IR dump: the pass it follows and the graph's text form.
using DumpSink =
    std::function<void(absl::string_view pass, absl::string_view ir_text)>;

// Dumps the IR (ir/text.h) after each pass whose name matches `pattern`
// (PassNameMatches), by default only after passes that changed the module.
// An unset sink writes to stderr, headed "// IR after <pass>".
class IrDumpInstrumentation : public Instrumentation {
 public:
  IrDumpInstrumentation(std::string pattern, bool only_if_changed = true,
                        DumpSink sink = nullptr);

  absl::Status RunAfterPass(const PassRun& pass, const runtime::GraphModule& gm,
                            bool changed) override;

 private:
  std::string pattern_;
  bool only_if_changed_;
  DumpSink sink_;
};

// Names of the nodes carrying `pass`'s mark from application `app`, in
// graph order: what one application of a pass touched.
std::vector<std::string> TouchedNodes(const ir::Graph& graph,
                                      absl::string_view pass, int64_t app);

// What each pass run did: whether it changed the module and the nodes it
// touched (TouchedNodes right after it ran: a later pass may replace them).
// The per-pass report of `tracecut transform` and of RunPerSubgraph.
class PassChangeRecorder : public Instrumentation {
 public:
  struct Entry {
    std::string pass;
    bool changed = false;
    std::vector<std::string> touched_nodes;
  };

  absl::Status RunAfterPass(const PassRun& pass, const runtime::GraphModule& gm,
                            bool changed) override;

  const std::vector<Entry>& entries() const { return entries_; }
  void Clear() { entries_.clear(); }

 private:
  std::vector<Entry> entries_;
};

// Calls `fn` after every pass; its error fails the pass.
class AfterPassCallback : public Instrumentation {
 public:
  using Fn = std::function<absl::Status(
      const PassRun& pass, const runtime::GraphModule& gm, bool changed)>;
  explicit AfterPassCallback(Fn fn) : fn_(std::move(fn)) {}

  absl::Status RunAfterPass(const PassRun& pass, const runtime::GraphModule& gm,
                            bool changed) override {
    return fn_(pass, gm, changed);
  }

 private:
  Fn fn_;
};

// Note [Reproducers]
// When a pass fails (its own error, or a check after it), the
// ReproducerInstrumentation writes the IR the pass was given to
// "<dir>/<pass>.ir" ("<pass>.2.ir", ... when that exists) and appends
// " [reproducer: <path>]" to the error. The file is the graph's text form
// (ir/text.h) headed by '#' comments naming the pass, the direction and the
// error, so ir::ParseGraph reads it as it is and ReadReproducer also
// returns the pass; rerunning that pass on the graph, paired with the same
// model's module (parameters are not in the file), fails again. Taking the
// input means copying the graph before every pass (not its tensors), so
// the instrumentation is opt-in (`--reproducer-dir`).
class ReproducerInstrumentation : public Instrumentation {
 public:
  // `dir` is created when the first reproducer is written.
  explicit ReproducerInstrumentation(std::string dir);

  absl::Status RunBeforePass(const PassRun& pass,
                             const runtime::GraphModule& gm) override;
  absl::Status RunAfterPassFailed(const PassRun& pass,
                                  const runtime::GraphModule& gm,
                                  absl::Status error) override;

  // Reproducers written so far.
  const std::vector<std::string>& written() const { return written_; }

 private:
  std::string dir_;
  std::unique_ptr<ir::Graph> input_;
  std::vector<std::string> written_;
};

// A reproducer file read back (the graph unverified: it is whatever the
// failing pass was given).
struct Reproducer {
  // The pass's name (without " (reverse)").
  std::string pass;
  bool reverse = false;
  std::unique_ptr<ir::Graph> graph;
};

absl::StatusOr<Reproducer> ParseReproducer(absl::string_view text);
absl::StatusOr<Reproducer> ReadReproducer(const std::string& path);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_INSTRUMENTATION_H_
