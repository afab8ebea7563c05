// `tracecut demo`: the main job on a small transformers Llama generated
// with seeded weights — export --meta, partition, GPTQ W4A16 and
// round-to-nearest into compressed-tensors checkpoints, both loaded back with
// transformers and their final logits compared with the original's — and
// the HTML report. `demo --torchscript`: the older flow on the bundled
// TorchScript fixture.

#include <spawn.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "partition/module_sizes.h"
#include "partition/partitioner.h"
#include "partition/plan.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"
#include "pipelines/recipe.h"
#include "pipelines/report_html.h"
#include "runtime/device.h"
#include "runtime/torch_status.h"
#include "tools/cli/common.h"
#include "util/files.h"
#include "util/json.h"
#include "util/progress.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

using util::Json;

constexpr char kFixture[] = "tracecut/tests/fixtures/llama.pt";

constexpr char kGptqRecipe[] = R"pb(
  modifiers {
    gptq {
      scheme { bits: 4 symmetric: true group_size: 128 }
      targets: "Linear"
      ignore: "lm_head"
    }
  }
  pipeline: SEQUENTIAL
)pb";

constexpr char kRtnRecipe[] = R"pb(
  modifiers {
    rtn {
      scheme { bits: 4 symmetric: true group_size: 128 }
      targets: "Linear"
      ignore: "lm_head"
    }
  }
  pipeline: SEQUENTIAL
)pb";

// The bundled model: a runfile of the tracecut binary.
absl::StatusOr<std::string> FindBundledModel() {
  absl::StatusOr<std::string> path = FindRunfile(kFixture);
  if (!path.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "cannot find the bundled model (", path.status().message(),
        "); build with bazel (bazel run //tools:tracecut -- demo) or pass "
        "--model=FILE"));
  }
  return path;
}

absl::StatusOr<pipelines::OutputError> LogitError(
    const torch::jit::Module& reference, const std::string& calibrated,
    const pipelines::CalibrationData& eval) {
  ASSIGN_OR_RETURN(
      torch::jit::Module m,
      runtime::TorchCall(absl::StrCat("loading ", calibrated),
                         [&] { return torch::jit::load(calibrated); }));
  return pipelines::CompareOutputs(reference, m, eval);
}

// --samples, shared by both demos (default 64).
absl::StatusOr<int64_t> ParseSamples(const ParsedArgs& args) {
  int64_t samples = 64;
  if (std::optional<std::string> s = args.Get("samples")) {
    if (!absl::SimpleAtoi(*s, &samples) || samples < 1) {
      return UsageError(
          absl::StrCat("--samples needs an integer >= 1, got '", *s, "'"));
    }
  }
  return samples;
}

