// One subgraph of a partitioned run (PartitionedRun in pipeline_internal.h):
// its weights placed, its batches run with the modifiers' hooks, compressed,
// propagated, and its figures recorded.

#include <ATen/ATen.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "partition/module_sizes.h"
#include "partition/subgraph.h"
#include "pipelines/expert_calibration.h"
#include "pipelines/interrupt.h"
#include "pipelines/pipeline_internal.h"
#include "runtime/device.h"
#include "runtime/device_placement.h"
#include "runtime/interpreter.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::internal {

using ::tracecut::modifiers::LeafModule;
using ::tracecut::modifiers::Modifier;
using ::tracecut::modifiers::ModuleCall;
using ::tracecut::modifiers::RunContext;
using ::tracecut::modifiers::SubgraphTiming;
namespace {

using runtime::Interpreter;

// Bytes of the parameters `s` reads: its get_attr tensors and its leaf
// modules' parameters and buffers, as the model holds them now.
int64_t ParamBytesRead(const partition::Subgraph& s,
                       const torch::jit::Module& module) {
  partition::ParamBytesFn bytes = partition::ModuleParamBytes(module);
  int64_t total = 0;
  for (const std::vector<std::string>* paths :
       {&s.param_targets, &s.leaf_modules}) {
    for (const std::string& path : *paths) total += bytes(path).value_or(0);
  }
  return total;
}

// The process's resident set size from /proc/self/statm; 0 where there is
// none.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

absl::StatusOr<c10::IValue> PartitionedRun::GetInput(int64_t batch,
                                                     const std::string& name) {
  ASSIGN_OR_RETURN(c10::IValue v, cache_->Get(batch, name));
  if (options_.device.is_cpu()) return v;
  return runtime::TorchCall(
      absl::StrCat("copying '", name, "' to ",
                   runtime::DeviceName(options_.device)),
      [&] { return runtime::ToDevice(v, options_.device); });
}

absl::Status PartitionedRun::PutTracked(int64_t batch, const std::string& name,
                                        const c10::IValue& value) {
  // The cache lives on the host (Note [Devices] in pipeline.cc).
  ASSIGN_OR_RETURN(
      c10::IValue host,
      runtime::TorchCall(absl::StrCat("copying '", name, "' to the host"), [&] {
        return options_.device.is_cpu()
                   ? value
                   : runtime::ToDevice(value, c10::Device(c10::kCPU));
      }));
  RETURN_IF_ERROR(cache_->Put(batch, name, host));
  result_.peak_cache_values =
      std::max(result_.peak_cache_values, cache_->stats().values);
  return absl::OkStatus();
}

absl::Status PartitionedRun::RunBatches(int i, const char* stage, bool store,
                                        HookDispatcher* hooks,
                                        AllExpertsRunner* experts) {
  Step& step = steps_[i];
  const partition::Subgraph& s = *step.subgraph;
  const int64_t num_batches = static_cast<int64_t>(data_.batches.size());
  const int n = static_cast<int>(steps_.size());
  for (int64_t b = 0; b < num_batches; ++b) {
    const std::string where = absl::StrFormat(
        "subgraph %d/%d (%s), %s batch %d", i + 1, n, step.label, stage, b);
    // A safe point: SIGINT / SIGTERM stop here (interrupt.h).
    RETURN_IF_ERROR(CheckInterrupt());
    if (hooks != nullptr) hooks->set_batch(b);
    std::vector<c10::IValue> inputs;
    inputs.reserve(s.input_names.size());
    for (const std::string& name : s.input_names) {
      absl::StatusOr<c10::IValue> v = GetInput(b, name);
      if (!v.ok()) return util::Annotate(v.status(), where);
      inputs.push_back(std::move(*v));
    }
    absl::StatusOr<c10::IValue> out = step.interp->Run(std::move(inputs));
    if (hooks != nullptr && !hooks->status().ok()) return hooks->status();
    if (!out.ok()) return util::Annotate(out.status(), where);
    if (experts != nullptr) {
      absl::Status all = experts->RunOnAllTokens();
      if (hooks != nullptr && !hooks->status().ok()) return hooks->status();
      if (!all.ok()) return util::Annotate(all, where);
    }
    if (!out->isTuple() ||
        out->toTupleRef().elements().size() != s.output_names.size()) {
      return absl::InternalError(absl::StrCat(
          where, ": expected a tuple of ", s.output_names.size(), " outputs"));
    }
    const auto& elements = out->toTupleRef().elements();
    if (options_.check_finite) {
      for (size_t p = 0; p < elements.size(); ++p) {
        ASSIGN_OR_RETURN(std::string kind, runtime::TorchCall(where, [&] {
                           return NonFiniteKind(elements[p]);
                         }));
        if (!kind.empty()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "non-finite activation: value '%s' computed by subgraph %d/%d "
              "(%s) in %s batch %d has %s entries",
              s.output_names[p], i + 1, n, step.label, stage, b, kind));
        }
      }
    }
    if (store) {
      for (size_t p : step.keep_outputs) {
        absl::Status put = PutTracked(b, s.output_names[p], elements[p]);
        if (!put.ok()) return util::Annotate(put, where);
      }
    }
    progress_->Advance(1);
    progress_->Update(Point(i, stage, b + 1, num_batches));
  }
  progress_->EndStep(Point(i, stage, num_batches, num_batches));
  return absl::OkStatus();
}

