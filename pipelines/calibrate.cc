#include "pipelines/calibrate.h"

#include <caffe2/serialize/inline_container.h>
#include <dirent.h>
#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "pipelines/awq_modifier.h"
#include "pipelines/compressed_output.h"
#include "pipelines/distributed.h"
#include "pipelines/gptq_modifier.h"
#include "pipelines/interrupt.h"
#include "pipelines/observers.h"
#include "pipelines/recipe.h"
#include "pipelines/recipe_yaml.h"
#include "pipelines/report.h"
#include "pipelines/rtn_modifier.h"
#include "pipelines/smoothquant_modifier.h"
#include "pipelines/weight_stream.h"
#include "quantization/quant_args.h"
#include "runtime/device.h"
#include "runtime/finite.h"
#include "runtime/lowering.h"
#include "runtime/torch_status.h"
#include "tracer/hf/config.h"
#include "tracer/input_files.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/files.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

ModuleSelector Selector(
    const google::protobuf::RepeatedPtrField<std::string>& targets,
    const google::protobuf::RepeatedPtrField<std::string>& ignore) {
  ModuleSelector s;
  s.targets.assign(targets.begin(), targets.end());
  s.ignore.assign(ignore.begin(), ignore.end());
  return s;
}

// The embedded files of a TorchScript archive ("config.json", ...), read
// without loading the model again.
absl::StatusOr<torch::jit::ExtraFilesMap> ReadExtraFiles(
    const std::string& path) {
  return runtime::TorchCall(
      absl::StrCat("reading the extra files of '", path, "'"),
      [&]() -> torch::jit::ExtraFilesMap {
        caffe2::serialize::PyTorchStreamReader reader(path);
        torch::jit::ExtraFilesMap files;
        for (const std::string& record : reader.getAllRecords()) {
          if (!absl::StartsWith(record, "extra/")) continue;
          auto [data, size] = reader.getRecord(record);
          files[record.substr(6)] =
              std::string(static_cast<const char*>(data.get()), size);
        }
        return files;
      });
}

// What identifies the model file cheaply: size, modification time and a
// hash of its first and last MiB (hashing all of a large model would cost
// more than a checkpoint saves).
absl::StatusOr<std::string> ModelFileIdentity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot stat '", path, "'"));
  }
  std::ifstream in(path, std::ios::binary);
  constexpr int64_t kChunk = 1 << 20;
  const int64_t size = static_cast<int64_t>(st.st_size);
  std::string head(std::min(size, kChunk), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  std::string tail(std::min(size, kChunk), '\0');
  in.seekg(size - static_cast<int64_t>(tail.size()));
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  if (!in) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  return absl::StrFormat("%d bytes, mtime %d.%09d, %016x", size,
                         static_cast<int64_t>(st.st_mtim.tv_sec),
                         static_cast<int64_t>(st.st_mtim.tv_nsec),
                         util::Fnv1a64(tail, util::Fnv1a64(head)));
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

constexpr char kLockFile[] = "lock";
constexpr char kSpillDir[] = "spill";
// Where a streamed run writes its shards (CompressedTensorsWriter).
constexpr char kOutputDir[] = "output";

// Removes the spill files of the process `pid` from `dir` (named
// "tracecut-<pid>-..." by the intermediates cache), all of them when pid is
// 0, then `dir` if that left it empty.
void RemoveSpillFiles(const std::string& dir, int64_t pid) {
  const std::string prefix =
      pid == 0 ? "tracecut-" : absl::StrCat("tracecut-", pid, "-");
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      if (absl::StartsWith(e->d_name, prefix)) names.push_back(e->d_name);
    }
    ::closedir(d);
    for (const std::string& name : names) {
      std::remove(absl::StrCat(dir, "/", name).c_str());
    }
  }
  ::rmdir(dir.c_str());
}

// Removes the files a pipeline writes into a run directory, then the
// directory if it is empty (anything else in it is left alone).
void RemoveRunDir(const std::string& dir) {
  RemoveSpillFiles(absl::StrCat(dir, "/", kSpillDir), 0);
  std::error_code ec;
  std::filesystem::remove_all(absl::StrCat(dir, "/", kOutputDir), ec);
  std::remove(absl::StrCat(dir, "/", kLockFile).c_str());
  if (DIR* d = ::opendir(dir.c_str())) {
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      // With the temporaries of a run killed while writing one of them
      // (util::WriteFileAtomically's ".state.pt.tmp.XXXXXX").
      absl::string_view file = absl::StripPrefix(name, ".");
      if (absl::StartsWith(file, "state.pt") ||
          absl::StartsWith(file, "weights-")) {
        names.push_back(name);
      }
    }
    ::closedir(d);
    for (const std::string& name : names) {
      std::remove(absl::StrCat(dir, "/", name).c_str());
    }
  }
  ::rmdir(dir.c_str());
}