absl::Status RunTorchScriptDemo(const ParsedArgs& args, Io& io) {
  if (args.Has("device")) {
    return UsageError("--device is for the main demo, not --torchscript");
  }
  std::string model;
  if (std::optional<std::string> m = args.Get("model")) {
    model = UserPath(*m);
  } else {
    ASSIGN_OR_RETURN(model, FindBundledModel());
  }
  ASSIGN_OR_RETURN(const int64_t samples, ParseSamples(args));
  const std::string out_dir =
      UserPath(args.Get("output").value_or("tracecut-demo-out"));
  const bool json = args.Has("json");
  std::ostream& text = json ? io.err : io.out;

  // 1. Trace.
  ASSIGN_OR_RETURN(pipelines::LoadedForCalibration loaded,
                   pipelines::LoadForCalibration(model));
  int64_t modules = 0;
  for (const ir::Node* n : loaded.model.graph().nodes()) {
    if (n->op() == ir::OpKind::kCallModule) ++modules;
  }
  text << "== trace: " << model << "\n"
       << loaded.model.graph().size() << " nodes, " << modules
       << " leaf-module calls, model type '" << loaded.model_type << "'\n\n";

  // 2. Partition.
  partition::PartitionOptions popts;
  popts.targets = loaded.default_targets;
  ASSIGN_OR_RETURN(partition::Partition partition,
                   partition::PartitionGraph(loaded.model.graph(), popts));
  text << "== partition\n"
       << partition::PlanToText(partition::BuildPlan(partition, popts)) << "\n";

  // 3. Calibrate: GPTQ, then round-to-nearest for comparison.
  RETURN_IF_ERROR(util::MakeDirs(out_dir));
  const bool live = &io.err == &std::cerr && isatty(STDERR_FILENO) != 0;
  util::Progress progress(&io.err, live);
  struct Run {
    const char* name;
    const char* recipe;
    std::string model_path;
    std::string report_path;
    std::optional<pipelines::CalibrateOutcome> outcome;
    pipelines::OutputError error;
  };
  Run runs[] = {
      {"gptq",
       kGptqRecipe,
       absl::StrCat(out_dir, "/llama-gptq-w4g128.pt"),
       absl::StrCat(out_dir, "/llama-gptq-w4g128.report.json"),
       {},
       {}},
      {"rtn",
       kRtnRecipe,
       absl::StrCat(out_dir, "/llama-rtn-w4g128.pt"),
       absl::StrCat(out_dir, "/llama-rtn-w4g128.report.json"),
       {},
       {}},
  };
  for (Run& run : runs) {
    text << "== calibrate: " << run.name << " W4 g128, sequential, " << samples
         << " synthetic samples\n"
         << std::flush;
    pipelines::CalibrateOptions o;
    o.model_path = model;
    ASSIGN_OR_RETURN(
        o.recipe,
        pipelines::ParseRecipe(run.recipe, absl::StrCat(run.name, " recipe")));
    o.recipe_source = absl::StrCat("(built-in ", run.name, " W4 g128)");
    o.synthetic_samples = samples;
    o.batch_size = 8;
    o.output_path = run.model_path;
    o.report_path = run.report_path;
    o.progress = &progress;
    ASSIGN_OR_RETURN(run.outcome, pipelines::Calibrate(o));
  }

  // 4. Final-logit error on held-out synthetic data.
  if (!loaded.vocab_size.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, " has no vocab_size in its config.json"));
  }
  ASSIGN_OR_RETURN(at::Tensor eval_tokens,
                   pipelines::SyntheticTokens(32, 16, *loaded.vocab_size,
                                              /*seed=*/1234));
  ASSIGN_OR_RETURN(pipelines::CalibrationData eval,
                   pipelines::MakeCalibrationData(
                       eval_tokens, pipelines::ModelInputNames(loaded.model), 8,
                       "held-out"));
  for (Run& run : runs) {
    ASSIGN_OR_RETURN(run.error,
                     LogitError(loaded.model.module(), run.model_path, eval));
  }

  // Both columns on the same inputs: the GPTQ run's calibration inputs of
  // each layer, with its weights quantized by GPTQ and by round-to-nearest.
  // (The RTN run's own layer inputs differ: its earlier layers are RTN's.)
  const modifiers::CalibrationResults& g = runs[0].outcome->results;
  text << "\n== per-layer relative output error on the calibration inputs "
          "(both on the GPTQ run's layer inputs)\n";
  text << absl::StrFormat("%-36s %8s %8s\n", "module", "GPTQ", "RTN");
  for (const auto& [path, rec] : g.modules) {
    text << absl::StrFormat("%-36s %8.4f %8.4f\n", path, rec.weight_error,
                            rec.rtn_error);
  }
  const double gptq_err = runs[0].error.relative;
  const double rtn_err = runs[1].error.relative;
  text << absl::StrFormat(
      "\n== final-logit relative error (32 held-out samples)\n"
      "GPTQ W4 g128: %.4f\nRTN  W4 g128: %.4f\n%s\n",
      gptq_err, rtn_err,
      gptq_err < rtn_err
          ? absl::StrFormat("GPTQ's error is %.2fx lower than RTN's",
                            rtn_err / gptq_err)
          : std::string("GPTQ did not beat RTN on this data"));
  text << "\noutputs in " << out_dir << "/\n";

  Json summary = Json::object();
  summary["model"] = Json(model);
  summary["output_dir"] = Json(out_dir);
  summary["subgraphs"] = Json(static_cast<int64_t>(partition.subgraphs.size()));
  summary["calibration_samples"] = Json(samples);
  Json errors = Json::object();
  for (const Run& run : runs) {
    Json e = Json::object();
    e["model"] = Json(run.model_path);
    e["report"] = Json(run.report_path);
    e["final_logit_relative_error"] = Json(run.error.relative);
    e["final_logit_max_abs_error"] = Json(run.error.max_abs);
    errors[run.name] = std::move(e);
  }
  summary["results"] = std::move(errors);
  const std::string summary_text = util::DumpJson(summary, 2) + "\n";
  RETURN_IF_ERROR(
      WriteOutput(absl::StrCat(out_dir, "/summary.json"), summary_text, io));
  if (json) io.out << summary_text;
  return absl::OkStatus();
}