absl::Status PartitionedRun::Replay(int i, RunContext& ctx,
                                    const RunContext::CallVisitor& visit) {
  Step& step = steps_[i];
  const partition::Subgraph& s = *step.subgraph;
  // Thrown by the hook to end a batch early (or on the visitor's error):
  // the interpreter unwinds and returns an error, told apart by `stopped`.
  struct StopBatch {};
  absl::Status failure;
  bool stopped = false;
  int64_t batch = 0;
  Interpreter::HookId id = step.interp->AddModuleHook(
      [&](const ir::Node& node, const torch::jit::Module& module,
          absl::Span<const c10::IValue> inputs, const c10::IValue* output) {
        if (output == nullptr) return;
        const LeafModule* leaf = ctx.FindLeaf(node.target());
        ModuleCall call;
        call.node = &node;
        call.path = node.target();
        call.type = leaf != nullptr ? absl::string_view(leaf->type) : "";
        call.module = &module;
        call.inputs = inputs;
        call.output = output;
        call.batch = batch;
        call.subgraph = i;
        absl::StatusOr<bool> go = visit(call);
        if (go.ok() && *go) return;
        if (!go.ok()) failure = go.status();
        stopped = true;
        throw StopBatch();
      });
  absl::Cleanup remove = [&] { step.interp->RemoveHook(id); };
  const int64_t num_batches = static_cast<int64_t>(data_.batches.size());
  for (batch = 0; batch < num_batches; ++batch) {
    RETURN_IF_ERROR(CheckInterrupt());
    std::vector<c10::IValue> inputs;
    inputs.reserve(s.input_names.size());
    for (const std::string& name : s.input_names) {
      ASSIGN_OR_RETURN(c10::IValue v, GetInput(batch, name));
      inputs.push_back(std::move(v));
    }
    stopped = false;
    absl::StatusOr<c10::IValue> out = step.interp->Run(std::move(inputs));
    RETURN_IF_ERROR(failure);
    if (!out.ok() && !stopped) {
      return util::Annotate(out.status(),
                            absl::StrFormat("subgraph %d (%s), replay batch %d",
                                            i + 1, step.label, batch));
    }
  }
  return absl::OkStatus();
}

