#include "pipelines/pipeline.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "partition/subgraph.h"
#include "pipelines/expert_calibration.h"
#include "pipelines/interrupt.h"
#include "runtime/interpreter.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

using runtime::Interpreter;

// Thrown from a module hook to stop a run early once a modifier failed; the
// pipeline returns the modifier's status instead of the interpreter's.
struct HookAbort : std::exception {
  const char* what() const noexcept override { return "modifier failed"; }
};

std::string SubgraphLabel(const partition::Subgraph& s) {
  if (s.module_paths.empty()) return "(head)";
  if (s.module_paths.size() == 1) return s.module_paths[0];
  return absl::StrCat(s.module_paths.front(), " .. ", s.module_paths.back());
}

// Finds a NaN or infinite entry in a floating tensor inside `v`.
// Returns "NaN" / "infinite" / "" (all finite).
std::string NonFiniteKind(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.is_floating_point() || t.numel() == 0) return "";
    if (at::isfinite(t).all().item<bool>()) return "";
    return at::isnan(t).any().item<bool>() ? "NaN" : "infinite";
  }
  if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      std::string k = NonFiniteKind(e);
      if (!k.empty()) return k;
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      std::string k = NonFiniteKind(e);
      if (!k.empty()) return k;
    }
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      std::string k = NonFiniteKind(e.value());
      if (!k.empty()) return k;
    }
  }
  return "";
}

// Dispatches module-hook calls to the modifiers that want them.
class HookDispatcher {
 public:
  HookDispatcher(RunContext& ctx, absl::Span<Modifier* const> modifiers)
      : ctx_(ctx) {
    for (const LeafModule& leaf : ctx.leaf_modules()) {
      std::vector<Modifier*> wanted;
      for (Modifier* m : modifiers) {
        if (m->WantsModule(leaf.path, leaf.type)) wanted.push_back(m);
      }
      if (!wanted.empty()) {
        routes_[leaf.path] = Route{&leaf, std::move(wanted)};
      }
    }
  }

  // With `routed`, calls of modules inside its experts are not passed on:
  // the experts' calibration data comes from their runs on all tokens.
  Interpreter::HookId Attach(Interpreter& interp, int subgraph,
                             const AllExpertsRunner* routed = nullptr) {
    return interp.AddModuleHook(
        [this, subgraph, routed](
            const ir::Node& node, const torch::jit::Module& module,
            absl::Span<const c10::IValue> inputs, const c10::IValue* output) {
          if (output == nullptr || !status_.ok()) return;
          auto it = routes_.find(node.target());
          if (it == routes_.end()) return;
          if (routed != nullptr && routed->InExpert(node.target())) return;
          ModuleCall call;
          call.node = &node;
          call.path = it->second.leaf->path;
          call.type = it->second.leaf->type;
          call.module = &module;
          call.inputs = inputs;
          call.output = output;
          call.batch = batch_;
          call.subgraph = subgraph;
          for (Modifier* m : it->second.modifiers) {
            absl::Status s = m->OnModuleCall(ctx_, call);
            if (!s.ok()) {
              status_ = std::move(s);
              throw HookAbort();
            }
          }
        });
  }

  void set_batch(int64_t batch) { batch_ = batch; }
  const absl::Status& status() const { return status_; }

 private:
  struct Route {
    const LeafModule* leaf = nullptr;
    std::vector<Modifier*> modifiers;
  };
  RunContext& ctx_;
  absl::flat_hash_map<std::string, Route> routes_;
  int64_t batch_ = 0;
  absl::Status status_;
};