// The main job (the default).

constexpr char kDemoScript[] = "tracecut/python/tracecut_demo.py";
constexpr char kExportScript[] = "tracecut/python/tracecut_export.py";
constexpr char kPython[] = "libtorch/python";

absl::StatusOr<std::string> DemoRunfile(const std::string& name) {
  absl::StatusOr<std::string> path = FindRunfile(name);
  if (!path.ok()) {
    return absl::NotFoundError(absl::StrCat(
        path.status().message(),
        "; run tracecut built by bazel (bazel run //tools:tracecut -- demo)"));
  }
  return path;
}

// Runs `argv` (argv[0] a path) to completion, its stdout sent to our stderr
// (stdout stays for --json); an error naming `what` unless it exits 0.
absl::Status RunChild(const std::vector<std::string>& argv,
                      absl::string_view what, Io& io) {
  io.out.flush();
  io.err.flush();
  std::cout.flush();
  std::cerr.flush();
  std::vector<char*> c_argv;
  std::vector<std::string> copy = argv;
  for (std::string& a : copy) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  const int err =
      posix_spawn(&pid, c_argv[0], &actions, nullptr, c_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::InternalError(
        absl::StrCat("cannot run ", argv[0], ": ", std::strerror(err)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("waiting for ", what, ": ", std::strerror(errno)));
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      what, " failed (",
      WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                        : absl::StrCat("signal ", WTERMSIG(status)),
      "); its message is above"));
}

std::string Elapsed(absl::Time start) {
  return absl::StrFormat("(%.1f s)",
                         absl::ToDoubleSeconds(absl::Now() - start));
}

// A number from the compare step's JSON.
double Field(const Json& object, const char* key) {
  const Json* v = util::FindMember(object, key);
  return v != nullptr && v->is_number() ? v->get<double>() : NAN;
}

// One calibration of the demo's model: GPTQ or round-to-nearest W4A16.
struct DemoRun {
  const char* name;
  const char* title;
  const char* recipe;
  std::string dir;
  std::string report;
  int64_t samples;
  std::optional<pipelines::CalibrateOutcome> outcome;
};

// Calibrates `ckpt` as `run` says, into a compressed-tensors checkpoint
// with its weights streamed layer by layer.
absl::Status CalibrateDemoRun(const std::string& ckpt,
                              const c10::Device& device,
                              util::Progress& progress, std::ostream& text,
                              DemoRun& run) {
  const absl::Time t = absl::Now();
  text << "== tracecut calibrate " << ckpt << " (" << run.name
       << " W4A16: int4 weights, symmetric, group 128) --synthetic="
       << run.samples << " -o " << run.dir
       << (device.is_cpu()
               ? std::string()
               : absl::StrCat(" --device=", runtime::DeviceName(device)))
       << "\n"
       << std::flush;
  pipelines::CalibrateOptions o;
  o.model_path = ckpt;
  ASSIGN_OR_RETURN(
      o.recipe,
      pipelines::ParseRecipe(run.recipe, absl::StrCat(run.name, " recipe")));
  o.recipe_source = absl::StrCat("(built-in ", run.name, " W4A16 g128)");
  o.synthetic_samples = run.samples;
  o.synthetic_seq_len = 32;
  o.batch_size = 8;
  o.output_format =
      pipelines::CalibrateOptions::OutputFormat::kCompressedTensors;
  o.output_path = run.dir;
  o.report_path = run.report;
  o.progress = &progress;
  o.device = device;
  ASSIGN_OR_RETURN(run.outcome, pipelines::Calibrate(o));
  text << "wrote " << run.dir << " " << Elapsed(t) << "\n\n";
  return absl::OkStatus();
}

