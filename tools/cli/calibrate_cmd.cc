// `tracecut calibrate MODEL --recipe=RECIPE.textproto|recipe.yaml -o OUT`:
// sequential calibration (GPTQ, RTN, observers) of a TorchScript model.

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "pipelines/calibrate.h"
#include "pipelines/interrupt.h"
#include "pipelines/recipe.h"
#include "pipelines/recipe_yaml.h"
#include "pipelines/report_html.h"
#include "pipelines/run_dir.h"
#include "quantization/quant_args.h"
#include "runtime/collective.h"
#include "runtime/device.h"
#include "tools/cli/common.h"
#include "tools/cli/launch.h"
#include "tools/cli/model_flags.h"
#include "util/format.h"
#include "util/json.h"
#include "util/output_manifest.h"
#include "util/path_guard.h"
#include "util/progress.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

using pipelines::CalibrateOptions;
using pipelines::CalibrateOutcome;
using util::Json;

// Recipes are a few kilobytes of text.
constexpr uint64_t kMaxRecipeBytes = 16 << 20;

// Every path calibrate writes (-o, --report, the run directory) kept apart
// from every path it reads: none is, contains or lies inside an input.
absl::Status CheckOutputsApart(const ParsedArgs& args,
                               const CalibrateOptions& o) {
  std::error_code ec;
  std::vector<util::NamedPath> inputs = {
      {std::filesystem::is_directory(o.model_path, ec)
           ? "input checkpoint directory"
           : "input model",
       o.model_path}};
  // A .pt2 exported with --meta reads the weights beside it.
  const std::filesystem::path beside =
      std::filesystem::path(o.model_path).parent_path();
  if (!std::filesystem::is_directory(o.model_path, ec) &&
      (std::filesystem::exists(beside / "model.safetensors", ec) ||
       std::filesystem::exists(beside / "model.safetensors.index.json", ec))) {
    inputs.push_back(
        {"input checkpoint directory", beside.empty() ? "." : beside.string()});
  }
  for (const char* flag : {"recipe", "data", "config", "example-inputs"}) {
    if (std::optional<std::string> v = args.Get(flag)) {
      inputs.push_back({absl::StrCat("--", flag, " file"), *v});
    }
  }
  RETURN_IF_ERROR(util::CheckOutputApart({"-o", o.output_path}, inputs));
  if (!o.report_path.empty()) {
    RETURN_IF_ERROR(
        util::CheckOutputApart({"--report", o.report_path}, inputs));
  }
  if (std::optional<std::string> html = args.Get("html")) {
    RETURN_IF_ERROR(util::CheckOutputApart({"--html", *html}, inputs));
  }
  return util::CheckOutputApart(
      {"the run directory", pipelines::RunDirFor(o.output_path, o.run_dir)},
      inputs);
}

absl::StatusOr<int64_t> IntFlag(const ParsedArgs& args, absl::string_view name,
                                int64_t fallback, int64_t min) {
  std::optional<std::string> v = args.Get(name);
  if (!v.has_value()) return fallback;
  int64_t out = 0;
  if (!absl::SimpleAtoi(*v, &out) || out < min) {
    return UsageError(absl::StrCat("--", name, " needs an integer >= ", min,
                                   ", got '", *v, "'"));
  }
  return out;
}

absl::StatusOr<std::optional<bool>> BoolFlag(const ParsedArgs& args,
                                             absl::string_view name) {
  std::optional<std::string> v = args.Get(name);
  if (!v.has_value()) return std::optional<bool>();
  if (*v == "true" || *v == "1") return std::optional<bool>(true);
  if (*v == "false" || *v == "0") return std::optional<bool>(false);
  return UsageError(
      absl::StrCat("--", name, " is true or false, got '", *v, "'"));
}

// "0.0841" or "-" for a missing number.
std::string Num(const Json* v) {
  if (v == nullptr || !v->is_number()) return "-";
  return absl::StrFormat("%.4g", v->get<double>());
}

int64_t Int(const Json* v) {
  return v != nullptr && v->is_number() ? v->get<int64_t>() : 0;
}

