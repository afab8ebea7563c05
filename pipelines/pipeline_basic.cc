#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "pipelines/interrupt.h"
#include "pipelines/pipeline_internal.h"
#include "runtime/device.h"
#include "runtime/device_placement.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::internal {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::LeafModule;
using ::tracecut::modifiers::Modifier;
using ::tracecut::modifiers::RunContext;
using ::tracecut::modifiers::SubgraphInfo;
using ::tracecut::modifiers::SubgraphTiming;
using ::tracecut::util::Progress;
using ::tracecut::util::ProgressPoint;

using runtime::Interpreter;

namespace {

// InvalidArgument when the model's output in `stage`'s batch `b` has NaN or
// infinite entries.
absl::Status CheckOutputFinite(const c10::IValue& out, absl::string_view stage,
                               int64_t b, const std::string& where) {
  ASSIGN_OR_RETURN(std::string kind, runtime::TorchCall(where, [&] {
                     return NonFiniteKind(out);
                   }));
  if (kind.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "non-finite activation: the model's output in %s batch %d has %s "
      "entries",
      stage == "calibrate" ? "calibration" : stage, b, kind));
}

}  // namespace

absl::StatusOr<PipelineResult> RunBasic(runtime::GraphModule& model,
                                        const CalibrationData& data,
                                        absl::Span<Modifier* const> modifiers,
                                        CalibrationResults& results,
                                        const PipelineOptions& options) {
  if (options.resume || options.stop_after_subgraph >= 0) {
    return absl::InvalidArgumentError(
        "the basic pipeline runs the model in one step and has no "
        "checkpoints to resume from; use --pipeline=sequential");
  }
  c10::NoGradGuard no_grad;
  Progress silent = Progress::Silent();
  Progress* progress = options.progress != nullptr ? options.progress : &silent;
  ASSIGN_OR_RETURN(Interpreter interp, Interpreter::Create(model));
  // Note [Devices] (pipeline.cc), for the whole model at once.
  interp.PlaceOn(options.device);
  if (interp.placeholders().size() != data.input_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", interp.placeholders().size(),
        " inputs but the calibration data gives ", data.input_names.size(),
        " (", absl::StrJoin(data.input_names, ", "), ")"));
  }
  const int64_t num_batches = static_cast<int64_t>(data.batches.size());
  if (num_batches == 0) {
    return absl::InvalidArgumentError("no calibration batches");
  }
  results.pipeline = std::string(PipelineKindName(PipelineKind::kBasic));
  RunContext ctx(&model, &results, num_batches, progress);
  ctx.set_measure_baselines(options.measure_baselines);
  RETURN_IF_ERROR(ForEachModifier(
      modifiers, [&](Modifier* m) { return m->OnRunStart(ctx); }));
  // Note [Transforms first] (modifier.h).
  std::vector<Modifier*> transforms;
  std::vector<Modifier*> others;
  for (Modifier* m : modifiers) {
    (m->IsTransform() ? transforms : others).push_back(m);
  }
  const bool transform_pass = !transforms.empty() && !others.empty();
  const absl::Span<Modifier* const> calibrated_by =
      transform_pass ? absl::MakeConstSpan(others) : modifiers;
  HookDispatcher hooks(ctx, calibrated_by);
  SubgraphInfo info;
  info.index = 0;
  info.count = 1;
  info.label = "(whole model)";
  for (const LeafModule& leaf : ctx.leaf_modules()) {
    info.leaf_modules.push_back(leaf.path);
  }
  PipelineResult result;
  result.num_subgraphs = 1;
  result.labels = {info.label};
  auto point = [&](const char* stage, int64_t b, int64_t nb) {
    ProgressPoint p;
    p.subgraph = 0;
    p.num_subgraphs = 1;
    p.label = info.label;
    p.stage = stage;
    p.batch = b;
    p.num_batches = nb;
    return p;
  };
  progress->Begin(num_batches * (transform_pass ? 2 : 1) + 1);
  SubgraphTiming timing;
  timing.label = info.label;
  ASSIGN_OR_RETURN(
      runtime::DevicePlacement placed,
      runtime::DevicePlacement::Place(model.module(), {""}, options.device));
  RETURN_IF_ERROR(ForEachModifier(
      modifiers, [&](Modifier* m) { return m->OnSubgraphStart(ctx, info); }));
  absl::Time t0 = absl::Now();
  std::unique_ptr<AllExpertsRunner> experts;
  if (options.calibrate_all_experts) {
    ASSIGN_OR_RETURN(experts,
                     AllExpertsRunner::Create(model.graph(), model.module(),
                                              options.expert_pattern));
    if (experts->empty()) experts.reset();
  }
  if (experts != nullptr) {
    for (Interpreter* e : experts->expert_interpreters()) {
      e->PlaceOn(options.device);
    }
  }
  // One pass over all batches with `dispatcher`'s hooks.
  auto run_batches = [&](const char* stage, HookDispatcher& dispatcher,
                         AllExpertsRunner* runner) -> absl::Status {
    for (int64_t b = 0; b < num_batches; ++b) {
      const std::string where =
          absl::StrFormat("whole model, %s batch %d", stage, b);
      RETURN_IF_ERROR(CheckInterrupt());
      dispatcher.set_batch(b);
      std::vector<c10::IValue> inputs = data.batches[b];
      if (!options.device.is_cpu()) {
        ASSIGN_OR_RETURN(inputs, util::Annotate(runtime::ValuesToDevice(
                                                    inputs, options.device),
                                                where));
      }
      absl::StatusOr<c10::IValue> out = interp.Run(std::move(inputs));
      if (!dispatcher.status().ok()) return dispatcher.status();
      if (!out.ok()) return util::Annotate(out.status(), where);
      if (runner != nullptr) {
        absl::Status all = runner->RunOnAllTokens();
        if (!dispatcher.status().ok()) return dispatcher.status();
        if (!all.ok()) return util::Annotate(all, where);
      }
      if (options.check_finite) {
        RETURN_IF_ERROR(CheckOutputFinite(*out, stage, b, where));
      }
      progress->Advance(1);
      progress->Update(point(stage, b + 1, num_batches));
    }
    progress->EndStep(point(stage, num_batches, num_batches));
    interp.ClearHooks();
    return absl::OkStatus();
  };
  if (transform_pass) {
    HookDispatcher transform_hooks(ctx, transforms);
    transform_hooks.Attach(interp, 0);
    RETURN_IF_ERROR(run_batches("transform", transform_hooks, nullptr));
    RETURN_IF_ERROR(ForEachModifier(
        transforms, [&](Modifier* m) { return m->OnSubgraphEnd(ctx, info); }));
  }
  hooks.Attach(interp, 0, experts.get());
  if (experts != nullptr) {
    experts->AttachCapture(interp);
    for (Interpreter* e : experts->expert_interpreters()) hooks.Attach(*e, 0);
  }
  RETURN_IF_ERROR(run_batches("calibrate", hooks, experts.get()));
  absl::Time t1 = absl::Now();
  timing.calibrate_seconds = absl::ToDoubleSeconds(t1 - t0);
  RETURN_IF_ERROR(ForEachModifier(
      calibrated_by, [&](Modifier* m) { return m->OnSubgraphEnd(ctx, info); }));
  progress->Advance(1);
  progress->EndStep(point("compress", 0, 0));
  timing.compress_seconds = absl::ToDoubleSeconds(absl::Now() - t1);
  results.subgraphs.push_back(timing);
  RETURN_IF_ERROR(placed.Return());
  RETURN_IF_ERROR(internal::RecordsToHost(results));
  RETURN_IF_ERROR(ForEachModifier(
      modifiers, [&](Modifier* m) { return m->OnRunEnd(ctx); }));
  progress->Finish(
      absl::StrFormat("basic pipeline: whole model, %d batches", num_batches));
  return result;
}

}  // namespace tracecut::pipelines::internal