// An advisory lock (flock) on RUN_DIR/lock for the whole run: one run per
// output. The file holds the owner's pid; the kernel drops the lock when the
// owner dies, however it dies, so a lock that can be taken is never stale.
class RunDirLock {
 public:
  // Creates `dir` if missing. FAILED_PRECONDITION naming the holder's pid
  // when another process holds the lock. `previous_pid` is the pid a dead
  // earlier run left in the file (0: none): its leftovers can go.
  static absl::StatusOr<std::unique_ptr<RunDirLock>> Acquire(
      const std::string& dir, absl::string_view output, int64_t* previous_pid) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return util::ErrnoError(
          errno, absl::StrCat("cannot create the run directory ", dir));
    }
    const std::string path = absl::StrCat(dir, "/", kLockFile);
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return util::ErrnoError(errno, absl::StrCat("cannot open ", path));
    }
    char buf[32] = {};
    ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    int64_t pid = 0;
    if (n > 0) {
      (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(buf), &pid);
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) {
        return absl::FailedPreconditionError(absl::StrCat(
            "another tracecut run (pid ", pid, ") is writing ", output,
            " (it holds ", path,
            "); wait for it to finish or choose another -o / --run-dir"));
      }
      return util::ErrnoError(err, absl::StrCat("cannot lock ", path));
    }
    *previous_pid = pid;
    const std::string mine = absl::StrCat(::getpid(), "\n");
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, mine.data(), mine.size(), 0) !=
                                       static_cast<ssize_t>(mine.size())) {
      const int err = errno;
      ::close(fd);
      return util::ErrnoError(err, absl::StrCat("cannot write ", path));
    }
    return std::unique_ptr<RunDirLock>(new RunDirLock(fd));
  }
  ~RunDirLock() { ::close(fd_); }

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  int fd_;
};

// Note [Data-parallel checkpoints]
// Each rank of a data-parallel run checkpoints its own pipeline (its shard
// of the data, its modifiers' state) into RUN_DIR/rank-R-of-N, keeping its
// last two states; before each checkpoint the ranks meet at a barrier, and
// on --resume they all continue after the newest subgraph every one of them
// has checkpointed (AgreeOnResumePoint), so a rank that got further re-runs
// a subgraph and the output is byte-identical to an uninterrupted run of
// the same world size. A checkpoint of another world size (or of one
// process, which keeps state.pt in RUN_DIR itself) is refused: the shards,
// and so every rank's state, depend on the world size.

std::string RankDirName(int rank, int world_size) {
  return absl::StrCat("rank-", rank, "-of-", world_size);
}

// Whether `dir` holds a pipeline checkpoint (state.pt, or a rank's kept
// state.pt.NNNNN).
bool HasCheckpoint(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    bool found = false;
    while (dirent* e = ::readdir(d)) {
      if (absl::StartsWith(e->d_name, "state.pt")) found = true;
    }
    ::closedir(d);
    return found;
  }
  return false;
}

// The world size of the checkpoints in `run_dir` other than `world_size`
// (1: one process's state.pt), or 0 when there are none.
int OtherCheckpointWorldSize(const std::string& run_dir, int world_size) {
  if (world_size != 1 &&
      ::access(absl::StrCat(run_dir, "/state.pt").c_str(), F_OK) == 0) {
    return 1;
  }
  int other = 0;
  if (DIR* d = ::opendir(run_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      absl::string_view name(e->d_name);
      if (!absl::ConsumePrefix(&name, "rank-")) continue;
      std::vector<absl::string_view> parts = absl::StrSplit(name, "-of-");
      int rank = 0, world = 0;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rank) ||
          !absl::SimpleAtoi(parts[1], &world) || world == world_size) {
        continue;
      }
      if (HasCheckpoint(absl::StrCat(run_dir, "/", e->d_name))) other = world;
    }
    ::closedir(d);
  }
  return other;
}

std::string WorldDescription(int world_size) {
  return world_size == 1 ? "1 (one process)" : absl::StrCat(world_size);
}

// Implements the pipeline's checkpoint synchronisation over `collective`.
class CollectiveCheckpointGroup : public CheckpointGroup {
 public:
  explicit CollectiveCheckpointGroup(Collective& collective)
      : collective_(collective) {}
  absl::StatusOr<int> AgreeOnResume(const std::vector<int>& kept) override {
    return AgreeOnResumePoint(collective_, kept);
  }
  absl::Status BeforeCheckpoint(int i) override {
    return collective_.Barrier(
        absl::StrCat("the checkpoint after subgraph ", i));
  }

 private:
  Collective& collective_;
};

