#include "pipelines/pipeline.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "partition/subgraph.h"
#include "pipelines/expert_calibration.h"
#include "pipelines/pipeline_checkpoint.h"
#include "pipelines/pipeline_internal.h"
#include "runtime/interpreter.h"
#include "runtime/torch_status.h"
#include "util/status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::Modifier;
using ::tracecut::modifiers::RunContext;
using ::tracecut::util::ProgressPoint;
namespace internal {
namespace {

// Note [Devices]
// With PipelineOptions::device a GPU, the parameters a subgraph reads go to
// the device once its weights are loaded and come back before they are
// written (DevicePlacement); its interpreter computes there
// (Interpreter::PlaceOn: the `device=cpu` torch.export writes into factory
// calls becomes the device). Inputs are copied from the cache to the device
// as a batch reads them, and outputs kept for later subgraphs are copied
// back: the cache stays on the host, as llm-compressor's IntermediatesCache
// (which offloads to the CPU by default). The modifiers' statistics
// (Hessians, ranges) are made from the device's activations and their work
// at the subgraph's end runs where those are; what they record goes to the
// host with the weights (RecordsToHost). Device memory: one subgraph's
// weights, its modifiers' statistics and one batch's activations.

using runtime::Interpreter;

std::string SubgraphLabel(const partition::Subgraph& s) {
  if (s.module_paths.empty()) return "(head)";
  if (s.module_paths.size() == 1) return s.module_paths[0];
  return absl::StrCat(s.module_paths.front(), " .. ", s.module_paths.back());
}

}  // namespace

ProgressPoint PartitionedRun::Point(int i, const char* stage, int64_t batch,
                                    int64_t batches) const {
  ProgressPoint p;
  p.subgraph = i;
  p.num_subgraphs = static_cast<int>(steps_.size());
  p.label = steps_[i].label;
  p.stage = stage;
  p.batch = batch;
  p.num_batches = batches;
  return p;
}

absl::Status PartitionedRun::Plan() {
  ASSIGN_OR_RETURN(partition_, partition::PartitionGraph(model_.graph(),
                                                         options_.partition));
  RETURN_IF_ERROR(partition::VerifySchedule(partition_));
  if (partition_.model_inputs.size() != data_.input_names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", partition_.model_inputs.size(), " inputs (",
        absl::StrJoin(partition_.model_inputs, ", "),
        ") but the calibration data gives ", data_.input_names.size(), " (",
        absl::StrJoin(data_.input_names, ", "), ")"));
  }
  const int n = static_cast<int>(partition_.subgraphs.size());
  // name -> the subgraphs that read it.
  absl::flat_hash_map<std::string, std::vector<int>> readers;
  for (int i = 0; i < n; ++i) {
    for (const std::string& name : partition_.subgraphs[i].input_names) {
      readers[name].push_back(i);
    }
  }
  for (size_t i = 0; i < partition_.model_inputs.size(); ++i) {
    if (readers.contains(partition_.model_inputs[i])) {
      model_inputs_used_.push_back(partition_.model_inputs[i]);
      model_input_index_.push_back(i);
    }
  }
  steps_.resize(n);
  for (int i = 0; i < n; ++i) {
    const partition::Subgraph& s = partition_.subgraphs[i];
    Step& step = steps_[i];
    step.subgraph = &s;
    step.label = SubgraphLabel(s);
    result_.labels.push_back(step.label);
    absl::StatusOr<Interpreter> interp =
        Interpreter::Create(*s.graph, model_.module());
    if (!interp.ok()) {
      return util::Annotate(
          interp.status(),
          absl::StrFormat("subgraph %d/%d (%s)", i + 1, n, step.label));
    }
    step.interp = std::make_unique<Interpreter>(std::move(*interp));
    step.interp->PlaceOn(options_.device);
    step.info.index = i;
    step.info.count = n;
    step.info.label = step.label;
    step.info.module_paths = s.module_paths;
    step.info.leaf_modules = s.leaf_modules;
    for (size_t p = 0; p < s.output_names.size(); ++p) {
      auto it = readers.find(s.output_names[p]);
      if (it != readers.end() && it->second.back() > i) {
        step.keep_outputs.push_back(p);
      }
    }
    step.release = s.last_use;
  }
  return absl::OkStatus();
}