absl::Status ForEachModifier(absl::Span<Modifier* const> modifiers,
                             const std::function<absl::Status(Modifier*)>& fn) {
  for (Modifier* m : modifiers) RETURN_IF_ERROR(fn(m));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Note [Checkpoints]
// ------------------
// A run directory holds:
//   weights-NNNNN.pt  the tensors modifiers changed while subgraph NNNNN ran
//                     (a pickled dict path -> tensor), written once;
//   state.pt          a pickled dict: format, version, the run's identity
//                     (`identity`, see RunIdentity), next_subgraph, the
//                     weight files so far, CalibrationResults, each
//                     modifier's SaveState under its name, and the cache:
//                     one dict name -> value per batch.
// Both are written to a temporary file, fsync'ed and renamed, weights
// first, so state.pt always describes a complete set of weight files: a
// run killed at any point resumes from the last state.pt. Weights are split
// per subgraph so a checkpoint costs the new weights, not all of them.
// Tensors round-trip bit for bit (pickle keeps raw bytes), the cache gets
// back exactly the values it held, and modifiers continue from the state
// they had, so a resumed run computes exactly what an uninterrupted one
// does.

constexpr char kCheckpointFormat[] = "tracecut-calibration-checkpoint";
constexpr int64_t kCheckpointVersion = 1;
constexpr char kStateFile[] = "state.pt";

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp);
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    absl::Status s = ErrnoError("cannot flush", tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoError("cannot rename to", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::vector<char>> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  if (in.bad())
    return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  return bytes;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status EnsureDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "run directory '", dir, "' exists and is not a directory"));
  }
  return ErrnoError("cannot create run directory", dir);
}

// Modifier states are saved under "<position>:<name>" (a recipe may hold
// two modifiers of one kind).
std::string StateKey(size_t index, const Modifier& m) {
  return absl::StrCat(index, ":", m.name());
}

std::string WeightFileName(int subgraph) {
  return absl::StrFormat("weights-%05d.pt", subgraph);
}

c10::impl::GenericDict NewDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// ---------------------------------------------------------------------------

// One step of a partitioned run: a subgraph, its interpreter and what to
// keep of its results.
struct Step {
  const partition::Subgraph* subgraph = nullptr;
  std::unique_ptr<Interpreter> interp;
  std::string label;
  SubgraphInfo info;
  // Output positions (in subgraph->output_names) that later subgraphs read.
  std::vector<size_t> keep_outputs;
  // Names released from the cache once this subgraph is done.
  std::vector<std::string> release;
};

class PartitionedRun {
 public:
  PartitionedRun(runtime::GraphModule& model, const CalibrationData& data,
                 absl::Span<Modifier* const> modifiers,
                 CalibrationResults& results, const PipelineOptions& options)
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
  absl::Status RunStep(int i, RunContext& ctx, HookDispatcher& hooks);
  // With `experts`, they run on all tokens after each batch.
  absl::Status RunBatches(int i, const char* stage, bool store,
                          HookDispatcher* hooks, AllExpertsRunner* experts);
  absl::Status WriteCheckpoint(int next, RunContext& ctx);
  // Returns the subgraph to start at (0 without a usable checkpoint).
  absl::StatusOr<int> Restore(RunContext& ctx);
  absl::Status PutTracked(int64_t batch, const std::string& name,
                          const c10::IValue& value);
  ProgressPoint Point(int i, const char* stage, int64_t batch,
                      int64_t batches) const;

  runtime::GraphModule& model_;
  const CalibrationData& data_;
  absl::Span<Modifier* const> modifiers_;
  CalibrationResults& results_;
  const PipelineOptions& options_;
  Progress silent_ = Progress::Silent();
  Progress* progress_;

  partition::Partition partition_;
  std::vector<Step> steps_;
  std::vector<std::string> model_inputs_used_;  // Cache keys of model inputs.
  std::vector<size_t> model_input_index_;       // Into data_.input_names.
  std::optional<IntermediatesCache> cache_;
  std::vector<std::string> weight_files_;
  PipelineResult result_;
};

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