absl::Status PartitionedRun::RunStep(int i, RunContext& ctx,
                                     HookDispatcher& hooks,
                                     HookDispatcher* transform_hooks) {
  Step& step = steps_[i];
  const int64_t num_batches = static_cast<int64_t>(data_.batches.size());
  SubgraphTiming timing;
  timing.index = i;
  timing.label = step.label;
  SubgraphCacheStats stats;
  const absl::Time load_start = absl::Now();
  if (options_.weights != nullptr) RETURN_IF_ERROR(options_.weights->Load(i));
  std::vector<std::string> placed_paths = step.subgraph->param_targets;
  placed_paths.insert(placed_paths.end(), step.subgraph->leaf_modules.begin(),
                      step.subgraph->leaf_modules.end());
  ASSIGN_OR_RETURN(runtime::DevicePlacement placed,
                   runtime::DevicePlacement::Place(
                       model_.module(), placed_paths, options_.device));
  stats.load_seconds = absl::ToDoubleSeconds(absl::Now() - load_start);
  // Measured now: streamed weights are only loaded from here to Done().
  stats.param_bytes = ParamBytesRead(*step.subgraph, model_.module());
  RETURN_IF_ERROR(ForEachModifier(modifiers_, [&](Modifier* m) {
    return m->OnSubgraphStart(ctx, step.info);
  }));

  ctx.set_replayer([this, i, &ctx](const RunContext::CallVisitor& visit) {
    return Replay(i, ctx, visit);
  });
  absl::Cleanup no_replay = [&ctx] { ctx.set_replayer(nullptr); };
  absl::Time t0 = absl::Now();
  if (transform_hooks != nullptr) {
    std::vector<Interpreter::HookId> tids =
        transform_hooks->Attach(*step.interp, i);
    absl::Status seen =
        RunBatches(i, "transform", /*store=*/false, transform_hooks, nullptr);
    for (Interpreter::HookId tid : tids) step.interp->RemoveHook(tid);
    RETURN_IF_ERROR(seen);
    RETURN_IF_ERROR(ForEachModifier(transforms_, [&](Modifier* m) {
      return m->OnSubgraphEnd(ctx, step.info);
    }));
  }
  std::unique_ptr<AllExpertsRunner> experts;
  if (options_.calibrate_all_experts) {
    ASSIGN_OR_RETURN(experts, AllExpertsRunner::Create(
                                  *step.subgraph->graph, model_.module(),
                                  options_.expert_pattern));
    if (experts->empty()) experts.reset();
  }
  std::vector<Interpreter::HookId> expert_ids;
  std::vector<Interpreter::HookId> ids =
      hooks.Attach(*step.interp, i, experts.get());
  if (experts != nullptr) {
    for (Interpreter* e : experts->expert_interpreters()) {
      e->PlaceOn(options_.device);
    }
    expert_ids.push_back(experts->AttachCapture(*step.interp));
    for (Interpreter* e : experts->expert_interpreters()) hooks.Attach(*e, i);
  }
  absl::Status calibrated =
      RunBatches(i, "calibrate", /*store=*/true, &hooks, experts.get());
  for (Interpreter::HookId id : ids) step.interp->RemoveHook(id);
  for (Interpreter::HookId e : expert_ids) step.interp->RemoveHook(e);
  RETURN_IF_ERROR(calibrated);
  absl::Time t1 = absl::Now();
  timing.calibrate_seconds = absl::ToDoubleSeconds(t1 - t0);
  // The calibration pass's batches are freed; their heap pages go back to
  // the system before compression allocates its [in, in] and [out, in]
  // matrices, as after propagation (WeightStream's trim): glibc keeps freed
  // blocks under its raised mmap threshold, and the peak grew by ~30 MB a
  // layer without these trims (hidden 2048; bench/RESULTS.md).
  ::malloc_trim(0);

  progress_->Update(Point(i, "compress", 0, 0));
  // Whether a weight changed that later subgraphs must see (Note
  // [Propagated changes] in modifier.h).
  bool changed = false;
  RETURN_IF_ERROR(ForEachModifier(
      transform_hooks != nullptr ? absl::MakeConstSpan(others_) : modifiers_,
      [&](Modifier* m) {
        const int64_t updates_before = ctx.update_count();
        RETURN_IF_ERROR(m->OnSubgraphEnd(ctx, step.info));
        changed = changed || (m->PropagatesChanges() &&
                              ctx.update_count() != updates_before);
        return absl::OkStatus();
      }));
  progress_->Advance(1);
  progress_->EndStep(Point(i, "compress", 0, 0));
  absl::Time t2 = absl::Now();
  timing.compress_seconds = absl::ToDoubleSeconds(t2 - t1);
  ::malloc_trim(0);

  // Without a weight change the calibration pass's outputs are exactly
  // what a propagation pass would compute; outputs no later subgraph reads
  // (the last subgraph's: the logits) need no pass either.
  bool propagated = false;
  if (options_.propagate_error) {
    if (changed && !step.keep_outputs.empty()) {
      RETURN_IF_ERROR(
          RunBatches(i, "propagate", /*store=*/true, nullptr, nullptr));
      propagated = true;
    } else {
      progress_->Advance(num_batches);
    }
  }
  timing.propagate_seconds = absl::ToDoubleSeconds(absl::Now() - t2);
  const absl::Time write_start = absl::Now();
  RETURN_IF_ERROR(placed.Return());
  RETURN_IF_ERROR(internal::RecordsToHost(results_));
  if (options_.weights != nullptr) {
    RETURN_IF_ERROR(options_.weights->Done(i, results_));
  }
  stats.write_seconds = absl::ToDoubleSeconds(absl::Now() - write_start);

  for (int64_t b = 0; b < num_batches; ++b) {
    for (const std::string& name : step.release) {
      if (cache_->Contains(b, name)) RETURN_IF_ERROR(cache_->Release(b, name));
    }
  }
  results_.subgraphs.push_back(timing);

  stats.index = i;
  stats.label = step.label;
  stats.nodes = step.subgraph->node_count;
  stats.rss_bytes = ResidentBytes();
  ASSIGN_OR_RETURN(stats.device_peak_bytes,
                   runtime::DevicePeakBytes(options_.device));
  stats.values = cache_->stats().values;
  stats.bytes_held = cache_->stats().bytes_held;
  stats.bytes_on_disk = cache_->stats().bytes_on_disk;
  stats.propagated = propagated;
  result_.subgraphs.push_back(stats);
  return absl::OkStatus();
}

}  // namespace tracecut::pipelines::internal