absl::Status PartitionedRun::PlanLayerChain() {
  const int n = static_cast<int>(steps_.size());
  int first = -1;
  for (int i = 0; i < n; ++i) {
    if (!steps_[i].subgraph->module_paths.empty()) {
      first = i;
      break;
    }
  }
  if (first < 0) {
    return absl::InvalidArgumentError(
        "layer_sequential: the partition has no target layer");
  }
  const auto& first_inputs = steps_[first].subgraph->input_names;
  std::set<std::string> captured(first_inputs.begin(), first_inputs.end());
  std::set<std::string> kept;
  for (int j = first + 1; j < n; ++j) {
    const partition::Subgraph& s = *steps_[j].subgraph;
    const partition::Subgraph& prev = *steps_[j - 1].subgraph;
    std::set<std::string> prev_out(prev.output_names.begin(),
                                   prev.output_names.end());
    for (const std::string& name : s.input_names) {
      if (captured.count(name) > 0) {
        kept.insert(name);
        continue;
      }
      if (prev_out.count(name) > 0) continue;
      return absl::FailedPreconditionError(absl::StrFormat(
          "layer_sequential needs a plain chain of target layers, but "
          "subgraph %d (%s) reads '%s', which is neither an output of "
          "subgraph %d (%s) nor an input of the first target (%s); use "
          "--pipeline=sequential",
          j, steps_[j].label, name, j - 1, steps_[j - 1].label,
          steps_[first].label));
    }
  }
  for (int j = first; j < n; ++j) {
    steps_[j].release.clear();
    for (const std::string& name : steps_[j].subgraph->input_names) {
      if (kept.count(name) == 0) steps_[j].release.push_back(name);
    }
  }
  return absl::OkStatus();
}

std::string PartitionedRun::RunIdentity() const {
  std::vector<std::string> modifier_names;
  for (const Modifier* m : modifiers_) modifier_names.push_back(m->name());
  return absl::StrCat("pipeline=", PipelineKindName(options_.kind), "\n",
                      "propagate_error=", options_.propagate_error ? 1 : 0,
                      "\n", "subgraphs=", steps_.size(), ": ",
                      absl::StrJoin(result_.labels, ", "), "\n",
                      "data=", data_.num_samples, "x", SeqLenText(data_),
                      " in ", data_.batches.size(), " batches, ",
                      absl::StrFormat("%016x", data_.fingerprint), "\n",
                      "modifiers=", absl::StrJoin(modifier_names, ", "), "\n",
                      "caller=", options_.fingerprint, "\n");
}

absl::StatusOr<int> PartitionedRun::Restore(RunContext& ctx) {
  const int n = static_cast<int>(steps_.size());
  std::optional<int> at;
  if (options_.checkpoint_group != nullptr) {
    ASSIGN_OR_RETURN(
        at, options_.checkpoint_group->AgreeOnResume(checkpoint_->Kept()));
    if (*at == 0) {
      progress_->Note(absl::StrCat(
          "not every rank has a checkpoint (this one in ", checkpoint_->dir(),
          "); starting from the first subgraph"));
      return 0;
    }
  }
  ASSIGN_OR_RETURN(std::optional<int> next,
                   checkpoint_->Restore(
                       ctx, modifiers_, n,
                       [this](int64_t batch, const std::string& name,
                              const c10::IValue& value) {
                         return PutTracked(batch, name, value);
                       },
                       at));
  if (at.has_value() && !next.has_value()) {
    // The ranks agreed on it a moment ago: it was removed since.
    return absl::FailedPreconditionError(
        absl::StrFormat("the checkpoint of the first %d subgraphs in %s "
                        "vanished while resuming",
                        *at, checkpoint_->dir()));
  }
  if (!next.has_value()) {
    progress_->Note(absl::StrCat("no checkpoint in ", checkpoint_->dir(),
                                 "; starting from the first subgraph"));
    return 0;
  }
  result_.resumed = true;
  result_.first_subgraph = *next;
  progress_->Note(absl::StrFormat("resuming from %s after subgraph %d/%d",
                                  checkpoint_->dir(), *next, n));
  return *next;
}

