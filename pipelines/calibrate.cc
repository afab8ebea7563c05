#include "pipelines/calibrate.h"

#include <google/protobuf/text_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "output/compressed_output.h"
#include "output/output_writer.h"
#include "pipelines/interrupt.h"
#include "pipelines/recipe.h"
#include "pipelines/recipe_yaml.h"
#include "pipelines/report.h"
#include "pipelines/run_dir.h"
#include "pipelines/weight_stream.h"
#include "runtime/collective.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/finite.h"
#include "runtime/torch_status.h"
#include "util/files.h"
#include "util/hash.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CheckQuantResultsFinite;
using ::tracecut::modifiers::ExportQuantParams;
using ::tracecut::modifiers::Modifier;
using ::tracecut::output::CompressedOutputOptions;
using ::tracecut::output::CompressedTensorsWriter;
using ::tracecut::runtime::AgreeOnResumePoint;
using ::tracecut::runtime::Collective;
using ::tracecut::util::Progress;
namespace {

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

// A model built from a checkpoint directory (tracer/native_model.h): its
// config.json and safetensors files, in name order.
absl::StatusOr<std::string> ModelIdentity(const std::string& path) {
  if (!IsDirectory(path)) return ModelFileIdentity(path);
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "config.json" || absl::EndsWith(name, ".safetensors") ||
        absl::EndsWith(name, ".safetensors.index.json")) {
      files.push_back(name);
    }
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("cannot list '", path, "': ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  std::string identity;
  for (const std::string& name : files) {
    ASSIGN_OR_RETURN(std::string id,
                     ModelFileIdentity(absl::StrCat(path, "/", name)));
    absl::StrAppend(&identity, name, ": ", id, "; ");
  }
  return identity;
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

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Modifier>>> BuildModifiers(
    const recipe::Recipe& recipe, Collective* collective, bool whole_groups) {
  std::vector<std::unique_ptr<Modifier>> out;
  modifiers::RecipeContext context = ContextOf(recipe);
  context.collective = collective;
  context.whole_groups = whole_groups;
  for (int i = 0; i < recipe.modifiers_size(); ++i) {
    if (EntryField(recipe.modifiers(i)) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recipe: modifiers[", i, "] names no modifier (", EntryNames(), ")"));
    }
    context.index = i;
    const google::protobuf::Message& entry = *context.entries[i];
    const modifiers::ModifierType* type =
        modifiers::FindModifierType(entry.GetDescriptor());
    if (type == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recipe: modifiers[", i, "]: no modifier is registered for ",
          entry.GetDescriptor()->full_name()));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Modifier> m, type->build(entry, context));
    out.push_back(std::move(m));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError("recipe: no modifiers");
  }
  return out;
}

namespace {

// The calibration data: --data's file, or --synthetic's seeded tokens.
absl::StatusOr<CalibrationData> PrepareData(
    const CalibrateOptions& options, const LoadedForCalibration& loaded) {
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
    limits.seq_lens = loaded.seq_lens;
    limits.program = loaded.file;
    RETURN_IF_ERROR(CheckTokens(tokens, limits, source));
    ASSIGN_OR_RETURN(data,
                     MakeCalibrationData(tokens, ModelInputNames(loaded.model),
                                         options.batch_size, source));
  }
  return data;
}

// The recipe's modifiers (none with only the caller's own), then the
// caller's.
absl::Status AddModifiers(const CalibrateOptions& options,
                          const recipe::Recipe& r, bool extras_only,
                          std::vector<std::unique_ptr<Modifier>>& owned,
                          std::vector<Modifier*>& modifiers) {
  if (!extras_only) {
    ASSIGN_OR_RETURN(
        owned,
        BuildModifiers(r, options.collective,
                       options.output_format ==
                           CalibrateOptions::OutputFormat::kCompressedTensors));
  }
  for (const auto& m : owned) modifiers.push_back(m.get());
  for (Modifier* m : options.extra_modifiers) {
    if (m == nullptr) {
      return absl::InvalidArgumentError("a null extra modifier");
    }
    modifiers.push_back(m);
  }
  return absl::OkStatus();
}