absl::Status Annotate(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
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
      return Annotate(
          interp.status(),
          absl::StrFormat("subgraph %d/%d (%s): ", i + 1, n, step.label));
    }
    step.interp = std::make_unique<Interpreter>(std::move(*interp));
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
                      "data=", data_.num_samples, "x", data_.seq_len, " in ",
                      data_.batches.size(), " batches, ",
                      absl::StrFormat("%016x", data_.fingerprint), "\n",
                      "modifiers=", absl::StrJoin(modifier_names, ", "), "\n",
                      "caller=", options_.fingerprint, "\n");
}

absl::Status PartitionedRun::PutTracked(int64_t batch, const std::string& name,
                                        const c10::IValue& value) {
  RETURN_IF_ERROR(cache_->Put(batch, name, value));
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
        "subgraph %d/%d (%s), %s batch %d: ", i + 1, n, step.label, stage, b);
    // A safe point: SIGINT / SIGTERM stop here (interrupt.h).
    RETURN_IF_ERROR(CheckInterrupt());
    if (hooks != nullptr) hooks->set_batch(b);
    std::vector<c10::IValue> inputs;
    inputs.reserve(s.input_names.size());
    for (const std::string& name : s.input_names) {
      absl::StatusOr<c10::IValue> v = cache_->Get(b, name);
      if (!v.ok()) return Annotate(v.status(), where);
      inputs.push_back(std::move(*v));
    }
    absl::StatusOr<c10::IValue> out = step.interp->Run(std::move(inputs));
    if (hooks != nullptr && !hooks->status().ok()) return hooks->status();
    if (!out.ok()) return Annotate(out.status(), where);
    if (experts != nullptr) {
      absl::Status all = experts->RunOnAllTokens();
      if (hooks != nullptr && !hooks->status().ok()) return hooks->status();
      if (!all.ok()) return Annotate(all, where);
    }
    if (!out->isTuple() ||
        out->toTupleRef().elements().size() != s.output_names.size()) {
      return absl::InternalError(absl::StrCat(
          where, "expected a tuple of ", s.output_names.size(), " outputs"));
    }
    const auto& elements = out->toTupleRef().elements();
    if (options_.check_finite) {
      for (size_t p = 0; p < elements.size(); ++p) {
        ASSIGN_OR_RETURN(
            std::string kind,
            runtime::TorchCall(absl::StripSuffix(where, ": "),
                               [&] { return NonFiniteKind(elements[p]); }));
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
        if (!put.ok()) return Annotate(put, where);
      }
    }
    progress_->Advance(1);
    progress_->Update(Point(i, stage, b + 1, num_batches));
  }
  progress_->EndStep(Point(i, stage, num_batches, num_batches));
  return absl::OkStatus();
}