PipelineKind KindFromRecipe(recipe::Recipe::Pipeline p) {
  switch (p) {
    case recipe::Recipe::BASIC:
      return PipelineKind::kBasic;
    case recipe::Recipe::LAYER_SEQUENTIAL:
      return PipelineKind::kLayerSequential;
    default:
      return PipelineKind::kSequential;
  }
}

recipe::Recipe::Pipeline RecipeKind(PipelineKind kind) {
  switch (kind) {
    case PipelineKind::kBasic:
      return recipe::Recipe::BASIC;
    case PipelineKind::kLayerSequential:
      return recipe::Recipe::LAYER_SEQUENTIAL;
    default:
      return recipe::Recipe::SEQUENTIAL;
  }
}

std::string RecipeText(const recipe::Recipe& recipe) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  printer.PrintToString(recipe, &text);
  return text;
}

// AWQ's options: its own, and the scheme and modules of the gptq or rtn
// modifier after it (recipe.cc checks there is one).
absl::StatusOr<AwqOptions> AwqOptionsOf(const recipe::Recipe& recipe,
                                        int index) {
  const recipe::AwqModifier& a = recipe.modifiers(index).awq();
  AwqOptions o;
  for (const recipe::AwqModifier::Mapping& mapping : a.mappings()) {
    o.mappings.push_back(
        {mapping.smooth_layer(),
         {mapping.balance_layers().begin(), mapping.balance_layers().end()}});
  }
  o.duo_scaling =
      a.duo_scaling() == recipe::AwqModifier::OFF    ? AwqDuoScaling::kOff
      : a.duo_scaling() == recipe::AwqModifier::BOTH ? AwqDuoScaling::kBoth
                                                     : AwqDuoScaling::kOn;
  o.n_grid = a.n_grid();
  // The scheme and modules searched for: AWQ's own, or those of the next
  // gptq / rtn modifier.
  int from = index;
  if (!a.has_scheme()) {
    do {
      ++from;
    } while (from < recipe.modifiers_size() &&
             !recipe.modifiers(from).has_gptq() &&
             !recipe.modifiers(from).has_rtn());
    if (from == recipe.modifiers_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("recipe: modifiers[", index,
                       "].awq is not followed by a gptq or rtn modifier"));
    }
  }
  const recipe::Modifier& m = recipe.modifiers(from);
  const recipe::QuantizationScheme& s = m.has_gptq()  ? m.gptq().scheme()
                                        : m.has_rtn() ? m.rtn().scheme()
                                                      : a.scheme();
  o.quantized = m.has_gptq()  ? Selector(m.gptq().targets(), m.gptq().ignore())
                : m.has_rtn() ? Selector(m.rtn().targets(), m.rtn().ignore())
                              : Selector(a.targets(), a.ignore());
  if (o.quantized.targets.empty()) o.quantized.targets = {"Linear"};
  // The quantizer's scheme as compressed-tensors' args: the grid AWQ's
  // search quantizes on (llm-compressor's).
  if (IsTypedScheme(s)) {
    ASSIGN_OR_RETURN(quantization::QuantizationScheme typed,
                     ToTypedScheme(s, o.quantized.targets));
    o.weights = *typed.weights;
    return o;
  }
  quantization::QuantizationArgs& w = o.weights;
  w.num_bits = s.bits();
  w.type = quantization::QuantType::kInt;
  w.symmetric = s.symmetric();
  if (s.per_tensor()) {
    w.strategy = quantization::Strategy::kTensor;
  } else if (s.group_size() > 0) {
    w.strategy = quantization::Strategy::kGroup;
    w.group_size = s.group_size();
  } else {
    w.strategy = quantization::Strategy::kChannel;
  }
  RETURN_IF_ERROR(w.Resolve(absl::StrCat("recipe: modifiers[", from, "]")));
  return o;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Modifier>>> BuildModifiers(
    const recipe::Recipe& recipe, Collective* collective, bool whole_groups) {
  std::vector<std::unique_ptr<Modifier>> out;
  for (int i = 0; i < recipe.modifiers_size(); ++i) {
    const recipe::Modifier& m = recipe.modifiers(i);
    if (m.has_gptq()) {
      const recipe::GptqModifier& g = m.gptq();
      GptqModifierOptions o;
      o.weights.modules = Selector(g.targets(), g.ignore());
      if (IsTypedScheme(g.scheme())) {
        ASSIGN_OR_RETURN(o.weights.typed,
                         ToTypedScheme(g.scheme(), o.weights.modules.targets));
        quantization::ActOrder& a = o.weights.typed->weights->actorder;
        a = ResolveActOrder(g, a);
      } else {
        o.weights.scheme = ToQuantScheme(g.scheme());
      }
      if (g.has_kv_cache_scheme()) {
        ASSIGN_OR_RETURN(o.weights.kv_cache,
                         ToKvCacheArgs(g.kv_cache_scheme()));
      }
      o.dampening_frac = g.dampening_frac();
      o.block_size = g.block_size();
      o.act_order = g.actorder();
      o.static_groups = g.static_groups();
      o.weights.collective = collective;
      o.weights.all_expert_tokens = recipe.calibrate_all_experts();
      o.weights.whole_groups = whole_groups;
      out.push_back(std::make_unique<GptqModifier>(std::move(o)));
    } else if (m.has_rtn()) {
      const recipe::RtnModifier& r = m.rtn();
      WeightQuantOptions o;
      o.modules = Selector(r.targets(), r.ignore());
      if (IsTypedScheme(r.scheme())) {
        ASSIGN_OR_RETURN(o.typed, ToTypedScheme(r.scheme(), o.modules.targets));
      } else {
        o.scheme = ToQuantScheme(r.scheme());
      }
      if (r.has_kv_cache_scheme()) {
        ASSIGN_OR_RETURN(o.kv_cache, ToKvCacheArgs(r.kv_cache_scheme()));
      }
      o.collective = collective;
      o.all_expert_tokens = recipe.calibrate_all_experts();
      o.whole_groups = whole_groups;
      out.push_back(std::make_unique<RtnModifier>(std::move(o)));
    } else if (m.has_observer()) {
      const recipe::ObserverModifier& r = m.observer();
      ObserverOptions o;
      o.modules = Selector(r.targets(), r.ignore());
      o.scheme = ToQuantScheme(r.scheme());
      o.averaging_constant = r.averaging_constant();
      o.collective = collective;
      o.kind = r.kind() == recipe::ObserverModifier::MOVING_AVERAGE
                   ? ObserverKind::kMovingAverageMinMax
                   : ObserverKind::kMinMax;
      switch (r.observe()) {
        case recipe::ObserverModifier::WEIGHT:
          o.observe = ObservedTensor::kWeight;
          break;
        case recipe::ObserverModifier::OUTPUT_ACTIVATIONS:
          o.observe = ObservedTensor::kOutput;
          break;
        default:
          o.observe = ObservedTensor::kInput;
          break;
      }
      out.push_back(std::make_unique<Observer>(std::move(o)));
    } else if (m.has_smoothquant()) {
      const recipe::SmoothQuantModifier& q = m.smoothquant();
      SmoothQuantOptions o;
      o.smoothing_strength = q.smoothing_strength();
      for (const recipe::SmoothQuantModifier::Mapping& mapping : q.mappings()) {
        o.mappings.push_back(
            {{mapping.balance_layers().begin(), mapping.balance_layers().end()},
             mapping.smooth_layer()});
      }
      o.ignore.assign(q.ignore().begin(), q.ignore().end());
      o.collective = collective;
      out.push_back(std::make_unique<SmoothQuantModifier>(std::move(o)));
    } else if (m.has_awq()) {
      ASSIGN_OR_RETURN(AwqOptions o, AwqOptionsOf(recipe, i));
      o.collective = collective;
      out.push_back(std::make_unique<AwqModifier>(std::move(o)));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "recipe: modifiers[", i,
          "] names no modifier (awq, gptq, observer, rtn or smoothquant)"));
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError("recipe: no modifiers");
  }
  return out;
}