// The pipeline's options from the recipe `r` and the flags (run directory,
// device and checkpoint group are the caller's).
absl::StatusOr<PipelineOptions> PipelineOptionsFor(
    const CalibrateOptions& options, const recipe::Recipe& r,
    const LoadedForCalibration& loaded, PipelineKind kind, bool streaming,
    Progress* progress) {
  PipelineOptions p;
  p.kind = kind;
  p.propagate_error = options.propagate_error.value_or(r.propagate_error());
  p.measure_baselines = options.measure_baselines;
  std::vector<std::string> targets = options.sequential_targets;
  if (targets.empty()) {
    targets.assign(r.sequential_targets().begin(),
                   r.sequential_targets().end());
  }
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
  p.calibrate_all_experts = r.calibrate_all_experts();
  p.all_experts_required =
      r.has_calibrate_all_experts() && r.calibrate_all_experts();
  if (r.has_expert_modules()) p.expert_pattern = r.expert_modules();
  if (r.has_cache()) {
    ASSIGN_OR_RETURN(p.cache.offload_device,
                     runtime::TorchCall("recipe cache.offload_device", [&] {
                       return c10::Device(r.cache().offload_device());
                     }));
    p.cache.memory_budget_bytes = r.cache().memory_budget_bytes();
    p.cache.spill_dir = r.cache().spill_dir();
  }
  p.resume = options.resume;
  p.stop_after_subgraph = options.stop_after_subgraph;
  p.progress = progress;
  p.device = options.device;
  ASSIGN_OR_RETURN(std::string model_identity, ModelIdentity(loaded.file));
  p.fingerprint = absl::StrCat(
      "model ", model_identity,
      loaded.native && loaded.native_dtype != at::kFloat
          ? absl::StrCat(" in ", runtime::DTypeName(loaded.native_dtype))
          : "",
      "; recipe ", absl::StrFormat("%016x", util::Fnv1a64(RecipeText(r))),
      "; targets ", absl::StrJoin(targets, ","),
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
  return p;
}

// The recipe.yaml of a compressed-tensors output: the recipe as this run
// applies it (flags and defaults filled in). Modifiers of the caller's own
// have no llm-compressor form, so an output with any gets none.
absl::StatusOr<std::string> AppliedRecipeYaml(const CalibrateOptions& options,
                                              const recipe::Recipe& r,
                                              const PipelineOptions& p) {
  if (options.output_format !=
          CalibrateOptions::OutputFormat::kCompressedTensors ||
      !options.extra_modifiers.empty()) {
    return "";
  }
  recipe::Recipe applied = r;
  applied.set_pipeline(RecipeKind(p.kind));
  applied.set_propagate_error(p.propagate_error);
  applied.clear_sequential_targets();
  if (p.kind != PipelineKind::kBasic) {
    for (const std::string& t : p.partition.targets) {
      applied.add_sequential_targets(t);
    }
  }
  absl::StatusOr<std::string> yaml = RecipeToYaml(applied);
  if (!yaml.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.recipe_source,
                     ": cannot be written as the output's recipe.yaml: ",
                     yaml.status().message()));
  }
  return yaml;
}

ReportInfo ReportInfoFor(const CalibrateOptions& options,
                         const recipe::Recipe& r, const PipelineOptions& p,
                         const CalibrationData& data,
                         const CalibrateOutcome& outcome) {
  ReportInfo info;
  info.model = options.model_path;
  info.recipe = options.recipe_source;
  info.recipe_text = RecipeText(r);
  info.streamed_peak_weight_bytes = outcome.streamed_peak_weight_bytes;
  info.pipeline = std::string(PipelineKindName(p.kind));
  info.propagate_error = p.propagate_error;
  info.sequential_targets = p.kind == PipelineKind::kBasic
                                ? std::vector<std::string>()
                                : p.partition.targets;
  info.data_source = data.source;
  info.data_inputs = data.descriptions;
  info.samples = data.num_samples;
  info.seq_len = data.seq_len;
  info.min_seq_len = data.min_seq_len;
  info.batches = static_cast<int64_t>(data.batches.size());
  info.data_fingerprint = data.fingerprint;
  info.include_run_section = options.report_run_section;
  info.device = runtime::DeviceName(options.device);
  return info;
}

// Saves the model through `output` with the report beside it: the report
// goes next to its destination first, the model is saved, and only then is
// the report renamed into place. No report without a model, and a report
// that cannot be written fails before the model is saved.
// (util::WriteFileAtomically straight to report_path would give up the
// second.)
absl::Status SaveWithReport(output::OutputWriter& output,
                            const runtime::GraphModule& gm,
                            const modifiers::CalibrationResults& results,
                            const util::Json& report,
                            const std::string& report_path) {
  std::string report_tmp;
  if (!report_path.empty()) {
    report_tmp = absl::StrCat(report_path, ".tmp.", getpid());
    RETURN_IF_ERROR(util::WriteFileAtomically(
        report_tmp, util::DumpJson(report, 2) + "\n"));
  }
  if (absl::Status saved = output.Write(gm, results); !saved.ok()) {
    if (!report_tmp.empty()) std::remove(report_tmp.c_str());
    return saved;
  }
  if (!report_tmp.empty() &&
      std::rename(report_tmp.c_str(), report_path.c_str()) != 0) {
    const int err = errno;
    std::remove(report_tmp.c_str());
    return util::ErrnoError(
        err, absl::StrCat("cannot write report '", report_path, "'"));
  }
  return absl::OkStatus();
}