absl::Status PartitionedRun::RunStep(int i, RunContext& ctx,
                                     HookDispatcher& hooks) {
  Step& step = steps_[i];
  const int64_t num_batches = static_cast<int64_t>(data_.batches.size());
  SubgraphTiming timing;
  timing.index = i;
  timing.label = step.label;
  RETURN_IF_ERROR(ForEachModifier(modifiers_, [&](Modifier* m) {
    return m->OnSubgraphStart(ctx, step.info);
  }));

  absl::Time t0 = absl::Now();
  std::unique_ptr<AllExpertsRunner> experts;
  if (options_.calibrate_all_experts) {
    ASSIGN_OR_RETURN(experts, AllExpertsRunner::Create(
                                  *step.subgraph->graph, model_.module(),
                                  options_.expert_pattern));
    if (experts->empty()) experts.reset();
  }
  std::vector<Interpreter::HookId> expert_ids;
  Interpreter::HookId id = hooks.Attach(*step.interp, i, experts.get());
  if (experts != nullptr) {
    expert_ids.push_back(experts->AttachCapture(*step.interp));
    for (Interpreter* e : experts->expert_interpreters()) hooks.Attach(*e, i);
  }
  absl::Status calibrated =
      RunBatches(i, "calibrate", /*store=*/true, &hooks, experts.get());
  step.interp->RemoveHook(id);
  for (Interpreter::HookId e : expert_ids) step.interp->RemoveHook(e);
  RETURN_IF_ERROR(calibrated);
  absl::Time t1 = absl::Now();
  timing.calibrate_seconds = absl::ToDoubleSeconds(t1 - t0);

  progress_->Update(Point(i, "compress", 0, 0));
  const int64_t updates_before = ctx.update_count();
  RETURN_IF_ERROR(ForEachModifier(modifiers_, [&](Modifier* m) {
    return m->OnSubgraphEnd(ctx, step.info);
  }));
  progress_->Advance(1);
  progress_->EndStep(Point(i, "compress", 0, 0));
  absl::Time t2 = absl::Now();
  timing.compress_seconds = absl::ToDoubleSeconds(t2 - t1);

  // Without a weight change the calibration pass's outputs are exactly
  // what a propagation pass would compute.
  bool propagated = false;
  if (options_.propagate_error) {
    if (ctx.update_count() != updates_before) {
      RETURN_IF_ERROR(
          RunBatches(i, "propagate", /*store=*/true, nullptr, nullptr));
      propagated = true;
    } else {
      progress_->Advance(num_batches);
    }
  }
  timing.propagate_seconds = absl::ToDoubleSeconds(absl::Now() - t2);

  for (int64_t b = 0; b < num_batches; ++b) {
    for (const std::string& name : step.release) {
      if (cache_->Contains(b, name)) RETURN_IF_ERROR(cache_->Release(b, name));
    }
  }
  results_.subgraphs.push_back(timing);

  SubgraphCacheStats stats;
  stats.index = i;
  stats.label = step.label;
  stats.values = cache_->stats().values;
  stats.bytes_held = cache_->stats().bytes_held;
  stats.bytes_on_disk = cache_->stats().bytes_on_disk;
  stats.propagated = propagated;
  result_.subgraphs.push_back(stats);
  return absl::OkStatus();
}

absl::Status PartitionedRun::WriteCheckpoint(int next, RunContext& ctx) {
  const std::string& dir = options_.run_dir;
  std::set<std::string> updated = ctx.TakeUpdatedTensors();
  if (!updated.empty()) {
    c10::impl::GenericDict weights = NewDict();
    for (const std::string& path : updated) {
      ASSIGN_OR_RETURN(at::Tensor t, model_.GetTensor(path));
      weights.insert(path, t.detach());
    }
    ASSIGN_OR_RETURN(std::vector<char> bytes,
                     runtime::TorchCall("checkpoint weights", [&] {
                       return torch::jit::pickle_save(weights);
                     }));
    std::string name = WeightFileName(next - 1);
    RETURN_IF_ERROR(
        WriteFileAtomically(absl::StrCat(dir, "/", name),
                            absl::string_view(bytes.data(), bytes.size())));
    weight_files_.push_back(name);
  }
  c10::impl::GenericDict state = NewDict();
  state.insert("format", std::string(kCheckpointFormat));
  state.insert("version", kCheckpointVersion);
  state.insert("identity", RunIdentity());
  state.insert("next_subgraph", static_cast<int64_t>(next));
  c10::List<std::string> files;
  for (const std::string& f : weight_files_) files.push_back(f);
  state.insert("weight_files", files);
  state.insert("results", results_.ToIValue());
  c10::impl::GenericDict mods = NewDict();
  for (size_t k = 0; k < modifiers_.size(); ++k) {
    ASSIGN_OR_RETURN(c10::IValue s, modifiers_[k]->SaveState());
    mods.insert(StateKey(k, *modifiers_[k]), s);
  }
  state.insert("modifiers", mods);
  c10::impl::GenericList cache(c10::AnyType::get());
  for (int64_t b = 0; b < static_cast<int64_t>(data_.batches.size()); ++b) {
    c10::impl::GenericDict values = NewDict();
    for (const std::string& name : cache_->Names(b)) {
      ASSIGN_OR_RETURN(c10::IValue v, cache_->Get(b, name));
      values.insert(name, v);
    }
    cache.push_back(values);
  }
  state.insert("cache", cache);
  ASSIGN_OR_RETURN(std::vector<char> bytes,
                   runtime::TorchCall("checkpoint state", [&] {
                     return torch::jit::pickle_save(state);
                   }));
  return WriteFileAtomically(absl::StrCat(dir, "/", kStateFile),
                             absl::string_view(bytes.data(), bytes.size()));
}