std::vector<std::string> ModelInputNames(const runtime::GraphModule& model) {
  std::vector<std::string> names;
  for (const ir::Node* p : model.graph().placeholders()) {
    names.push_back(p->target());
  }
  return names;
}

absl::StatusOr<LoadedForCalibration> LoadForCalibration(
    const std::string& model_path, const ExampleInputOptions& example_inputs,
    bool defer_checkpoint_tensors) {
  tracer::LoadOptions load;
  load.defer_checkpoint_tensors = defer_checkpoint_tensors;
  ASSIGN_OR_RETURN(tracer::LoadedModel loaded,
                   tracer::LoadModel(model_path, load));
  tracer::TraceOptions base;
  base.input_specs = example_inputs.input_specs;
  base.config_path = example_inputs.config_path;
  if (!example_inputs.example_inputs_path.empty()) {
    ASSIGN_OR_RETURN(base.example_inputs,
                     tracer::ReadExampleInputs(
                         example_inputs.example_inputs_path, loaded.module));
  }
  ASSIGN_OR_RETURN(tracer::TraceOptions options,
                   tracer::WithModelFiles(loaded, std::move(base)));
  absl::StatusOr<runtime::GraphModule> gm =
      tracer::Trace(loaded.module, options);
  if (!gm.ok()) return tracer::TraceErrorOf(model_path, gm.status());
  LoadedForCalibration out{std::move(*gm)};
  out.file = loaded.path;
  out.deferred = std::move(loaded.deferred);
  out.checkpoint_dir = std::move(loaded.checkpoint_dir);
  if (loaded.from_torch_export) {
    // A .pt2 (or a directory holding one): the files LoadModel read.
    out.model.mutable_extra_files() = loaded.extra_files;
  } else {
    ASSIGN_OR_RETURN(out.model.mutable_extra_files(),
                     ReadExtraFiles(model_path));
  }
  if (!options.config_path.empty() && options.config.has_value()) {
    out.model.mutable_extra_files()[tracer::kConfigJson] =
        options.config->text();
  }
  if (options.config.has_value()) {
    const tracer::hf::HfConfig& config = *options.config;
    ASSIGN_OR_RETURN(out.vocab_size, config.FindInt("vocab_size"));
    ASSIGN_OR_RETURN(out.max_positions,
                     config.FindInt("max_position_embeddings"));
    tracer::hf::HfDefaults defaults = tracer::hf::DefaultsFor(config);
    out.default_targets = defaults.sequential_targets;
    out.model_type = config.model_type();
  }
  return out;
}