// "; per-module output error on the calibration inputs, mean over 14
// modules: 0.0034, round-to-nearest on the same modules and inputs 0.049":
// what the figures are measured on, and the round-to-nearest figure only
// over the modules it covers.
std::string SummaryErrors(const Json& summary) {
  const int64_t measured = Int(util::FindMember(summary, "measured_modules"));
  if (measured == 0) return "";
  std::string out = absl::StrCat(
      "; per-module output error on the calibration inputs, mean over ",
      measured, measured == 1 ? " module: " : " modules: ",
      Num(util::FindMember(summary, "mean_output_error")));
  const int64_t compared =
      Int(util::FindMember(summary, "rtn_compared_modules"));
  if (compared == measured) {
    absl::StrAppend(&out, ", round-to-nearest on the same modules and inputs ",
                    Num(util::FindMember(summary, "mean_rtn_output_error")));
  } else if (compared > 0) {
    absl::StrAppend(
        &out, "; over the ", compared,
        " with a round-to-nearest baseline on the same inputs: ",
        Num(util::FindMember(summary, "mean_compared_output_error")),
        ", round-to-nearest ",
        Num(util::FindMember(summary, "mean_rtn_output_error")));
  }
  return out;
}

// Ranks are processes started at once: checked against the machine and the
// samples before any starts (each rank needs a sample; more than a few per
// core only thrash).
absl::Status CheckRankCount(int64_t nproc, const ParsedArgs& args) {
  constexpr int64_t kRanksPerCore = 4;
  const int64_t cores = std::max<int64_t>(1, ::sysconf(_SC_NPROCESSORS_ONLN));
  if (nproc > kRanksPerCore * cores) {
    return UsageError(
        absl::StrCat("--nproc-per-node=", nproc, ": more than ", kRanksPerCore,
                     " ranks per core on this machine's ", cores, " cores"));
  }
  int64_t samples = 0;
  if (std::optional<std::string> v = args.Get("synthetic");
      v.has_value() && absl::SimpleAtoi(*v, &samples) && samples > 0 &&
      nproc > samples) {
    return UsageError(absl::StrCat("--nproc-per-node=", nproc,
                                   ": more ranks than the ", samples,
                                   " samples of --synthetic (each rank needs "
                                   "one)"));
  }
  return absl::OkStatus();
}