absl::StatusOr<int> PartitionedRun::Restore(RunContext& ctx) {
  const std::string& dir = options_.run_dir;
  const std::string path = absl::StrCat(dir, "/", kStateFile);
  if (!FileExists(path)) {
    progress_->Note(absl::StrCat("no checkpoint in ", dir,
                                 "; starting from the first subgraph"));
    return 0;
  }
  auto damaged = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", path, "' ", why, "; delete ", dir, " to start afresh"));
  };
  auto load = [&](const std::string& file) -> absl::StatusOr<c10::IValue> {
    ASSIGN_OR_RETURN(std::vector<char> bytes, ReadFileBytes(file));
    absl::StatusOr<c10::IValue> v =
        runtime::TorchCall("", [&] { return torch::jit::pickle_load(bytes); });
    if (!v.ok()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", file, "' is damaged: ", v.status().message()));
    }
    return v;
  };
  ASSIGN_OR_RETURN(c10::IValue root, load(path));
  if (!root.isGenericDict()) return damaged("is not a dict");
  c10::impl::GenericDict state = root.toGenericDict();
  auto field = [&](const char* key) -> absl::StatusOr<c10::IValue> {
    auto it = state.find(std::string(key));
    if (it == state.end()) return damaged(absl::StrCat("lacks '", key, "'"));
    return it->value();
  };
  ASSIGN_OR_RETURN(c10::IValue format, field("format"));
  ASSIGN_OR_RETURN(c10::IValue version, field("version"));
  if (!format.isString() || format.toStringRef() != kCheckpointFormat) {
    return damaged("is not a tracecut calibration checkpoint");
  }
  if (!version.isInt() || version.toInt() != kCheckpointVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", path, "' has version ",
                     version.isInt() ? absl::StrCat(version.toInt()) : "?",
                     "; this tracecut reads version ", kCheckpointVersion));
  }
  ASSIGN_OR_RETURN(c10::IValue identity, field("identity"));
  const std::string mine = RunIdentity();
  if (!identity.isString()) return damaged("has no run identity");
  if (identity.toStringRef() != mine) {
    std::vector<std::string> old_lines =
        absl::StrSplit(identity.toStringRef(), '\n');
    std::vector<std::string> new_lines = absl::StrSplit(mine, '\n');
    std::string diff;
    for (size_t k = 0; k < std::max(old_lines.size(), new_lines.size()); ++k) {
      std::string o = k < old_lines.size() ? old_lines[k] : "";
      std::string m = k < new_lines.size() ? new_lines[k] : "";
      if (o != m) {
        diff = absl::StrCat("it has '", o, "', this run '", m, "'");
        break;
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint in ", dir, " was made by a different run (",
                     diff, "); delete the directory or run without --resume"));
  }
  ASSIGN_OR_RETURN(c10::IValue next_v, field("next_subgraph"));
  const int n = static_cast<int>(steps_.size());
  if (!next_v.isInt() || next_v.toInt() < 0 || next_v.toInt() > n) {
    return damaged("has a bad next_subgraph");
  }
  const int next = static_cast<int>(next_v.toInt());

  ASSIGN_OR_RETURN(c10::IValue files, field("weight_files"));
  if (!files.isList()) return damaged("has a bad weight_files list");
  weight_files_.clear();
  for (const c10::IValue& f : files.toListRef()) {
    if (!f.isString()) return damaged("has a bad weight_files list");
    const std::string file = absl::StrCat(dir, "/", f.toStringRef());
    ASSIGN_OR_RETURN(c10::IValue weights, load(file));
    if (!weights.isGenericDict()) return damaged("has a bad weight file");
    for (const auto& e : weights.toGenericDict()) {
      if (!e.key().isString() || !e.value().isTensor()) {
        return damaged(absl::StrCat("has a bad entry in ", f.toStringRef()));
      }
      RETURN_IF_ERROR(
          ctx.UpdateTensor(e.key().toStringRef(), e.value().toTensor()));
    }
    weight_files_.push_back(f.toStringRef());
  }
  ctx.TakeUpdatedTensors();

  ASSIGN_OR_RETURN(c10::IValue results, field("results"));
  ASSIGN_OR_RETURN(results_, CalibrationResults::FromIValue(results));

  ASSIGN_OR_RETURN(c10::IValue mods, field("modifiers"));
  if (!mods.isGenericDict()) return damaged("has no modifier states");
  for (size_t k = 0; k < modifiers_.size(); ++k) {
    const std::string key = StateKey(k, *modifiers_[k]);
    auto it = mods.toGenericDict().find(key);
    if (it == mods.toGenericDict().end()) {
      return damaged(absl::StrCat("has no state for modifier '", key, "'"));
    }
    RETURN_IF_ERROR(modifiers_[k]->RestoreState(it->value()));
  }

  ASSIGN_OR_RETURN(c10::IValue cache, field("cache"));
  if (!cache.isList() || cache.toListRef().size() != data_.batches.size()) {
    return damaged("has a cache for a different number of batches");
  }
  int64_t b = 0;
  for (const c10::IValue& values : cache.toListRef()) {
    if (!values.isGenericDict()) return damaged("has a bad cache entry");
    for (const auto& e : values.toGenericDict()) {
      if (!e.key().isString()) return damaged("has a bad cache entry");
      RETURN_IF_ERROR(PutTracked(b, e.key().toStringRef(), e.value()));
    }
    ++b;
  }
  result_.resumed = true;
  result_.first_subgraph = next;
  progress_->Note(
      absl::StrFormat("resuming from %s after subgraph %d/%d", dir, next, n));
  return next;
}