ModelInputs CalibrationInputsOf(const LoadedForCalibration& loaded) {
  ModelInputs out;
  for (const ir::Node* p : loaded.model.graph().placeholders()) {
    ModelInput in;
    in.name = p->target();
    if (p->meta().outputs.size() == 1) {
      in.dtype = p->meta().outputs[0].dtype;
      in.shape = p->meta().outputs[0].shape;
    }
    out.inputs.push_back(std::move(in));
  }
  out.limits.vocab_size = loaded.vocab_size;
  out.limits.max_seq_len = loaded.max_positions;
  return out;
}

absl::StatusOr<CalibrateOutcome> Calibrate(const CalibrateOptions& options) {
  if (options.output_path.empty()) {
    return absl::InvalidArgumentError("no output path (-o OUT.pt)");
  }
  if (options.data_path.empty() == (options.synthetic_samples <= 0)) {
    return absl::InvalidArgumentError(
        "give exactly one of --data=FILE and --synthetic=N");
  }
  const bool extras_only =
      options.recipe.modifiers_size() == 0 && !options.extra_modifiers.empty();
  if (!extras_only) {
    RETURN_IF_ERROR(ValidateRecipe(options.recipe, options.recipe_source));
  }
  Progress silent = Progress::Silent();
  Progress* progress = options.progress != nullptr ? options.progress : &silent;

  const PipelineKind kind =
      options.pipeline.value_or(KindFromRecipe(options.recipe.pipeline()));
  const bool want_stream =
      options.stream_weights &&
      options.output_format ==
          CalibrateOptions::OutputFormat::kCompressedTensors &&
      kind != PipelineKind::kBasic && IsDirectory(options.model_path);
  ASSIGN_OR_RETURN(LoadedForCalibration loaded,
                   LoadForCalibration(options.model_path,
                                      options.example_inputs, want_stream));
  runtime::GraphModule& gm = loaded.model;
  const bool streaming = !loaded.deferred.empty();
  // All of every weight, not only what the data will touch: a NaN in an
  // embedding row no sample uses would otherwise be copied into the output.
  // Streamed weights are checked as they are read.
  std::set<std::string> deferred;
  for (const auto& [path, d] : loaded.deferred) deferred.insert(path);
  RETURN_IF_ERROR(
      runtime::CheckModuleFinite(gm.module(), loaded.file, deferred));
  // A SIGINT / SIGTERM while loading (one LibTorch call) ends the run here,
  // before the data is prepared.
  RETURN_IF_ERROR(CheckInterrupt());

  // Data.
  CalibrationData data;
  if (!options.data_path.empty()) {
    ASSIGN_OR_RETURN(data, LoadCalibrationData(options.data_path,
                                               CalibrationInputsOf(loaded),
                                               options.batch_size));
  } else {
    if (!loaded.vocab_size.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--synthetic needs the model's vocab_size, but ",
          options.example_inputs.config_path.empty()
              ? absl::StrCat(options.model_path, " has no config.json with one")
              : absl::StrCat(options.example_inputs.config_path,
                             " has no \"vocab_size\""),
          "; use --data=FILE"));
    }
    ASSIGN_OR_RETURN(
        at::Tensor tokens,
        SyntheticTokens(options.synthetic_samples, options.synthetic_seq_len,
                        *loaded.vocab_size, options.seed));
    std::string source = absl::StrFormat(
        "synthetic (%d samples of %d tokens, seed %d)",
        options.synthetic_samples, options.synthetic_seq_len, options.seed);
    TokenLimits limits;
    limits.vocab_size = loaded.vocab_size;
    limits.max_seq_len = loaded.max_positions;
    RETURN_IF_ERROR(CheckTokens(tokens, limits, source));
    ASSIGN_OR_RETURN(data, MakeCalibrationData(tokens, ModelInputNames(gm),
                                               options.batch_size, source));
  }

  RETURN_IF_ERROR(CheckInterrupt());

  // The recipe with the flag the modifiers read too: one value for both.
  recipe::Recipe r = options.recipe;
  if (options.calibrate_all_experts.has_value()) {
    r.set_calibrate_all_experts(*options.calibrate_all_experts);
  }
  std::vector<std::unique_ptr<Modifier>> owned;
  if (!extras_only) {
    ASSIGN_OR_RETURN(
        owned,
        BuildModifiers(r, options.collective,
                       options.output_format ==
                           CalibrateOptions::OutputFormat::kCompressedTensors));
  }
  std::vector<Modifier*> modifiers;
  for (const auto& m : owned) modifiers.push_back(m.get());
  for (Modifier* m : options.extra_modifiers) {
    if (m == nullptr)
      return absl::InvalidArgumentError("a null extra modifier");
    modifiers.push_back(m);
  }

  // Pipeline options.
  PipelineOptions p;
  p.kind = kind;
  p.propagate_error = options.propagate_error.value_or(r.propagate_error());
  std::vector<std::string> targets = options.sequential_targets;
  if (targets.empty())
    targets.assign(r.sequential_targets().begin(),
                   r.sequential_targets().end());
  if (targets.empty()) targets = loaded.default_targets;
  if (targets.empty() && p.kind != PipelineKind::kBasic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no sequential targets: the recipe names none and ",
        loaded.model_type.empty()
            ? absl::StrCat(options.model_path, " has no config.json")
            : absl::StrCat("model type '", loaded.model_type,
                           "' has no default"),
        "; set sequential_targets in the recipe (e.g. \"LlamaDecoderLayer\") "
        "or use the basic pipeline"));
  }
  p.partition.targets = targets;
  // The recipe.yaml of a compressed-tensors output: the recipe as this run
  // applies it (flags and defaults filled in). Modifiers of the caller's own
  // have no llm-compressor form, so an output with any gets none.
  std::string recipe_yaml;
  if (options.output_format ==
          CalibrateOptions::OutputFormat::kCompressedTensors &&
      options.extra_modifiers.empty()) {
    recipe::Recipe applied = r;
    applied.set_pipeline(RecipeKind(p.kind));
    applied.set_propagate_error(p.propagate_error);
    applied.clear_sequential_targets();
    if (p.kind != PipelineKind::kBasic) {
      for (const std::string& t : targets) applied.add_sequential_targets(t);
    }
    absl::StatusOr<std::string> yaml = RecipeToYaml(applied);
    if (!yaml.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.recipe_source,
                       ": cannot be written as the output's recipe.yaml: ",
                       yaml.status().message()));
    }
    recipe_yaml = std::move(*yaml);
  }
  p.calibrate_all_experts = r.calibrate_all_experts();
  if (r.has_expert_modules()) p.expert_pattern = r.expert_modules();
  if (r.has_cache()) {
    ASSIGN_OR_RETURN(p.cache.offload_device,
                     runtime::TorchCall("recipe cache.offload_device", [&] {
                       return c10::Device(r.cache().offload_device());
                     }));
    p.cache.memory_budget_bytes = r.cache().memory_budget_bytes();
    p.cache.spill_dir = r.cache().spill_dir();
  }
  p.run_dir =
      options.run_dir.empty() ? options.output_path + ".run" : options.run_dir;
  p.resume = options.resume;
  p.stop_after_subgraph = options.stop_after_subgraph;
  p.progress = progress;
  p.device = options.device;
  ASSIGN_OR_RETURN(std::string model_identity, ModelFileIdentity(loaded.file));
  p.fingerprint = absl::StrCat(
      "model ", model_identity, "; recipe ",
      absl::StrFormat("%016x", util::Fnv1a64(RecipeText(r))), "; targets ",
      absl::StrJoin(targets, ","),
      p.calibrate_all_experts ? absl::StrCat("; all experts ", p.expert_pattern)
                              : "",
      streaming ? "; weights streamed" : "",
      // Another device computes other bits: a checkpoint continues only on
      // the kind of device that began it.
      options.device.is_cpu()
          ? ""
          : absl::StrCat("; device ",
                         c10::DeviceTypeName(options.device.type(),
                                             /*lower_case=*/true)));

  const bool distributed =
      options.collective != nullptr && options.collective->distributed();
  if (distributed && !options.device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        "--device=", runtime::DeviceName(options.device),
        ": data-parallel runs compute on the CPU only (one GPU per rank over "
        "NCCL is not built yet); run one process on the GPU, or the ranks "
        "on the CPU"));
  }
  const int rank = distributed ? options.collective->rank() : 0;
  const int world_size = distributed ? options.collective->world_size() : 1;
  const bool partitioned = p.kind != PipelineKind::kBasic;
  // The run directory OUT.run (or --run-dir); a rank's checkpoints go into
  // its own directory under it (Note [Data-parallel checkpoints]).
  const std::string base_run_dir = p.run_dir;
  CalibrationData shard;
  std::unique_ptr<CollectiveCheckpointGroup> group;
  if (distributed) {
    ASSIGN_OR_RETURN(shard, ShardCalibrationData(data, rank, world_size));
    if (partitioned) {
      p.run_dir =
          absl::StrCat(base_run_dir, "/", RankDirName(rank, world_size));
      p.fingerprint += absl::StrCat("; rank ", rank, " of ", world_size);
      group = std::make_unique<CollectiveCheckpointGroup>(*options.collective);
      p.checkpoint_group = group.get();
    }
  }
  if (partitioned && options.resume) {
    const int other = OtherCheckpointWorldSize(base_run_dir, world_size);
    if (other != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot resume: the checkpoint in ", base_run_dir,
          " was made with world size ", WorldDescription(other),
          ", this run has world size ", WorldDescription(world_size),
          "; resume with ",
          other == 1 ? "no --nproc-per-node (and no WORLD_SIZE)"
                     : absl::StrCat("--nproc-per-node=", other,
                                    " (or WORLD_SIZE=", other, ")"),
          ", or delete ", base_run_dir, " to start afresh"));
    }
  }

  // A run directory this run creates is removed again if the run fails;
  // in one it did not create, only the lock and spill files it made go. A
  // data-parallel rank also keeps a checkpoint when it fails (another rank
  // died): the run continues with --resume.
  const bool base_existed = !partitioned || IsDirectory(base_run_dir);
  const bool run_dir_existed = !partitioned || IsDirectory(p.run_dir);
  bool succeeded = false;
  bool stopped = false;  // Or interrupted with a checkpoint to resume from.
  std::unique_ptr<RunDirLock> lock;
  auto remove_rank_run_dir = [&] {
    RemoveRunDir(p.run_dir);
    if (distributed) ::rmdir(base_run_dir.c_str());  // When the last is out.
  };
  absl::Cleanup cleanup = [&] {
    if (succeeded || stopped || !partitioned) return;
    if (!run_dir_existed) {
      RemoveRunDir(p.run_dir);
      if (!base_existed) ::rmdir(base_run_dir.c_str());
    } else if (lock != nullptr) {
      RemoveSpillFiles(absl::StrCat(p.run_dir, "/", kSpillDir), ::getpid());
      std::remove(absl::StrCat(p.run_dir, "/", kLockFile).c_str());
    }
  };
  if (partitioned) {
    if (distributed) RETURN_IF_ERROR(util::MakeDirs(base_run_dir));
    int64_t previous_pid = 0;
    ASSIGN_OR_RETURN(lock, RunDirLock::Acquire(p.run_dir, options.output_path,
                                               &previous_pid));
    // Spill files go under the run directory (unless the recipe says
    // where), so the leftovers of a run killed with SIGKILL are found and
    // removed here by the next run on the same output.
    const std::string own_spill = absl::StrCat(p.run_dir, "/", kSpillDir);
    if (p.cache.spill_dir.empty()) p.cache.spill_dir = own_spill;
    RemoveSpillFiles(own_spill, 0);
    if (previous_pid != 0 && p.cache.spill_dir != own_spill) {
      RemoveSpillFiles(p.cache.spill_dir, previous_pid);
    }
  }

  // Streaming: shards are written into the run directory as subgraphs
  // finish (kept for --resume) and the directory is renamed onto OUT_DIR.
  std::unique_ptr<CompressedTensorsWriter> writer;
  std::unique_ptr<WeightStream> stream;
  CompressedOutputOptions out_options;
  out_options.output_dir = options.output_path;
  out_options.recipe_yaml = std::move(recipe_yaml);
  if (IsDirectory(options.model_path))
    out_options.source_dir = options.model_path;
  if (streaming) {
    out_options.source_dir = loaded.checkpoint_dir;
    // Only rank 0 writes; the other ranks release their weights unwritten
    // (every rank holds the same final weights: owners broadcast them).
    if (rank == 0) {
      ASSIGN_OR_RETURN(writer, CompressedTensorsWriter::Create(
                                   out_options, gm.extra_files(),
                                   absl::StrCat(p.run_dir, "/", kOutputDir)));
    }
    ASSIGN_OR_RETURN(
        stream, WeightStream::Create(gm, loaded.deferred, loaded.checkpoint_dir,
                                     writer.get()));
    p.weights = stream.get();
    progress->Note(absl::StrCat(
        "streaming weights from ", loaded.checkpoint_dir, " (",
        loaded.deferred.size(), " tensors, read when their subgraph runs)"));
  }

  CalibrateOutcome outcome;
  outcome.targets = targets;
  outcome.num_batches = static_cast<int64_t>(data.batches.size());
  absl::StatusOr<PipelineResult> piped = RunPipeline(
      gm, distributed ? shard : data, modifiers, outcome.results, p);
  // Interrupted, out of memory, or (data-parallel) another rank lost: the
  // subgraphs done so far need not be redone (after freeing memory, with a
  // smaller cache budget, or once every rank runs again).
  auto keep_checkpoint = [&](const absl::Status& status) {
    if ((absl::IsCancelled(status) || absl::IsResourceExhausted(status) ||
         (distributed && absl::IsUnavailable(status))) &&
        partitioned && HasCheckpoint(p.run_dir)) {
      stopped = true;
      return absl::Status(
          status.code(),
          absl::StrCat(status.message(), "; the checkpoint in ", base_run_dir,
                       " is kept: rerun the same command with --resume to "
                       "continue"));
    }
    return status;
  };
  if (!piped.ok()) return keep_checkpoint(piped.status());
  outcome.pipeline = std::move(*piped);
  if (outcome.pipeline.stopped) {
    stopped = true;
    outcome.stopped = true;
    return outcome;
  }

  if (streaming) {
    // Each shard's parameters were checked as it was written.
    RETURN_IF_ERROR(stream->WriteRest(outcome.results));
    outcome.streamed_peak_weight_bytes = stream->peak_loaded_bytes();
  } else {
    RETURN_IF_ERROR(CheckQuantResultsFinite(outcome.results, gm));
  }
  if (distributed) {
    // Every rank finished: only then does rank 0 write, and only rank 0.
    RETURN_IF_ERROR(
        keep_checkpoint(options.collective->Barrier("the end of calibration")));
    if (rank != 0) {
      // The checkpoints stay until rank 0 has written the output.
      RETURN_IF_ERROR(keep_checkpoint(
          options.collective->Barrier("rank 0 writing the output")));
      succeeded = true;
      if (!options.keep_run_dir && partitioned) remove_rank_run_dir();
      if (!streaming) outcome.model.emplace(std::move(gm));
      return outcome;
    }
  }
  if (!streaming) RETURN_IF_ERROR(ExportQuantParams(outcome.results, gm));
  ReportInfo info;
  info.model = options.model_path;
  info.recipe = options.recipe_source;
  info.recipe_text = RecipeText(r);
  info.streamed_peak_weight_bytes = outcome.streamed_peak_weight_bytes;
  info.pipeline = std::string(PipelineKindName(p.kind));
  info.propagate_error = p.propagate_error;
  info.sequential_targets =
      p.kind == PipelineKind::kBasic ? std::vector<std::string>() : targets;
  info.data_source = data.source;
  info.data_inputs = data.descriptions;
  info.samples = data.num_samples;
  info.seq_len = data.seq_len;
  info.batches = static_cast<int64_t>(data.batches.size());
  info.data_fingerprint = data.fingerprint;
  info.include_run_section = options.report_run_section;
  info.device = runtime::DeviceName(options.device);
  outcome.report = BuildReport(info, outcome.results, &outcome.pipeline);

  // The report goes next to its destination first, the model is saved, and
  // only then is the report renamed into place: no report without a model,
  // and a report that cannot be written fails before the model is saved.
  // (util::WriteFileAtomically straight to report_path would give up the
  // second.)
  std::string report_tmp;
  if (!options.report_path.empty()) {
    report_tmp = absl::StrCat(options.report_path, ".tmp.", getpid());
    RETURN_IF_ERROR(util::WriteFileAtomically(
        report_tmp, util::DumpJson(outcome.report, 2) + "\n"));
  }
  absl::Status saved;
  if (streaming) {
    saved = writer->Finish(outcome.results);
  } else if (options.output_format ==
             CalibrateOptions::OutputFormat::kCompressedTensors) {
    saved = WriteCompressedTensors(gm, outcome.results, out_options);
  } else {
    saved = runtime::SaveTorchScript(gm, options.output_path);
  }
  if (!saved.ok()) {
    if (!report_tmp.empty()) std::remove(report_tmp.c_str());
    return saved;
  }
  if (!report_tmp.empty() &&
      std::rename(report_tmp.c_str(), options.report_path.c_str()) != 0) {
    const int err = errno;
    std::remove(report_tmp.c_str());
    return util::ErrnoError(
        err, absl::StrCat("cannot write report '", options.report_path, "'"));
  }
  succeeded = true;
  if (distributed) {
    // The output is complete whatever this says: a rank that fails here
    // only keeps its checkpoint.
    (void)options.collective->Barrier("rank 0 writing the output");
  }
  if (!options.keep_run_dir && partitioned) remove_rank_run_dir();
  if (!streaming) outcome.model.emplace(std::move(gm));
  return outcome;
}

}  // namespace tracecut::pipelines