// Where a run keeps its state and with whom it calibrates: its run
// directory (partitioned pipelines), and for a data-parallel rank its shard
// of the data and the group its checkpoints synchronise with.
struct RunSetup {
  bool distributed = false;
  int rank = 0;
  int world_size = 1;
  // The run directory OUT.run (or --run-dir); a rank's checkpoints go into
  // its own directory under it (Note [Data-parallel checkpoints]).
  std::string base_run_dir;
  // Removed again when the run fails.
  std::unique_ptr<RunDir> run_dir;
  CalibrationData shard;
  std::unique_ptr<CollectiveCheckpointGroup> group;
};

absl::StatusOr<RunSetup> SetUpRun(const CalibrateOptions& options,
                                  const CalibrationData& data,
                                  PipelineOptions& p) {
  RunSetup run;
  run.distributed =
      options.collective != nullptr && options.collective->distributed();
  if (run.distributed && !options.device.is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        "--device=", runtime::DeviceName(options.device),
        ": data-parallel runs compute on the CPU only (one GPU per rank over "
        "NCCL is not built yet); run one process on the GPU, or the ranks "
        "on the CPU"));
  }
  run.rank = run.distributed ? options.collective->rank() : 0;
  run.world_size = run.distributed ? options.collective->world_size() : 1;
  const bool partitioned = p.kind != PipelineKind::kBasic;
  run.base_run_dir = RunDirFor(options.output_path, options.run_dir);
  p.run_dir = run.base_run_dir;
  if (run.distributed) {
    ASSIGN_OR_RETURN(run.shard,
                     ShardCalibrationData(data, run.rank, run.world_size));
    if (partitioned) {
      p.fingerprint +=
          absl::StrCat("; rank ", run.rank, " of ", run.world_size);
      run.group =
          std::make_unique<CollectiveCheckpointGroup>(*options.collective);
      p.checkpoint_group = run.group.get();
    }
  }
  if (!partitioned) return run;
  if (options.resume) {
    RETURN_IF_ERROR(CheckResumeWorldSize(run.base_run_dir, run.world_size));
  }
  ASSIGN_OR_RETURN(
      run.run_dir,
      RunDir::Open(run.base_run_dir,
                   run.distributed ? RankDirName(run.rank, run.world_size) : "",
                   options.output_path));
  p.run_dir = run.run_dir->path();
  if (p.cache.spill_dir.empty()) p.cache.spill_dir = run.run_dir->spill_dir();
  if (run.run_dir->previous_pid() != 0 &&
      p.cache.spill_dir != run.run_dir->spill_dir()) {
    RemoveSpillFiles(p.cache.spill_dir, run.run_dir->previous_pid());
  }
  return run;
}

// Where the model goes: one writer whatever the format. Streaming: shards
// are written into the run directory as subgraphs finish (kept for
// --resume) and the directory is renamed onto OUT_DIR; only rank 0 writes,
// the other ranks release their weights unwritten (every rank holds the
// same final weights: owners broadcast them).
struct Output {
  std::unique_ptr<CompressedTensorsWriter> shards;
  std::unique_ptr<WeightStream> stream;
  std::unique_ptr<output::OutputWriter> writer;  // Null on ranks but 0.
};