// The options of a run from its flags (after the launcher's).
absl::StatusOr<CalibrateOptions> OptionsFromFlags(
    const ParsedArgs& args, const std::string& device,
    runtime::Collective* collective, bool quiet_rank, Io& io) {
  CalibrateOptions o;
  absl::StatusOr<c10::Device> resolved = runtime::ResolveDevice(device);
  if (resolved.status().code() == absl::StatusCode::kInvalidArgument) {
    return UsageError(resolved.status().message());
  }
  ASSIGN_OR_RETURN(o.device, std::move(resolved));
  if (device == "auto" && o.device.is_cpu() && !quiet_rank) {
    io.err << "tracecut calibrate: --device=auto: computing on the CPU ("
           << runtime::LoadCudaBackend().message() << ")\n";
  }
  o.collective = collective;
  o.model_path = args.positional()[0];
  std::optional<std::string> recipe_path = args.Get("recipe");
  std::optional<std::string> scheme = args.Get("scheme");
  if (recipe_path.has_value() == scheme.has_value()) {
    return UsageError(
        "give exactly one of --recipe=RECIPE.textproto (or llm-compressor's "
        "recipe.yaml) and --scheme=PRESET");
  }
  std::optional<std::string> output = args.Get("output");
  if (!output.has_value()) return UsageError("-o OUT is required");
  o.output_path = *output;
  // A checkpoint directory in, a checkpoint directory out (unless -o names
  // a .pt).
  std::error_code ec;
  const bool checkpoint_in = std::filesystem::is_directory(o.model_path, ec);
  const std::string format = args.Get("format").value_or(
      checkpoint_in && !absl::EndsWith(o.output_path, ".pt")
          ? "compressed-tensors"
          : "torchscript");
  if (format == "compressed-tensors") {
    o.output_format = CalibrateOptions::OutputFormat::kCompressedTensors;
  } else if (format != "torchscript") {
    return UsageError(absl::StrCat(
        "--format is torchscript or compressed-tensors, got '", format, "'"));
  }
  RETURN_IF_ERROR(CheckOutputPath(
      o.output_path,
      o.output_format == CalibrateOptions::OutputFormat::kCompressedTensors));
  RETURN_IF_ERROR(CheckOutputIsNotInput(o.output_path, o.model_path));
  if (args.Has("data") && args.Has("synthetic")) {
    return UsageError("give exactly one of --data=FILE and --synthetic=N");
  }
  // --scheme quantizes round-to-nearest: data only measures each module's
  // output error, so one synthetic sample stands in when none is given.
  if (!args.Has("data") && !args.Has("synthetic") && !scheme.has_value()) {
    return UsageError("give exactly one of --data=FILE and --synthetic=N");
  }
  o.data_path = args.Get("data").value_or("");
  ASSIGN_OR_RETURN(o.synthetic_samples,
                   IntFlag(args, "synthetic", args.Has("data") ? 0 : 1, 1));
  ASSIGN_OR_RETURN(o.synthetic_seq_len, IntFlag(args, "seq-len", 16, 1));
  ASSIGN_OR_RETURN(int64_t seed, IntFlag(args, "seed", 0, 0));
  o.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(o.batch_size, IntFlag(args, "batch-size", 1, 1));
  for (const std::string& flag : args.GetAll("input")) {
    ASSIGN_OR_RETURN(tracer::hf::InputSpec spec, ParseInputFlag(flag));
    o.example_inputs.input_specs.push_back(std::move(spec));
  }
  o.example_inputs.example_inputs_path =
      args.Get("example-inputs").value_or("");
  o.example_inputs.config_path = args.Get("config").value_or("");
  o.dtype = args.Get("dtype").value_or("");
  if (std::optional<std::string> p = args.Get("pipeline")) {
    absl::StatusOr<pipelines::PipelineKind> kind =
        pipelines::ParsePipelineKind(*p);
    if (!kind.ok()) return UsageError(kind.status().message());
    o.pipeline = *kind;
  }
  ASSIGN_OR_RETURN(o.propagate_error, BoolFlag(args, "propagate-error"));
  ASSIGN_OR_RETURN(o.calibrate_all_experts,
                   BoolFlag(args, "calibrate-all-experts"));
  ASSIGN_OR_RETURN(std::optional<bool> stream,
                   BoolFlag(args, "stream-weights"));
  o.stream_weights = stream.value_or(true);
  if (std::optional<std::string> t = args.Get("targets")) {
    o.sequential_targets = absl::StrSplit(*t, ',', absl::SkipEmpty());
  }
  o.report_path = args.Get("report").value_or("");
  if (!o.report_path.empty()) RETURN_IF_ERROR(CheckOutputPath(o.report_path));
  const std::string html_path = args.Get("html").value_or("");
  if (!html_path.empty()) RETURN_IF_ERROR(CheckOutputPath(html_path));
  o.run_dir = args.Get("run-dir").value_or("");
  o.resume = args.Has("resume");
  o.keep_run_dir = args.Has("keep-run-dir");
  ASSIGN_OR_RETURN(int64_t stop, IntFlag(args, "stop-after", -1, 0));
  o.stop_after_subgraph = static_cast<int>(stop);
  o.report_run_section = !args.Has("deterministic-report");
  // Round-to-nearest baselines only for a report someone reads.
  o.measure_baselines =
      !o.report_path.empty() || !html_path.empty() || args.Has("json");
  RETURN_IF_ERROR(CheckOutputsApart(args, o));
  if (o.output_format == CalibrateOptions::OutputFormat::kCompressedTensors) {
    RETURN_IF_ERROR(util::CheckOutputDirReplaceable(
        o.output_path, args.Has("overwrite"), "-o"));
  }

  if (scheme.has_value()) {
    // llm-compressor's QuantizationModifier(targets="Linear", scheme=PRESET,
    // ignore=["lm_head"]).
    recipe::RtnModifier* rtn = o.recipe.add_modifiers()->mutable_rtn();
    rtn->mutable_scheme()->set_preset(*scheme);
    rtn->add_targets("Linear");
    rtn->add_ignore("lm_head");
    o.recipe_source = absl::StrCat("--scheme=", *scheme);
    absl::Status valid = pipelines::ValidateRecipe(o.recipe, "--scheme");
    if (!valid.ok()) {
      return UsageError(absl::StrCat(
          "--scheme=", *scheme, ": ",
          absl::StripPrefix(valid.message(),
                            "--scheme: modifiers[0].rtn.scheme.preset: ")));
    }
    // Static input activations (FP8, NVFP4) are calibrated on the data: a
    // synthetic sample would give them a meaningless scale.
    absl::StatusOr<quantization::QuantizationScheme> preset =
        quantization::PresetScheme(*scheme, {"Linear"});
    if (preset.ok() && preset->input_activations.has_value() &&
        preset->input_activations->dynamic != quantization::Dynamic::kDynamic &&
        !args.Has("data") && !args.Has("synthetic")) {
      return UsageError(
          absl::StrCat("--scheme=", *scheme,
                       " calibrates the scales of static input activations (",
                       preset->input_activations->ToString(),
                       "): give --data=FILE with calibration samples"));
    }
  } else {
    ASSIGN_OR_RETURN(o.recipe, pipelines::LoadRecipeFile(*recipe_path));
    o.recipe_source = *recipe_path;
  }

  return o;
}