// Loads the original and both outputs with transformers and prints their
// final-logit errors; returns the comparison's "outputs" object.
absl::StatusOr<Json> CompareDemoOutputs(const std::string& python,
                                        const std::string& demo_script,
                                        const std::string& ckpt,
                                        const std::string& out_dir,
                                        const DemoRun (&runs)[2],
                                        std::ostream& text, Io& io) {
  const absl::Time t = absl::Now();
  const std::string errors_path = absl::StrCat(out_dir, "/logit_errors.json");
  text << "== transformers: AutoModelForCausalLM.from_pretrained(...) of the "
          "original and both outputs\n"
       << std::flush;
  RETURN_IF_ERROR(
      RunChild({python, demo_script, "compare", ckpt, runs[0].dir, runs[1].dir,
                absl::StrCat("--json-out=", errors_path)},
               "loading the outputs with transformers", io));
  ASSIGN_OR_RETURN(std::string errors_text, util::ReadFile(errors_path));
  ASSIGN_OR_RETURN(Json errors, util::ParseJson(errors_text, errors_path));
  const Json* outputs = util::FindMember(errors, "outputs");
  if (outputs == nullptr) {
    return absl::InternalError(absl::StrCat(errors_path, " has no outputs"));
  }
  double rel[2] = {NAN, NAN};
  for (int i = 0; i < 2; ++i) {
    const Json* e = util::FindMember(*outputs, runs[i].dir);
    if (e == nullptr) {
      return absl::InternalError(
          absl::StrCat(errors_path, " has no result for ", runs[i].dir));
    }
    rel[i] = Field(*e, "relative_error");
    text << absl::StrFormat(
        "%s W4A16 g128, loaded by transformers: final-logit relative error "
        "%.4f, top-1 token agreement %.1f%%\n",
        runs[i].title, rel[i], 100 * Field(*e, "top1_agreement"));
  }
  text << (rel[0] < rel[1]
               ? absl::StrFormat("GPTQ's error is %.2fx lower than RTN's",
                                 rel[1] / rel[0])
               : std::string("GPTQ did not beat RTN on this data"))
       << " (8 x 32 held-out tokens) " << Elapsed(t) << "\n\n";
  return *outputs;
}