absl::StatusOr<PipelineResult> PartitionedRun::Run() {
  c10::NoGradGuard no_grad;
  RETURN_IF_ERROR(Plan());
  if (options_.kind == PipelineKind::kLayerSequential) {
    RETURN_IF_ERROR(PlanLayerChain());
  }
  const int n = static_cast<int>(steps_.size());
  result_.num_subgraphs = n;
  if (options_.weights != nullptr) {
    std::vector<const partition::Subgraph*> subgraphs;
    for (const Step& step : steps_) subgraphs.push_back(step.subgraph);
    RETURN_IF_ERROR(options_.weights->Plan(subgraphs));
  }
  results_.pipeline = std::string(PipelineKindName(options_.kind));
  const int64_t num_batches = static_cast<int64_t>(data_.batches.size());
  if (num_batches == 0) {
    return absl::InvalidArgumentError("no calibration batches");
  }
  RunContext ctx(&model_, &results_, num_batches, progress_);
  ctx.set_measure_baselines(options_.measure_baselines);
  // Validation first: nothing is written before the modifiers accept the
  // model.
  RETURN_IF_ERROR(ForEachModifier(
      modifiers_, [&](Modifier* m) { return m->OnRunStart(ctx); }));
  for (Modifier* m : modifiers_) {
    (m->IsTransform() ? transforms_ : others_).push_back(m);
  }
  const bool transform_pass = !transforms_.empty() && !others_.empty();
  HookDispatcher hooks(
      ctx, transform_pass ? absl::MakeConstSpan(others_) : modifiers_);
  std::optional<HookDispatcher> transform_hooks;
  if (transform_pass) transform_hooks.emplace(ctx, transforms_);
  ASSIGN_OR_RETURN(IntermediatesCache cache,
                   IntermediatesCache::Create(options_.cache));
  cache_.emplace(std::move(cache));

  int start = 0;
  if (!options_.run_dir.empty()) {
    checkpoint_.emplace(options_.run_dir, RunIdentity(),
                        /*keep_previous=*/options_.checkpoint_group != nullptr);
    if (options_.resume) {
      ASSIGN_OR_RETURN(start, Restore(ctx));
    }
    RETURN_IF_ERROR(checkpoint_->CreateDir());
    RETURN_IF_ERROR(checkpoint_->DiscardAfter(start));
  }
  if (options_.weights != nullptr) {
    RETURN_IF_ERROR(options_.weights->Resume(start));
  }
  if (start == 0) {
    for (int64_t b = 0; b < num_batches; ++b) {
      for (size_t k = 0; k < model_inputs_used_.size(); ++k) {
        RETURN_IF_ERROR(PutTracked(b, model_inputs_used_[k],
                                   data_.batches[b][model_input_index_[k]]));
      }
    }
  }

  progress_->Note(absl::StrFormat(
      "%s pipeline: %d subgraphs, %d calibration batches (%d samples x %s "
      "tokens)%s",
      PipelineKindName(options_.kind), n, num_batches, data_.num_samples,
      SeqLenText(data_),
      options_.propagate_error ? "" : ", no error propagation"));
  int64_t units = 0;
  for (int i = start; i < n; ++i) {
    units += num_batches + 1 + (options_.propagate_error ? num_batches : 0) +
             (transform_pass ? num_batches : 0);
  }
  progress_->Begin(units);
  for (int i = start; i < n; ++i) {
    RETURN_IF_ERROR(
        RunStep(i, ctx, hooks,
                transform_hooks.has_value() ? &*transform_hooks : nullptr));
    if (checkpoint_.has_value() && options_.checkpoint_group != nullptr) {
      RETURN_IF_ERROR(options_.checkpoint_group->BeforeCheckpoint(i));
    }
    if (checkpoint_.has_value()) {
      RETURN_IF_ERROR(checkpoint_->Write(i + 1, ctx, modifiers_, *cache_));
    }
    if (options_.stop_after_subgraph == i) {
      result_.stopped = true;
      result_.cache = cache_->stats();
      progress_->Finish(
          absl::StrFormat("stopped after subgraph %d/%d (checkpoint in %s)",
                          i + 1, n, options_.run_dir));
      return std::move(result_);
    }
  }
  for (int64_t b = 0; b < num_batches; ++b) cache_->ReleaseBatch(b);
  if (options_.weights != nullptr) {
    RETURN_IF_ERROR(options_.weights->LoadRest());
  }
  RETURN_IF_ERROR(ForEachModifier(
      modifiers_, [&](Modifier* m) { return m->OnRunEnd(ctx); }));
  result_.cache = cache_->stats();
  progress_->Finish(absl::StrFormat("%s pipeline: %d subgraphs, %d batches",
                                    PipelineKindName(options_.kind), n,
                                    num_batches));
  return std::move(result_);
}

}  // namespace internal
namespace {

at::Tensor FirstTensor(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor();
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      at::Tensor t = FirstTensor(e);
      if (t.defined()) return t;
    }
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      at::Tensor t = FirstTensor(e);
      if (t.defined()) return t;
    }
  }
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      at::Tensor t = FirstTensor(e.value());
      if (t.defined()) return t;
    }
  }
  return at::Tensor();
}