// What a finished (or stopped) run prints: --json, --html, the summary.
absl::Status PrintOutcome(const ParsedArgs& args, const CalibrateOptions& o,
                          const CalibrateOutcome& out, Io& io) {
  const std::string html_path = args.Get("html").value_or("");
  const std::string run_dir = pipelines::RunDirFor(o.output_path, o.run_dir);
  if (out.stopped) {
    if (args.Has("json")) {
      Json j = Json::object();
      j["stopped"] = Json(true);
      j["stopped_after_subgraph"] =
          Json(static_cast<int64_t>(o.stop_after_subgraph));
      j["run_dir"] = Json(run_dir);
      io.out << util::DumpJson(j, 2) << "\n";
    }
    io.err << "tracecut calibrate: stopped after subgraph "
           << o.stop_after_subgraph + 1 << "/" << out.pipeline.num_subgraphs
           << "; checkpoint in " << run_dir << " (rerun with --resume)\n";
    return absl::OkStatus();
  }
  if (args.Has("json")) {
    io.out << util::DumpJson(out.report, 2) << "\n";
  }
  if (!html_path.empty()) {
    ASSIGN_OR_RETURN(
        std::string html,
        pipelines::CalibrationReportHtml(
            out.report, o.report_path.empty() ? o.output_path : o.report_path));
    RETURN_IF_ERROR(WriteOutput(html_path, html, io));
  }
  const Json* summary = util::FindMember(out.report, "summary");
  io.err << "tracecut calibrate: wrote " << o.output_path;
  if (!o.report_path.empty()) io.err << " and " << o.report_path;
  if (!html_path.empty()) io.err << " and " << html_path;
  if (summary != nullptr) {
    io.err << " ("
           << util::FindMember(*summary, "weights_quantized")->get<int64_t>()
           << " weights quantized";
    io.err << SummaryErrors(*summary);
    const Json* uncalibrated =
        util::FindMember(*summary, "uncalibrated_modules");
    if (uncalibrated != nullptr && uncalibrated->is_array() &&
        !uncalibrated->empty()) {
      io.err << "; " << uncalibrated->size()
             << " saw no calibration tokens and were quantized "
                "round-to-nearest, not counted in the mean";
    }
    io.err << ")";
  }
  io.err << "\n";
  if (!o.device.is_cpu()) {
    const Json* run = util::FindMember(out.report, "run");
    const Json* peak =
        run != nullptr ? util::FindMember(*run, "device_peak_bytes") : nullptr;
    io.err << "tracecut calibrate: computed on "
           << runtime::DeviceName(o.device);
    if (peak != nullptr) {
      io.err << "; at most " << util::HumanBytes(peak->get<int64_t>())
             << " of device memory held at once";
    }
    io.err << "\n";
  }
  if (out.streamed_peak_weight_bytes.has_value()) {
    io.err << "tracecut calibrate: weights streamed; at most "
           << util::HumanBytes(*out.streamed_peak_weight_bytes)
           << " of them held at once\n";
  }
  return absl::OkStatus();
}