absl::Status RunMainDemo(const ParsedArgs& args, Io& io) {
  if (args.Has("model")) {
    return UsageError(
        "--model is for --torchscript; the main demo generates its model");
  }
  ASSIGN_OR_RETURN(const int64_t samples, ParseSamples(args));
  // Before anything asks LibTorch about CUDA (runtime/device.h).
  absl::StatusOr<c10::Device> device =
      runtime::ResolveDevice(args.Get("device").value_or("cpu"));
  if (device.status().code() == absl::StatusCode::kInvalidArgument) {
    return UsageError(device.status().message());
  }
  RETURN_IF_ERROR(device.status());
  const std::string out_dir =
      UserPath(args.Get("output").value_or("tracecut-demo-out"));
  const bool json = args.Has("json");
  std::ostream& text = json ? io.err : io.out;
  ASSIGN_OR_RETURN(std::string python, DemoRunfile(kPython));
  ASSIGN_OR_RETURN(std::string demo_script, DemoRunfile(kDemoScript));
  ASSIGN_OR_RETURN(std::string export_script, DemoRunfile(kExportScript));
  RETURN_IF_ERROR(util::MakeDirs(out_dir));
  const std::string ckpt = absl::StrCat(out_dir, "/llama");
  const std::string program = absl::StrCat(ckpt, "/model.pt2");
  const absl::Time demo_start = absl::Now();

  // 1. The model: transformers' LlamaForCausalLM, seeded, as a checkpoint.
  absl::Time t = absl::Now();
  text << "== model: transformers LlamaForCausalLM, 2 layers, hidden 256, "
          "seeded weights -> "
       << ckpt << "\n"
       << std::flush;
  RETURN_IF_ERROR(RunChild({python, demo_script, "make", ckpt, "--seed=0"},
                           "generating the demo model", io));
  text << "saved with save_pretrained " << Elapsed(t) << "\n\n";

  // 2. Its graph: torch.export on the meta device (no weights inside; they
  // are read from the safetensors when calibration needs them).
  t = absl::Now();
  text << "== tracecut export " << ckpt << " -o " << program << " --meta\n"
       << std::flush;
  RETURN_IF_ERROR(
      RunChild({python, export_script, ckpt, "-o", program, "--meta"},
               "tracecut export", io));
  text << "exported " << Elapsed(t) << "\n\n";

  // 3. Partition at the config's decoder layers.
  t = absl::Now();
  ASSIGN_OR_RETURN(pipelines::LoadedForCalibration loaded,
                   pipelines::LoadForCalibration(ckpt));
  partition::PartitionOptions popts;
  popts.targets = loaded.default_targets;
  popts.param_bytes = partition::ModuleParamBytes(loaded.model.module());
  ASSIGN_OR_RETURN(partition::Partition partition,
                   partition::PartitionGraph(loaded.model.graph(), popts));
  text << "== tracecut partition " << ckpt << "\n"
       << partition::PlanToText(partition::BuildPlan(partition, popts))
       << Elapsed(t) << "\n\n";

  // 4. Calibrate: GPTQ, then round-to-nearest, each into a
  // compressed-tensors checkpoint, the weights streamed layer by layer.
  const bool live = &io.err == &std::cerr && isatty(STDERR_FILENO) != 0;
  util::Progress progress(&io.err, live);
  // Round-to-nearest's weights do not depend on data: one batch, only for
  // its report.
  DemoRun runs[] = {
      {"gptq",
       "GPTQ",
       kGptqRecipe,
       absl::StrCat(out_dir, "/llama-gptq-w4a16"),
       absl::StrCat(out_dir, "/llama-gptq-w4a16.report.json"),
       samples,
       {}},
      {"rtn",
       "RTN ",
       kRtnRecipe,
       absl::StrCat(out_dir, "/llama-rtn-w4a16"),
       absl::StrCat(out_dir, "/llama-rtn-w4a16.report.json"),
       std::min<int64_t>(samples, 8),
       {}},
  };
  for (DemoRun& run : runs) {
    RETURN_IF_ERROR(CalibrateDemoRun(ckpt, *device, progress, text, run));
  }

  // 5. The page: GPTQ's report (it holds RTN's error per module too).
  const std::string html_path =
      absl::StrCat(out_dir, "/llama-gptq-w4a16.report.html");
  ASSIGN_OR_RETURN(std::string html,
                   pipelines::CalibrationReportHtml(runs[0].outcome->report,
                                                    runs[0].report));
  RETURN_IF_ERROR(WriteOutput(html_path, html, io));

  const modifiers::CalibrationResults& g = runs[0].outcome->results;
  text << "== per-module relative output error on the calibration inputs "
          "(both on the GPTQ run's layer inputs)\n";
  text << absl::StrFormat("%-36s %8s %8s\n", "module", "GPTQ", "RTN");
  for (const auto& [path, rec] : g.modules) {
    text << absl::StrFormat("%-36s %8.4f %8.4f\n", path, rec.weight_error,
                            rec.rtn_error);
  }
  text << "\n";

  // 6. Both outputs loaded by transformers (compressed-tensors decompresses
  // the packed weights); final logits against the original model's.
  ASSIGN_OR_RETURN(Json outputs, CompareDemoOutputs(python, demo_script, ckpt,
                                                    out_dir, runs, text, io));

  text << "outputs in " << out_dir << "/ " << Elapsed(demo_start) << "\n"
       << "  llama/                      the generated checkpoint, its "
          "model.pt2 (export --meta)\n"
       << "  llama-gptq-w4a16/           compressed-tensors checkpoint, GPTQ\n"
       << "  llama-rtn-w4a16/            compressed-tensors checkpoint, "
          "round-to-nearest\n"
       << "  *.report.json               calibration reports\n"
       << "HTML report: " << html_path << "\n";

  Json summary = Json::object();
  summary["model"] = Json(ckpt);
  summary["output_dir"] = Json(out_dir);
  summary["subgraphs"] = Json(static_cast<int64_t>(partition.subgraphs.size()));
  summary["calibration_samples"] = Json(samples);
  summary["html_report"] = Json(html_path);
  Json results = Json::object();
  for (int i = 0; i < 2; ++i) {
    Json e = *util::FindMember(outputs, runs[i].dir);
    e["model"] = Json(runs[i].dir);
    e["report"] = Json(runs[i].report);
    results[runs[i].name] = std::move(e);
  }
  summary["results"] = std::move(results);
  const std::string summary_text = util::DumpJson(summary, 2) + "\n";
  RETURN_IF_ERROR(
      WriteOutput(absl::StrCat(out_dir, "/summary.json"), summary_text, io));
  if (json) io.out << summary_text;
  return absl::OkStatus();
}