absl::StatusOr<PipelineResult> PartitionedRun::Run() {
  c10::NoGradGuard no_grad;
  RETURN_IF_ERROR(Plan());
  if (options_.kind == PipelineKind::kLayerSequential) {
    RETURN_IF_ERROR(PlanLayerChain());
  }
  const int n = static_cast<int>(steps_.size());
  result_.num_subgraphs = n;
  results_.pipeline = std::string(PipelineKindName(options_.kind));
  const int64_t num_batches = static_cast<int64_t>(data_.batches.size());
  if (num_batches == 0) {
    return absl::InvalidArgumentError("no calibration batches");
  }
  RunContext ctx(&model_, &results_, num_batches, progress_);
  // Validation first: nothing is written before the modifiers accept the
  // model.
  RETURN_IF_ERROR(ForEachModifier(
      modifiers_, [&](Modifier* m) { return m->OnRunStart(ctx); }));
  HookDispatcher hooks(ctx, modifiers_);
  ASSIGN_OR_RETURN(IntermediatesCache cache,
                   IntermediatesCache::Create(options_.cache));
  cache_.emplace(std::move(cache));

  int start = 0;
  if (!options_.run_dir.empty()) {
    if (options_.resume) {
      ASSIGN_OR_RETURN(start, Restore(ctx));
    }
    RETURN_IF_ERROR(EnsureDir(options_.run_dir));
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
      "%s pipeline: %d subgraphs, %d calibration batches (%d samples x %d "
      "tokens)%s",
      PipelineKindName(options_.kind), n, num_batches, data_.num_samples,
      data_.seq_len, options_.propagate_error ? "" : ", no error propagation"));
  int64_t units = 0;
  for (int i = start; i < n; ++i) {
    units += num_batches + 1 + (options_.propagate_error ? num_batches : 0);
  }
  progress_->Begin(units);
  for (int i = start; i < n; ++i) {
    RETURN_IF_ERROR(RunStep(i, ctx, hooks));
    if (!options_.run_dir.empty()) RETURN_IF_ERROR(WriteCheckpoint(i + 1, ctx));
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
  RETURN_IF_ERROR(ForEachModifier(
      modifiers_, [&](Modifier* m) { return m->OnRunEnd(ctx); }));
  result_.cache = cache_->stats();
  progress_->Finish(absl::StrFormat("%s pipeline: %d subgraphs, %d batches",
                                    PipelineKindName(options_.kind), n,
                                    num_batches));
  return std::move(result_);
}

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
  RETURN_IF_ERROR(ForEachModifier(
      modifiers, [&](Modifier* m) { return m->OnRunStart(ctx); }));
  HookDispatcher hooks(ctx, modifiers);
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
  progress->Begin(num_batches + 1);
  SubgraphTiming timing;
  timing.label = info.label;
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
  hooks.Attach(interp, 0, experts.get());
  if (experts != nullptr) {
    experts->AttachCapture(interp);
    for (Interpreter* e : experts->expert_interpreters()) hooks.Attach(*e, 0);
  }
  for (int64_t b = 0; b < num_batches; ++b) {
    const std::string where =
        absl::StrFormat("whole model, calibrate batch %d: ", b);
    RETURN_IF_ERROR(CheckInterrupt());
    hooks.set_batch(b);
    absl::StatusOr<c10::IValue> out = interp.Run(data.batches[b]);
    if (!hooks.status().ok()) return hooks.status();
    if (!out.ok()) return Annotate(out.status(), where);
    if (experts != nullptr) {
      absl::Status all = experts->RunOnAllTokens();
      if (!hooks.status().ok()) return hooks.status();
      if (!all.ok()) return Annotate(all, where);
    }
    if (options.check_finite) {
      ASSIGN_OR_RETURN(std::string kind,
                       runtime::TorchCall(absl::StripSuffix(where, ": "),
                                          [&] { return NonFiniteKind(*out); }));
      if (!kind.empty()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "non-finite activation: the model's output in calibration batch "
            "%d has %s entries",
            b, kind));
      }
    }
    progress->Advance(1);
    progress->Update(point("calibrate", b + 1, num_batches));
  }
  progress->EndStep(point("calibrate", num_batches, num_batches));
  interp.ClearHooks();
  absl::Time t1 = absl::Now();
  timing.calibrate_seconds = absl::ToDoubleSeconds(t1 - t0);
  RETURN_IF_ERROR(ForEachModifier(
      modifiers, [&](Modifier* m) { return m->OnSubgraphEnd(ctx, info); }));
  progress->Advance(1);
  progress->EndStep(point("compress", 0, 0));
  timing.compress_seconds = absl::ToDoubleSeconds(absl::Now() - t1);
  results.subgraphs.push_back(timing);
  RETURN_IF_ERROR(ForEachModifier(
      modifiers, [&](Modifier* m) { return m->OnRunEnd(ctx); }));
  progress->Finish(
      absl::StrFormat("basic pipeline: whole model, %d batches", num_batches));
  return result;
}

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
    const PipelineOptions& options) {
  if (options.calibrate_all_experts) {
    // Checked on the whole model first: a pattern that finds no expert, or
    // an expert that cannot run on all tokens, fails before any work.
    ASSIGN_OR_RETURN(std::vector<ExpertRegion> experts,
                     FindExpertRegions(model.graph(), options.expert_pattern));
    if (experts.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "calibrate_all_experts: no module of the model matches the expert "
          "pattern '",
          options.expert_pattern,
          "' (set expert_modules in the recipe to the path pattern of the "
          "experts)"));
    }
  }
  if (options.kind == PipelineKind::kBasic) {
    return RunBasic(model, data, modifiers, results, options);
  }
  PartitionedRun run(model, data, modifiers, results, options);
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