absl::Status RunCalibrate(const ParsedArgs& args, Io& io) {
  // Data-parallel: launch the ranks here, or be one (launch.h).
  ASSIGN_OR_RETURN(int64_t nproc, IntFlag(args, "nproc-per-node", 1, 1));
  ASSIGN_OR_RETURN(int64_t dist_timeout, IntFlag(args, "dist-timeout", 300, 1));
  // Before anything asks LibTorch about CUDA (runtime/device.h).
  std::string device = args.Get("device").value_or("cpu");
  // `auto` is the CPU for data-parallel runs (their GPU path is not built).
  if (device == "auto" && (nproc > 1 || IsLaunchedRank())) device = "cpu";
  if (device != "cpu" && (nproc > 1 || IsLaunchedRank())) {
    return UsageError(absl::StrCat(
        "--device=", device,
        ": data-parallel runs compute on the CPU only (one GPU per rank over "
        "NCCL is not built yet); drop --device or --nproc-per-node"));
  }
  if (nproc > 1 && !IsLaunchedRank()) {
    RETURN_IF_ERROR(CheckRankCount(nproc, args));
    const std::string output = args.Get("output").value_or("");
    return LaunchLocalRanks(
        static_cast<int>(nproc), {output, args.Get("report").value_or("")},
        output.empty() && !args.Has("run-dir")
            ? ""
            : pipelines::RunDirFor(output, args.Get("run-dir").value_or("")),
        io);
  }
  std::unique_ptr<runtime::Collective> collective;
  if (IsLaunchedRank()) {
    ASSIGN_OR_RETURN(collective, runtime::Collective::FromEnvironment(
                                     absl::Seconds(dist_timeout)));
  }
  const bool quiet_rank = collective != nullptr && collective->rank() != 0;
  ASSIGN_OR_RETURN(
      CalibrateOptions o,
      OptionsFromFlags(args, device, collective.get(), quiet_rank, io));
  const bool live = &io.err == &std::cerr && isatty(STDERR_FILENO) != 0;
  util::Progress progress(&io.err, live);
  if (!quiet_rank) o.progress = &progress;
  pipelines::InstallInterruptHandlers();
  absl::StatusOr<CalibrateOutcome> calibrated = pipelines::Calibrate(o);
  if (!calibrated.ok() && pipelines::InterruptSignal() != 0) {
    // Exit as a signal would (130 for SIGINT), after cleaning up.
    return WithExitCode(calibrated.status(),
                        128 + pipelines::InterruptSignal());
  }
  if (!calibrated.ok()) return calibrated.status();
  CalibrateOutcome& out = *calibrated;
  if (quiet_rank) return absl::OkStatus();  // Rank 0 reports.

  return PrintOutcome(args, o, out, io);
}

