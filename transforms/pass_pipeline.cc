#include "transforms/pass_pipeline.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::transforms {

PassPipeline::PassPipeline(std::string name, PassPipelineOptions options)
    : name_(std::move(name)), options_(std::move(options)) {
  if (options_.checkers.empty()) {
    options_.checkers = {VerifyGraph, CheckModuleReferences};
  }
}

ScopedInstrumentation::ScopedInstrumentation(PassPipeline& pipeline,
                                             Instrumentation& instrumentation)
    : pipeline_(pipeline), instrumentation_(&instrumentation) {
  pipeline_.instrumentations_.push_back(instrumentation_);
}

ScopedInstrumentation::~ScopedInstrumentation() {
  auto& list = pipeline_.instrumentations_;
  list.erase(std::find(list.begin(), list.end(), instrumentation_));
}

bool PassPipeline::preserves_computation() const {
  for (const auto& p : passes_) {
    if (!p->preserves_computation()) return false;
  }
  return true;
}

bool PassPipeline::is_reversible() const {
  for (const auto& p : passes_) {
    if (!p->is_reversible()) return false;
  }
  return true;
}

int PassPipeline::application_count() const {
  int n = 0;
  for (const auto& p : passes_) n += p->application_count();
  return n;
}

Transformation& PassPipeline::AddPass(std::unique_ptr<Transformation> pass) {
  passes_.push_back(std::move(pass));
  return *passes_.back();
}

Instrumentation& PassPipeline::AddInstrumentation(
    std::unique_ptr<Instrumentation> instrumentation) {
  instrumentations_.push_back(instrumentation.get());
  owned_instrumentations_.push_back(std::move(instrumentation));
  return *owned_instrumentations_.back();
}

PassPipeline::Active PassPipeline::Instrument() const {
  Active active;
  if (options_.verify) {
    active.builtin.push_back(
        std::make_unique<VerifierInstrumentation>(options_.checkers));
  }
  if (!options_.dump_after.empty()) {
    active.builtin.push_back(std::make_unique<IrDumpInstrumentation>(
        options_.dump_after, options_.dump_only_if_changed,
        options_.dump_sink));
  }
  if (!options_.reproducer_dir.empty()) {
    active.builtin.push_back(
        std::make_unique<ReproducerInstrumentation>(options_.reproducer_dir));
  }
  for (const auto& i : active.builtin) active.all.push_back(i.get());
  active.all.insert(active.all.end(), instrumentations_.begin(),
                    instrumentations_.end());
  return active;
}

absl::StatusOr<bool> PassPipeline::RunPass(
    const Active& active, const PassRun& run, runtime::GraphModule& gm,
    absl::FunctionRef<absl::StatusOr<bool>()> body) {
  for (Instrumentation* i : active.all) {
    RETURN_IF_ERROR(i->RunBeforePass(run, gm));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<bool> changed = body();
  const absl::Duration took = absl::Now() - start;
  absl::Status error;
  if (!changed.ok()) {
    error = util::Annotate(changed.status(), absl::StrCat(run.name, " failed"));
  } else {
    records_.push_back({run.name, *changed, took, run.app,
                        run.reverse || run.pass->preserves_computation()});
    for (Instrumentation* i : active.all) {
      error = i->RunAfterPass(run, gm, *changed);
      if (!error.ok()) break;
    }
  }
  if (error.ok()) return *changed;
  for (Instrumentation* i : active.all) {
    error = i->RunAfterPassFailed(run, gm, std::move(error));
  }
  return error;
}

absl::StatusOr<bool> PassPipeline::Run(runtime::GraphModule& gm) {
  records_.clear();
  const Active active = Instrument();
  for (Instrumentation* i : active.all) {
    RETURN_IF_ERROR(i->RunBeforePipeline(gm));
  }
  // Restored on every return: the pin is only there while a pass runs.
  const std::optional<int64_t> outer_pin = PinnedApplicationId(gm.graph());
  struct Unpin {
    runtime::GraphModule& gm;
    std::optional<int64_t> pin;
    ~Unpin() { PinApplicationId(gm.graph(), pin); }
  } unpin{gm, outer_pin};
  int64_t app = NextApplicationId(gm.graph());
  bool any = false;
  for (const auto& pass : passes_) {
    const PassRun run{pass.get(), std::string(pass->name()), app, false};
    // Pinned for the pass and its before-pass hooks (a reproducer's input
    // carries the id, so rerunning the pass uses the same one).
    PinApplicationId(gm.graph(), app);
    absl::StatusOr<bool> changed = RunPass(active, run, gm, [&] {
      absl::StatusOr<bool> r =
          runtime::TorchCall(run.name, [&] { return pass->Run(gm); });
      PinApplicationId(gm.graph(), outer_pin);
      return r;
    });
    if (!changed.ok()) return changed.status();
    app += pass->application_count();
    any |= *changed;
  }
  return any;
}

absl::StatusOr<runtime::GraphModule> PassPipeline::Apply(
    const runtime::GraphModule& gm) {
  ASSIGN_OR_RETURN(runtime::GraphModule copy, gm.Clone());
  RETURN_IF_ERROR(Run(copy).status());
  return copy;
}

absl::StatusOr<bool> PassPipeline::Reverse(runtime::GraphModule& gm) {
  for (const auto& pass : passes_) {
    if (!pass->is_reversible()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot reverse pipeline ", name_, ": pass ",
                       pass->name(), " is not reversible"));
    }
  }
  records_.clear();
  const Active active = Instrument();
  for (Instrumentation* i : active.all) {
    RETURN_IF_ERROR(i->RunBeforePipeline(gm));
  }
  bool any = false;
  for (auto it = passes_.rbegin(); it != passes_.rend(); ++it) {
    auto* pass = dynamic_cast<ReversibleTransformation*>(it->get());
    if (pass == nullptr) {
      return absl::InternalError(absl::StrCat(
          (*it)->name(),
          " claims to be reversible but is not a ReversibleTransformation"));
    }
    const PassRun run{pass, absl::StrCat(pass->name(), " (reverse)"), 0, true};
    ASSIGN_OR_RETURN(bool changed, RunPass(active, run, gm, [&] {
                       return runtime::TorchCall(
                           run.name, [&] { return pass->Reverse(gm); });
                     }));
    any |= changed;
  }
  return any;
}

std::string PassPipeline::TimingReport() const {
  std::string out;
  for (const PassRecord& r : records_) {
    char ms[32];
    std::snprintf(ms, sizeof(ms), "%.3f", absl::ToDoubleMilliseconds(r.time));
    absl::StrAppend(&out, r.name, ": ", r.changed ? "changed" : "unchanged",
                    ", ", ms, " ms\n");
  }
  return out;
}

}  // namespace tracecut::transforms