absl::Status RunDemo(const ParsedArgs& args, Io& io) {
  if (args.Has("torchscript")) return RunTorchScriptDemo(args, io);
  return RunMainDemo(args, io);
}

Subcommand DemoCommand() {
  Subcommand c;
  c.name = "demo";
  c.synopsis =
      "[--torchscript [--model=FILE]] [--samples=N] [--device=DEV] [-o DIR] "
      "[--json]";
  c.summary =
      "The main job on a generated transformers Llama, with an HTML report.";
  c.description =
      "Generates a small transformers LlamaForCausalLM (2 layers, hidden "
      "256) with seeded weights as a Hugging Face checkpoint (no download), "
      "exports it with `tracecut export --meta`, prints its partition into "
      "decoder layers, calibrates it with GPTQ W4A16 (int4 weights, group "
      "128) and with round-to-nearest on synthetic token ids, streaming the "
      "weights layer by layer into compressed-tensors checkpoints, loads "
      "both with transformers (compressed-tensors decompresses them) and "
      "prints their final-logit relative error against the original model. "
      "Everything goes to DIR (default ./tracecut-demo-out, relative to "
      "where `bazel run` was started): the checkpoints, the JSON reports, "
      "the HTML report of the GPTQ run and summary.json.\n\n"
      "--torchscript runs the older flow on the bundled TorchScript Llama "
      "fixture (or --model=FILE): trace, partition, GPTQ and RTN into "
      "TorchScript .pt files, and their final-logit errors.";
  c.flags = {
      FlagSpec::Bool("torchscript",
                     "the older flow on the bundled TorchScript fixture"),
      FlagSpec::Value("model", "FILE",
                      "with --torchscript: this Llama-style model instead "
                      "of the bundled one"),
      FlagSpec::Value("samples", "N", "calibration samples (64)"),
      FlagSpec::Value("device", "DEV",
                      "where the calibrations compute: cpu (default), cuda, "
                      "cuda:N or auto (docs/devices.md)"),
      FlagSpec::Value("output", "DIR", "output directory").Short('o'),
      FlagSpec::Bool("json",
                     "print the summary as JSON on stdout (the tables go to "
                     "stderr)"),
  };
  c.min_positional = 0;
  c.max_positional = 0;
  c.run = RunDemo;
  return c;
}

const bool kRegistered = RegisterSubcommand(DemoCommand());

}  // namespace
}  // namespace tracecut::cli