// calibrate's flags, with the model flags it shares with trace.
std::vector<FlagSpec> CalibrateFlags() {
  std::vector<FlagSpec> flags = {
      FlagSpec::Value("recipe", "FILE",
                      "calibration recipe: pipelines/recipe.proto in text "
                      "format, or llm-compressor's recipe.yaml (.yaml, "
                      ".yml); see docs/recipes.md")
          .InputFile(kMaxRecipeBytes),
      FlagSpec::Value("scheme", "PRESET",
                      "instead of --recipe: a compressed-tensors preset "
                      "(W4A16, W4A16_ASYM, W8A16, W8A8, FP8, FP8_DYNAMIC, "
                      "FP8_BLOCK, NVFP4, NVFP4A16, MXFP4A16, MXFP4, ...) "
                      "applied round-to-nearest to every Linear but "
                      "lm_head, bit-exact with compressed-tensors and "
                      "stored in the format it calls for; data is optional "
                      "unless the preset has static input activations "
                      "(FP8, NVFP4)"),
      FlagSpec::Value("data", "FILE",
                      "model inputs: torch.save'd tensors (tensor, tuple, "
                      "list or dict by input name) or .safetensors; token "
                      "ids also as .jsonl, samples of any length (never "
                      "padded)")
          .InputFile(),
      FlagSpec::Value("synthetic", "N",
                      "N random samples from the model's vocabulary"),
      FlagSpec::Value("seq-len", "N", "tokens per synthetic sample (16)"),
      FlagSpec::Value("seed", "N", "seed of the synthetic samples (0)"),
      FlagSpec::Value("batch-size", "N", "samples per calibration batch (1)"),
      FlagSpec::Value("pipeline", "NAME",
                      "sequential, layer_sequential or basic (default: the "
                      "recipe's)"),
      FlagSpec::Value("propagate-error", "BOOL",
                      "feed later subgraphs the compressed subgraphs' "
                      "outputs (default: the recipe's, true)"),
      FlagSpec::Value("calibrate-all-experts", "BOOL",
                      "MoE: calibrate every expert (paths ending in "
                      "experts.N, or the recipe's expert_modules) on all "
                      "tokens of its block, not only those routed to it; "
                      "the model's outputs are unchanged (default: the "
                      "recipe's, true as in llm-compressor; false: only "
                      "the routed tokens)"),
      FlagSpec::Value("stream-weights", "BOOL",
                      "with a checkpoint directory MODEL (its .pt2 "
                      "exported with --meta) and compressed-tensors "
                      "output: read each subgraph's weights when it runs "
                      "and release them after, also on every rank of a "
                      "data-parallel run (default true)"),
      FlagSpec::Value("targets", "TYPE,...",
                      "sequential targets (default: the recipe's, else the "
                      "HF config's)"),
      FlagSpec::Value("output", "OUT",
                      "the calibrated model: a directory or a .pt")
          .Short('o'),
      FlagSpec::Value("format", "FORMAT",
                      "compressed-tensors (a checkpoint directory) or "
                      "torchscript (a .pt); default: compressed-tensors for "
                      "a checkpoint directory MODEL unless -o ends in .pt"),
      FlagSpec::Value("report", "FILE", "write the JSON report here"),
      FlagSpec::Bool("overwrite",
                     "replace a compressed-tensors OUT directory even when "
                     "it holds files tracecut did not write (by default "
                     "only an earlier output, as its .tracecut-output "
                     "manifest lists it, is replaced)"),
      FlagSpec::Value("html", "FILE",
                      "write the report as a self-contained HTML page here "
                      "(as `tracecut report` does)"),
      FlagSpec::Bool("deterministic-report",
                     "leave timings and cache statistics out of the report "
                     "(then identical runs give identical bytes)"),
      FlagSpec::Value("run-dir", "DIR",
                      "checkpoint directory (default OUT.pt.run)"),
      FlagSpec::Bool("resume",
                     "continue from the checkpoint in the run directory"),
      FlagSpec::Bool("keep-run-dir", "keep the checkpoints after success"),
      FlagSpec::Value("stop-after", "K",
                      "stop after subgraph K (0-based) as if killed there, "
                      "leaving its checkpoint (for testing --resume; every "
                      "rank of a data-parallel run stops there)"),
      FlagSpec::Bool("json", "print the report on stdout"),
      FlagSpec::Value("device", "DEV",
                      "where subgraphs compute: cpu (default), cuda, cuda:N, "
                      "or auto (the first GPU when there is one); weights go "
                      "to the device one subgraph at a time, activations are "
                      "cached on the host (docs/devices.md)"),
      FlagSpec::Value("nproc-per-node", "N",
                      "data-parallel calibration: run N ranks on this "
                      "machine, each on its share of the samples "
                      "(docs/distributed.md); with torchrun's RANK / "
                      "WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, this "
                      "process is one rank; --resume needs the same N"),
      FlagSpec::Value("dist-timeout", "SECONDS",
                      "data-parallel: how long a rank waits for the others "
                      "in one collective before failing (300)"),
  };
  for (FlagSpec& flag : ModelFlags()) {
    if (flag.name == "input" || flag.name == "example-inputs" ||
        flag.name == "config" || flag.name == "dtype") {
      flags.push_back(std::move(flag));
    }
  }
  return flags;
}

