// `tracecut demo`: the whole flow on the bundled tiny Llama — trace,
// partition, sequential GPTQ W4 g128 on synthetic data, and the final-logit
// error of GPTQ against round-to-nearest.

#include <torch/script.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "partition/partitioner.h"
#include "partition/plan.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"
#include "pipelines/progress.h"
#include "pipelines/recipe.h"
#include "runtime/torch_status.h"
#include "tools/cli/common.h"
#include "util/files.h"
#include "util/json.h"
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

absl::Status RunDemo(const ParsedArgs& args, Io& io) {
  std::string model;
  if (std::optional<std::string> m = args.Get("model")) {
    model = UserPath(*m);
  } else {
    ASSIGN_OR_RETURN(model, FindBundledModel());
  }
  int64_t samples = 64;
  if (std::optional<std::string> s = args.Get("samples")) {
    if (!absl::SimpleAtoi(*s, &samples) || samples < 1) {
      return UsageError(
          absl::StrCat("--samples needs an integer >= 1, got '", *s, "'"));
    }
  }
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
  pipelines::Progress progress(&io.err, live);
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
  const pipelines::CalibrationResults& g = runs[0].outcome->results;
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

Subcommand DemoCommand() {
  Subcommand c;
  c.name = "demo";
  c.synopsis = "[--model=FILE] [--samples=N] [-o DIR] [--json]";
  c.summary = "The whole flow on the bundled tiny Llama.";
  c.description =
      "Traces the bundled 2-layer Llama fixture, prints its partition into "
      "decoder layers, runs sequential GPTQ W4 g128 (and round-to-nearest "
      "for comparison) on synthetic calibration data with progress, and "
      "prints per-layer and final-logit errors of both. The quantized "
      "models, their reports and summary.json go to DIR (default "
      "./tracecut-demo-out, relative to where `bazel run` was started).";
  c.flags = {
      FlagSpec::Value("model", "FILE",
                      "use this Llama-style model instead of the bundled one"),
      FlagSpec::Value("samples", "N", "calibration samples (64)"),
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