absl::StatusOr<Output> MakeOutput(const CalibrateOptions& options,
                                  LoadedForCalibration& loaded,
                                  CompressedOutputOptions out_options,
                                  const RunSetup& run, PipelineOptions& p,
                                  Progress* progress) {
  Output out;
  if (loaded.deferred.empty()) {
    out.writer = options.output_format ==
                         CalibrateOptions::OutputFormat::kCompressedTensors
                     ? output::CompressedTensorsOutput(std::move(out_options))
                     : output::TorchScriptOutput(options.output_path);
    return out;
  }
  out_options.source_dir = loaded.checkpoint_dir;
  if (run.rank == 0) {
    ASSIGN_OR_RETURN(out.shards, CompressedTensorsWriter::Create(
                                     out_options, loaded.model.extra_files(),
                                     run.run_dir->output_dir()));
    out.writer = output::StreamedOutput(*out.shards);
  }
  ASSIGN_OR_RETURN(out.stream, WeightStream::Create(
                                   loaded.model, loaded.deferred,
                                   loaded.checkpoint_dir, out.shards.get()));
  p.weights = out.stream.get();
  progress->Note(absl::StrCat(
      "streaming weights from ", loaded.checkpoint_dir, " (",
      loaded.deferred.size(), " tensors, read when their subgraph runs",
      loaded.native
          ? absl::StrCat("; the model built from its config.json, no export, "
                         "computing in ",
                         runtime::DTypeName(loaded.native_dtype))
          : "",
      ")"));
  return out;
}