// Whether calibrate_all_experts applies to `model`. Checked on the whole
// model first: a pattern that finds no expert, or an expert that cannot run
// on all tokens, fails before any work when the option was asked for, and
// otherwise (llm-compressor's default) leaves the routed tokens.
absl::StatusOr<bool> AllExpertsApply(const runtime::GraphModule& model,
                                     const PipelineOptions& options,
                                     CalibrationResults& results) {
  absl::StatusOr<std::vector<ExpertRegion>> experts =
      FindExpertRegions(model.graph(), options.expert_pattern);
  if (!experts.ok()) {
    if (options.all_experts_required) return experts.status();
    std::string why = absl::StrCat(
        "MoE experts are calibrated on the tokens routed to them, not on all "
        "tokens (set calibrate_all_experts: false to say so, or "
        "expert_modules to the experts' path pattern): ",
        experts.status().message());
    if (options.progress != nullptr) {
      options.progress->Note(absl::StrCat("warning: ", why));
    }
    results.warnings.push_back(std::move(why));
    return false;
  }
  // Experts fused into 3-D parameters are no modules: the weight
  // quantization modifiers give them all the tokens (fused_experts.h).
  ASSIGN_OR_RETURN(checkpoint::Layout layout,
                   checkpoint::Layout::FromExtraFiles(model.extra_files()));
  if (!experts->empty() || layout.FirstSplit() != nullptr) return true;
  if (!options.all_experts_required) return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "calibrate_all_experts: no module of the model matches the expert "
      "pattern '",
      options.expert_pattern,
      "' (set expert_modules in the recipe to the path pattern of the "
      "experts)"));
}

}  // namespace

absl::string_view PipelineKindName(PipelineKind kind) {
  switch (kind) {
    case PipelineKind::kBasic:
      return "basic";
    case PipelineKind::kLayerSequential:
      return "layer_sequential";
    case PipelineKind::kSequential:
      return "sequential";
  }
  return "?";
}

absl::StatusOr<PipelineKind> ParsePipelineKind(absl::string_view name) {
  if (name == "basic") return PipelineKind::kBasic;
  if (name == "layer_sequential") return PipelineKind::kLayerSequential;
  if (name == "sequential") return PipelineKind::kSequential;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown pipeline '", name, "' (sequential, layer_sequential or basic)"));
}

absl::StatusOr<PipelineResult> RunPipeline(
    runtime::GraphModule& model, const CalibrationData& data,
    absl::Span<Modifier* const> modifiers, CalibrationResults& results,
    const PipelineOptions& requested) {
  PipelineOptions options = requested;
  if (options.calibrate_all_experts) {
    ASSIGN_OR_RETURN(options.calibrate_all_experts,
                     AllExpertsApply(model, options, results));
  }
  if (options.kind == PipelineKind::kBasic) {
    if (options.weights != nullptr) {
      return absl::InvalidArgumentError(
          "the basic pipeline runs the whole model at once: it cannot "
          "stream weights subgraph by subgraph (use sequential)");
    }
    return internal::RunBasic(model, data, modifiers, results, options);
  }
  internal::PartitionedRun run(model, data, modifiers, results, options);
  return run.Run();
}

absl::StatusOr<OutputError> CompareOutputs(const torch::jit::Module& reference,
                                           const torch::jit::Module& candidate,
                                           const CalibrationData& data) {
  c10::NoGradGuard no_grad;
  return runtime::TorchCall(
      "comparing outputs", [&]() -> absl::StatusOr<OutputError> {
        torch::jit::Module ref = reference;
        torch::jit::Module cand = candidate;
        double diff2 = 0, ref2 = 0;
        OutputError err;
        for (const auto& batch : data.batches) {
          at::Tensor r = FirstTensor(ref.forward(batch));
          at::Tensor c = FirstTensor(cand.forward(batch));
          if (!r.defined() || !c.defined() || r.sizes() != c.sizes()) {
            return absl::InvalidArgumentError(
                "the models' first outputs are not tensors of one shape");
          }
          at::Tensor d = (c.to(at::kDouble) - r.to(at::kDouble));
          diff2 += d.pow(2).sum().item<double>();
          ref2 += r.to(at::kDouble).pow(2).sum().item<double>();
          err.max_abs = std::max(err.max_abs, d.abs().max().item<double>());
          ++err.batches;
        }
        err.relative = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
        return err;
      });
}

}  // namespace tracecut::pipelines