Subcommand CalibrateCommand() {
  Subcommand c;
  c.name = "calibrate";
  c.synopsis =
      "MODEL (--recipe=RECIPE.textproto|recipe.yaml | --scheme=PRESET) "
      "[--data=FILE | --synthetic=N] "
      "[--input=NAME:DTYPE[D0,...]]... [--example-inputs=FILE] "
      "[--config=config.json] "
      "[--pipeline=sequential|layer_sequential|basic] [--resume] "
      "[--format=compressed-tensors|torchscript] -o OUT [--report=FILE] "
      "[--html=FILE] [--json]";
  c.summary =
      "Calibrate and quantize a model (GPTQ, RTN, AWQ, SmoothQuant, "
      "observers).";
  c.description =
      "Traces MODEL.pt, splits it at the recipe's sequential targets (default: "
      "the Hugging Face config's decoder layers) and calibrates it subgraph "
      "by subgraph: a pass over all batches with the modifiers' hooks, their "
      "compression step, then (with error propagation, the default) a pass "
      "with the compressed weights whose outputs feed the next subgraph. "
      "Activations between subgraphs live in an intermediates cache (the "
      "recipe's cache budget spills to disk).\n\n"
      "--format=compressed-tensors (the default when MODEL is a checkpoint "
      "directory and -o does not end in .pt) writes OUT as a "
      "compressed-tensors checkpoint directory that transformers and vLLM "
      "load: config.json with a quantization_config, safetensors with "
      "each quantized Linear packed (weight_packed, weight_scale, "
      "weight_zero_point for asymmetric schemes, weight_g_idx with act "
      "order) and the other tensors as they are, and the checkpoint's "
      "tokenizer files, and recipe.yaml: the run's recipe in "
      "llm-compressor's format, which --recipe reads back (as it reads the "
      "recipe.yaml llm-compressor writes: SmoothQuantModifier, "
      "AWQModifier, and GPTQModifier and QuantizationModifier with weight "
      "schemes whose input activations are dynamic, static or absent; "
      "anything else is refused by name); it appears at once, complete. A "
      "compressed-tensors preset (--scheme, or `preset` in a recipe: FP8, "
      "FP8_DYNAMIC, FP8_BLOCK, W8A8, NVFP4, NVFP4A16, MXFP4A16, ...) is "
      "quantized as compressed-tensors does (static input activation "
      "scales calibrated on the data) and stored in the format it calls "
      "for (float-quantized, nvfp4-pack-quantized, ...; docs/schemes.md). "
      "When MODEL's .pt2 "
      "holds no weights (`tracecut export --meta`), or MODEL is a "
      "checkpoint directory without a .pt2 that tracecut builds from its "
      "config.json (Llama, Mistral, Qwen2, Qwen3, Phi-3, Granite, OLMo 2: "
      "no export needed), "
      "the "
      "weights are "
      "streamed: each subgraph's are read from the safetensors when it "
      "runs, and written as a shard and released when it is done, so "
      "memory holds one subgraph's weights whatever the model's size "
      "(--stream-weights=false loads the whole model first). Such a "
      "model computes in float32 unless --dtype says otherwise: "
      "--dtype=auto computes in config.json's dtype (bfloat16, as "
      "llm-compressor does; Hessians and GPTQ stay float32). "
      "--format=torchscript writes OUT.pt, a TorchScript model "
      "with quantize-dequantized weights and the parameters as buffers "
      "(<linear>.weight_scale, .weight_zero_point, .input_scale, ...); "
      "--report writes a JSON report (scales, zero points, per-layer output "
      "error against round-to-nearest, timings).\n\n"
      "--data reads the model's inputs, N samples along the first "
      "dimension of every tensor: a torch.save'd tensor (the first input), "
      "tuple or list (inputs in order), or dict (by input name), or a "
      ".safetensors file (by tensor name): images [N, 3, H, W], audio "
      "features, encoder-decoder pairs (input_features + "
      "decoder_input_ids). Each is checked against the model's example "
      "input (integer or floating point, rank; converted to its dtype) and "
      "token ids against the config's vocabulary. For a model that takes "
      "token ids only, --data also reads an int tensor [N, seq], a list of "
      "samples (tokenizer-style dicts with input_ids) or JSON lines (one "
      "array of ints per line); attention_mask, token_type_ids and "
      "position_ids the file leaves out are made from the ids. "
      "--synthetic=N draws N deterministic samples of --seq-len tokens from "
      "the config's vocabulary.\n\n"
      "--input and --example-inputs describe example inputs for tracing a "
      "model that embeds none, and --config gives a config.json in place "
      "of the embedded one (as for `tracecut trace`).\n\n"
      "A Linear that no calibration token reaches (an MoE expert the "
      "router never picks) is quantized round-to-nearest from its own "
      "weights, with a warning and an entry under uncalibrated_modules in "
      "the report; NaN or Inf in the model's weights or in a computed scale "
      "is an error and nothing is written.\n\n"
      "After each subgraph a checkpoint goes to OUT.pt.run/ (--run-dir); a "
      "killed run continues with --resume and gives byte-identical output. "
      "A run that fails removes what it wrote.\n\n"
      "--nproc-per-node=N (or torchrun's RANK / WORLD_SIZE / MASTER_ADDR / "
      "MASTER_PORT) calibrates data-parallel: each rank on its share of the "
      "samples, statistics combined over c10d, only rank 0 writing "
      "(docs/distributed.md). Streaming works there as in one process. Each "
      "rank checkpoints into OUT.pt.run/rank-R-of-N/; a killed run continues "
      "with --resume and the same world size (another is refused), with the "
      "bytes of an uninterrupted run of that size.";
  c.flags = CalibrateFlags();
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunCalibrate;
  return c;
}

const bool kRegistered = RegisterSubcommand(CalibrateCommand());

}  // namespace
}  // namespace tracecut::cli