// MoE experts a checkpoint stores fused (3-D parameters, not one Linear
// per expert: GptOss, Llama4, Mistral 4) are not quantized: a weight
// quantization that leaves them says so, never silently.
std::optional<std::string> UnquantizedFusedExperts(
    const modifiers::CalibrationResults& results,
    const checkpoint::Layout& layout, const torch::jit::Module& module) {
  const bool quantizes = std::any_of(
      results.modules.begin(), results.modules.end(),
      [](const auto& m) { return !m.second.weight_method.empty(); });
  if (!quantizes) return std::nullopt;
  std::vector<std::string> fused;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    // By name: other 3-D parameters are convolutions' (Whisper, Mamba).
    if (p.value.dim() == 3 && p.value.is_floating_point() &&
        absl::StrContains(absl::AsciiStrToLower(p.name), "expert") &&
        layout.Find(p.name) == nullptr) {
      fused.push_back(p.name);
    }
  }
  if (fused.empty()) return std::nullopt;
  return absl::StrCat(
      fused.size(),
      " fused 3-D parameters (MoE experts as the checkpoint "
      "stores them, e.g. ",
      fused[0],
      ") stay unquantized: tracecut quantizes experts stored one Linear per "
      "expert (llm-compressor 0.14 linearizes some fused experts: GptOss's, "
      "Llama4's)");
}

}  // namespace

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
  const bool compressed_tensors =
      options.output_format ==
      CalibrateOptions::OutputFormat::kCompressedTensors;

  const PipelineKind kind =
      options.pipeline.value_or(KindFromRecipe(options.recipe.pipeline()));
  const bool partitioned = kind != PipelineKind::kBasic;
  tracer::LoadOptions load;
  load.defer_checkpoint_tensors = options.stream_weights &&
                                  compressed_tensors && partitioned &&
                                  IsDirectory(options.model_path);
  load.dtype = options.dtype;
  ASSIGN_OR_RETURN(
      LoadedForCalibration loaded,
      LoadForCalibration(options.model_path, options.example_inputs, load));
  runtime::GraphModule& gm = loaded.model;
  const bool streaming = !loaded.deferred.empty();
  // All of every weight, not only what the data will touch: a NaN in an
  // embedding row no sample uses would otherwise be copied into the output.
  // Streamed weights are checked as they are read.
  std::set<std::string> deferred;
  for (const auto& [path, d] : loaded.deferred) deferred.insert(path);
  ASSIGN_OR_RETURN(auto tied, WeightStream::TiedAliases(gm, loaded.deferred));
  for (const auto& [alias, path] : tied) deferred.insert(alias);
  RETURN_IF_ERROR(
      runtime::CheckModuleFinite(gm.module(), loaded.file, deferred));
  // A SIGINT / SIGTERM while loading (one LibTorch call) ends the run here,
  // before the data is prepared.
  RETURN_IF_ERROR(CheckInterrupt());
  ASSIGN_OR_RETURN(CalibrationData data, PrepareData(options, loaded));
  RETURN_IF_ERROR(CheckInterrupt());

  // The recipe with the flag the modifiers read too: one value for both.
  recipe::Recipe r = options.recipe;
  if (options.calibrate_all_experts.has_value()) {
    r.set_calibrate_all_experts(*options.calibrate_all_experts);
  }
  std::vector<std::unique_ptr<Modifier>> owned;
  std::vector<Modifier*> modifiers;
  RETURN_IF_ERROR(AddModifiers(options, r, extras_only, owned, modifiers));
  ASSIGN_OR_RETURN(
      PipelineOptions p,
      PipelineOptionsFor(options, r, loaded, kind, streaming, progress));
  CompressedOutputOptions out_options;
  out_options.output_dir = options.output_path;
  ASSIGN_OR_RETURN(out_options.recipe_yaml, AppliedRecipeYaml(options, r, p));
  if (IsDirectory(options.model_path)) {
    out_options.source_dir = options.model_path;
  }

  ASSIGN_OR_RETURN(RunSetup run, SetUpRun(options, data, p));
  const bool distributed = run.distributed;
  std::unique_ptr<RunDir>& run_dir = run.run_dir;
  // Done with the run directory: kept for --resume (or --keep-run-dir),
  // else removed.
  auto finish_run_dir = [&](bool keep) {
    if (run_dir == nullptr) return;
    keep ? run_dir->Keep() : run_dir->Remove();
  };

  ASSIGN_OR_RETURN(
      Output out,
      MakeOutput(options, loaded, std::move(out_options), run, p, progress));
  CalibrateOutcome outcome;
  outcome.targets = p.partition.targets;
  outcome.num_batches = static_cast<int64_t>(data.batches.size());
  absl::StatusOr<PipelineResult> piped = RunPipeline(
      gm, distributed ? run.shard : data, modifiers, outcome.results, p);
  // Interrupted, out of memory, or (data-parallel) another rank lost: the
  // subgraphs done so far need not be redone (after freeing memory, with a
  // smaller cache budget, or once every rank runs again).
  auto keep_checkpoint = [&](const absl::Status& status) {
    if ((absl::IsCancelled(status) || absl::IsResourceExhausted(status) ||
         (distributed && absl::IsUnavailable(status))) &&
        run_dir != nullptr && run_dir->HasCheckpoint()) {
      run_dir->Keep();
      return absl::Status(
          status.code(),
          absl::StrCat(status.message(), "; the checkpoint in ",
                       run.base_run_dir,
                       " is kept: rerun the same command with --resume to "
                       "continue"));
    }
    return status;
  };
  if (!piped.ok()) return keep_checkpoint(piped.status());
  outcome.pipeline = std::move(*piped);
  if (outcome.pipeline.stopped) {
    finish_run_dir(/*keep=*/true);
    outcome.stopped = true;
    return outcome;
  }

  if (streaming) {
    // Each shard's parameters were checked as it was written.
    RETURN_IF_ERROR(out.stream->WriteRest(outcome.results));
    outcome.streamed_peak_weight_bytes = out.stream->peak_loaded_bytes();
  } else {
    RETURN_IF_ERROR(CheckQuantResultsFinite(outcome.results, gm));
  }
  if (distributed) {
    // Every rank finished: only then does rank 0 write, and only rank 0.
    RETURN_IF_ERROR(
        keep_checkpoint(options.collective->Barrier("the end of calibration")));
    if (run.rank != 0) {
      // The checkpoints stay until rank 0 has written the output.
      RETURN_IF_ERROR(keep_checkpoint(
          options.collective->Barrier("rank 0 writing the output")));
      finish_run_dir(options.keep_run_dir);
      if (!streaming) outcome.model.emplace(std::move(gm));
      return outcome;
    }
  }
  if (!streaming) RETURN_IF_ERROR(ExportQuantParams(outcome.results, gm));
  ASSIGN_OR_RETURN(checkpoint::Layout layout,
                   checkpoint::Layout::FromExtraFiles(gm.extra_files()));
  if (std::optional<std::string> warning =
          UnquantizedFusedExperts(outcome.results, layout, gm.module())) {
    progress->Note(absl::StrCat("warning: ", *warning));
    outcome.results.warnings.push_back(std::move(*warning));
  }
  if (options.output_format ==
      CalibrateOptions::OutputFormat::kCompressedTensors) {
    if (std::optional<std::string> warning =
            output::FusedExpertsLoadWarning(outcome.results, layout)) {
      progress->Note(absl::StrCat("warning: ", *warning));
      outcome.results.warnings.push_back(std::move(*warning));
    }
  }
  outcome.report = BuildReport(ReportInfoFor(options, r, p, data, outcome),
                               outcome.results, &outcome.pipeline);
  RETURN_IF_ERROR(SaveWithReport(*out.writer, gm, outcome.results,
                                 outcome.report, options.report_path));
  if (distributed) {
    // The output is complete whatever this says: a rank that fails here
    // only keeps its checkpoint.
    (void)options.collective->Barrier("rank 0 writing the output");
  }
  finish_run_dir(options.keep_run_dir);
  if (!streaming) outcome.model.emplace(std::move(gm));
  return outcome;
}

}  // namespace tracecut::pipelines
