// `tracecut transform MODEL.pt --passes=...`: trace a TorchScript model, run
// named passes (transforms/registry.h) on the whole graph or per subgraph,
// and save the result atomically as a .pt. `tracecut debug MODEL.pt
// --passes=...`: the layer-by-layer debugger (transforms/debugger.h).

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "pipelines/report_html.h"
#include "runtime/compare.h"
#include "runtime/device.h"
#include "runtime/device_placement.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "runtime/torch_status.h"
#include "tools/cli/common.h"
#include "tools/cli/compare_flags.h"
#include "tools/cli/model_flags.h"
#include "tracer/hf/config.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "transforms/debugger.h"
#include "transforms/instrumentation.h"
#include "transforms/pass_pipeline.h"
#include "transforms/per_subgraph.h"
#include "transforms/registry.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

using util::Json;

std::vector<std::string> SplitAll(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      std::string s(item);
      s.erase(0, s.find_first_not_of(' '));
      s.erase(s.find_last_not_of(' ') + 1);
      if (!s.empty()) out.push_back(std::move(s));
    }
  }
  return out;
}

std::string FormatError(double e) { return absl::StrFormat("%.3e", e); }

// The pipeline of --passes; unknown names are usage errors listing the
// known passes.
absl::StatusOr<std::unique_ptr<transforms::PassPipeline>> PipelineFromFlag(
    const ParsedArgs& args) {
  std::vector<std::string> names = SplitAll(args.GetAll("passes"));
  if (names.empty()) {
    return UsageError(
        absl::StrCat("--passes=NAME,... is required; known passes: ",
                     absl::StrJoin(transforms::RegisteredPassNames(), ", ")));
  }
  transforms::PassPipelineOptions options;
  // A failing pass leaves its input IR there (Note [Reproducers]).
  options.reproducer_dir = args.Get("reproducer-dir").value_or("");
  auto pipeline = std::make_unique<transforms::PassPipeline>(
      "transform", std::move(options));
  for (const std::string& name : names) {
    absl::StatusOr<std::unique_ptr<transforms::Transformation>> pass =
        transforms::MakePass(name);
    if (!pass.ok()) {
      return UsageError(
          absl::StrCat("unknown pass '", name, "'; known passes: ",
                       absl::StrJoin(transforms::RegisteredPassNames(), ", ")));
    }
    pipeline->AddPass(*std::move(pass));
  }
  return pipeline;
}

// Partition options from --targets/--ignore, falling back to HF defaults.
absl::StatusOr<partition::PartitionOptions> PartitionFromFlags(
    const ParsedArgs& args, const TracedModel& t, bool required) {
  partition::PartitionOptions popts;
  std::optional<tracer::hf::HfDefaults> defaults;
  if (t.options.config.has_value()) {
    defaults = tracer::hf::DefaultsFor(*t.options.config);
  }
  popts.targets = SplitAll(args.GetAll("targets"));
  if (popts.targets.empty() && required && defaults.has_value()) {
    popts.targets = defaults->sequential_targets;
  }
  if (popts.targets.empty() && required) {
    return UsageError(absl::StrCat("no sequential targets known for ",
                                   args.positional()[0],
                                   "; give --targets=TYPE,..."));
  }
  if (defaults.has_value()) {
    popts.ignore = defaults->ignore;
  } else {
    popts.ignore = {"lm_head"};
  }
  return popts;
}

struct PassSummary {
  std::string name;
  bool changed = false;
  int64_t touched = 0;
};

// transform --json's summary; `output` null when nothing was written.
Json TransformSummary(const std::string& model, const std::string* output,
                      bool per_subgraph, const std::vector<PassSummary>& passes,
                      const std::optional<runtime::CompareResult>& compared) {
  Json summary = Json::object();
  summary["model"] = Json(model);
  summary["output"] = output != nullptr ? Json(*output) : Json();
  summary["per_subgraph"] = Json(per_subgraph);
  Json list = Json::array();
  for (const PassSummary& p : passes) {
    Json e = Json::object();
    e["pass"] = Json(p.name);
    e["changed"] = Json(p.changed);
    e["touched_nodes"] = Json(p.touched);
    list.push_back(std::move(e));
  }
  summary["passes"] = std::move(list);
  // The check's result; null without --check (errors null when infinite).
  auto field = [&](auto get) {
    return compared.has_value() ? get(*compared) : Json();
  };
  using R = runtime::CompareResult;
  summary["passed"] = field([](const R& r) { return Json(r.passed); });
  summary["rtol"] = field([](const R& r) { return Json(r.rtol); });
  summary["atol"] = field([](const R& r) { return Json(r.atol); });
  summary["max_abs_error"] =
      field([](const R& r) { return Json(r.max_abs_error); });
  summary["max_rel_error"] =
      field([](const R& r) { return Json(r.max_rel_error); });
  summary["elements"] = field([](const R& r) { return Json(r.elements); });
  summary["violations"] = field([](const R& r) { return Json(r.violations); });
  summary["worst"] = field([](const R& r) { return WorstJson(r.worst); });
  return summary;
}

absl::Status RunTransform(const ParsedArgs& args, Io& io) {
  const std::string model = args.positional()[0];
  const bool json = args.Has("json");
  const bool check = args.Has("check");
  std::optional<std::string> output = args.Get("output");
  ASSIGN_OR_RETURN(std::unique_ptr<transforms::PassPipeline> pipeline,
                   PipelineFromFlag(args));
  ASSIGN_OR_RETURN(runtime::CompareOptions tolerances,
                   CheckOptionsFromFlags(args));
  if (!output.has_value() || output->empty() || *output == "-") {
    return UsageError("-o OUT.pt is required (a file path)");
  }
  // Before tracing, so a bad -o fails fast (and never replaces a device).
  RETURN_IF_ERROR(CheckOutputPath(*output));
  RETURN_IF_ERROR(CheckOutputIsNotInput(*output, args.positional()[0]));

  ASSIGN_OR_RETURN(TracedModel t, LoadAndTrace(args));
  const runtime::GraphModule& gm = t.gm;
  const bool per_subgraph = args.Has("targets");

  std::vector<PassSummary> passes;
  std::optional<runtime::GraphModule> result;
  std::optional<transforms::PerSubgraphResult> sub_result;
  if (per_subgraph) {
    ASSIGN_OR_RETURN(partition::PartitionOptions popts,
                     PartitionFromFlags(args, t, /*required=*/true));
    ASSIGN_OR_RETURN(transforms::PerSubgraphResult r,
                     transforms::RunPerSubgraph(gm, *pipeline, popts));
    for (const auto& pass : pipeline->passes()) {
      passes.push_back({std::string(pass->name()), false, 0});
    }
    for (const transforms::SubgraphRunReport& s : r.subgraphs) {
      for (size_t i = 0; i < s.passes.size() && i < passes.size(); ++i) {
        passes[i].changed |= s.passes[i].changed;
        passes[i].touched += s.passes[i].touched_nodes.size();
      }
    }
    result.emplace(std::move(r.module));
  } else {
    ASSIGN_OR_RETURN(runtime::GraphModule work, gm.Clone());
    transforms::PassChangeRecorder recorder;
    {
      transforms::ScopedInstrumentation scope(*pipeline, recorder);
      RETURN_IF_ERROR(pipeline->Run(work).status());
    }
    for (const transforms::PassChangeRecorder::Entry& e : recorder.entries()) {
      passes.push_back(
          {e.pass, e.changed, static_cast<int64_t>(e.touched_nodes.size())});
    }
    result.emplace(std::move(work));
  }

  std::optional<runtime::CompareResult> compared;
  if (check) {
    ASSIGN_OR_RETURN(tracer::ExampleInputs inputs,
                     tracer::ResolveExampleInputs(t.loaded.module, t.options));
    // One model at a time on the device (they may share tensors).
    auto run = [&](const runtime::GraphModule& m) {
      return runtime::DevicePlacement::WithModuleOn(
          m.module(), tolerances.device, [&]() -> absl::StatusOr<c10::IValue> {
            ASSIGN_OR_RETURN(runtime::Interpreter interp,
                             runtime::Interpreter::Create(m));
            interp.PlaceOn(tolerances.device);
            ASSIGN_OR_RETURN(
                std::vector<c10::IValue> in,
                runtime::ValuesToDevice(inputs.values, tolerances.device));
            ASSIGN_OR_RETURN(c10::IValue out, interp.Run(std::move(in)));
            return runtime::TorchCall("copying the outputs", [&] {
              return runtime::ToDevice(out, c10::Device(c10::kCPU));
            });
          });
    };
    ASSIGN_OR_RETURN(c10::IValue expected, run(gm));
    ASSIGN_OR_RETURN(c10::IValue actual, run(*result));
    absl::StatusOr<runtime::CompareResult> r =
        runtime::CompareValues(actual, expected, tolerances);
    if (!r.ok()) {
      return absl::Status(
          r.status().code(),
          absl::StrCat("check failed: the output after ",
                       absl::StrJoin(SplitAll(args.GetAll("passes")), ","),
                       " cannot be compared with the original's: ",
                       r.status().message()));
    }
    compared = *std::move(r);
  }
  auto print_json = [&](bool written) {
    io.out << util::DumpJson(
                  TransformSummary(model, written ? &*output : nullptr,
                                   per_subgraph, passes, compared),
                  2)
           << "\n";
  };
  if (compared.has_value() && !compared->passed) {
    // Nothing is written; with --json the summary still goes to stdout.
    if (json) print_json(/*written=*/false);
    return absl::InternalError(
        absl::StrCat("check failed after ",
                     absl::StrJoin(SplitAll(args.GetAll("passes")), ","), ": ",
                     compared->FailureSummary("output")));
  }

  runtime::SaveOptions save;
  save.include_extra_files = true;
  // Lean export: what the passes left behind for Reverse (the original
  // conv and BatchNorm modules after a fusion) is not saved.
  save.lowering.prune_unused = true;
  save.extra_files = t.loaded.extra_files;
  for (const auto& [k, v] : result->extra_files()) save.extra_files.erase(k);
  RETURN_IF_ERROR(runtime::SaveTorchScript(*result, *output, save));

  if (json) print_json(/*written=*/true);
  if (compared.has_value()) {
    io.err << "tracecut transform: check passed, " << compared->ErrorSummary()
           << " (atol " << compared->atol << ", rtol " << compared->rtol
           << ")\n";
  }
  if (!json) {
    for (const PassSummary& p : passes) {
      io.err << "tracecut transform: " << p.name << ": "
             << (p.changed ? "changed" : "unchanged") << ", " << p.touched
             << " nodes touched\n";
    }
    io.err << "tracecut transform: wrote " << *output << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunDebug(const ParsedArgs& args, Io& io) {
  const bool json = args.Has("json");
  ASSIGN_OR_RETURN(std::unique_ptr<transforms::PassPipeline> pipeline,
                   PipelineFromFlag(args));
  if (std::optional<std::string> html_path = args.Get("html")) {
    RETURN_IF_ERROR(CheckOutputPath(*html_path));
  }
  transforms::DebugOptions dopts;
  ASSIGN_OR_RETURN(dopts.compare, CompareOptionsFromFlags(args));
  ASSIGN_OR_RETURN(TracedModel t, LoadAndTrace(args));
  ASSIGN_OR_RETURN(dopts.partition,
                   PartitionFromFlags(args, t, /*required=*/true));
  ASSIGN_OR_RETURN(tracer::ExampleInputs inputs,
                   tracer::ResolveExampleInputs(t.loaded.module, t.options));
  ASSIGN_OR_RETURN(
      transforms::DebugReport report,
      transforms::DebugPipeline(t.gm, *pipeline, inputs.values, dopts));

  auto label = [&](int index) {
    for (const transforms::DebugSubgraph& s : report.subgraphs) {
      if (s.index == index) {
        return absl::StrCat("#", index, " (",
                            s.module_paths.empty()
                                ? "head"
                                : absl::StrJoin(s.module_paths, ", "),
                            ")");
      }
    }
    return absl::StrCat("#", index);
  };
  const std::string tolerances =
      absl::StrCat("atol ", absl::StrFormat("%g", report.atol), " + rtol ",
                   absl::StrFormat("%g", report.rtol), "*|ref|");
  std::string verdict;
  if (report.first_exceeding >= 0) {
    const transforms::DebugStep& s = report.steps[report.first_exceeding];
    std::string why;
    if (!s.mismatch.empty()) {
      why = absl::StrCat("outputs changed: ", s.mismatch);
    } else {
      why = absl::StrCat(s.violations, " of ", s.elements,
                         " elements over; max abs ", FormatError(s.max_abs),
                         ", max rel ", FormatError(s.max_rel));
      if (s.worst.has_value()) {
        absl::StrAppend(&why, "; worst at output ", s.worst->ToString());
      }
    }
    verdict =
        absl::StrCat("first over tolerance (", tolerances, "): subgraph ",
                     label(s.subgraph), ", pass ", s.pass, " (", why, ")");
  } else {
    verdict = absl::StrCat("all within tolerance (", tolerances, ")");
  }
  if (std::optional<std::string> html_path = args.Get("html")) {
    ASSIGN_OR_RETURN(Json parsed,
                     util::ParseJson(report.ToJson(), "the debug report"));
    ASSIGN_OR_RETURN(std::string html,
                     pipelines::DebugReportHtml(parsed, args.positional()[0]));
    RETURN_IF_ERROR(WriteOutput(*html_path, html, io));
    io.err << "tracecut debug: wrote " << *html_path << "\n";
  }
  if (json) {
    io.out << report.ToJson() << "\n";
    io.err << "tracecut debug: " << verdict << "\n";
    return absl::OkStatus();
  }
  io.out << absl::StrFormat("%-32s %-36s %10s %10s %7s\n", "subgraph", "pass",
                            "max_abs", "max_rel", "touched");
  for (const transforms::DebugStep& s : report.steps) {
    io.out << absl::StrFormat("%-32s %-36s %10s %10s %7d%s\n",
                              label(s.subgraph), s.pass, FormatError(s.max_abs),
                              FormatError(s.max_rel), s.touched_nodes.size(),
                              s.exceeds ? "  !" : "");
  }
  io.out << verdict << "\n";
  return absl::OkStatus();
}

std::vector<FlagSpec> TraceFlags() {
  std::vector<FlagSpec> flags = {
      FlagSpec::Value("passes", "NAME,...", "passes to run, in order")
          .Repeated(),
      FlagSpec::Value("targets", "TYPE,...",
                      "module types that start a subgraph (run the passes "
                      "per subgraph)")
          .Repeated(),
      FlagSpec::Bool("json", "print a JSON summary on stdout"),
      FlagSpec::Value("reproducer-dir", "DIR",
                      "when a pass fails, write its input IR and name there"),
  };
  for (FlagSpec& f : ModelFlags()) flags.push_back(std::move(f));
  return flags;
}

Subcommand TransformCommand() {
  Subcommand c;
  c.name = "transform";
  c.synopsis =
      "MODEL.pt --passes=NAME,... [--targets=TYPE,...] "
      "[--leaf=TYPE_OR_PATH]... "
      "[--check [--rtol=X] [--atol=X]] [--reproducer-dir=DIR] [--json] "
      "-o OUT.pt";
  c.summary = "Run named transform passes on a traced model and save it.";
  c.description =
      "Traces MODEL.pt as `tracecut trace` does, runs the passes named by "
      "--passes as one pipeline (on the whole graph, or on each subgraph of "
      "the partition at --targets), and saves the result atomically to "
      "OUT.pt, keeping the model's embedded files and only the modules and "
      "tensors the transformed graph uses. --check runs the original "
      "and the result on the model's example inputs and fails (writing "
      "nothing) unless " +
      ToleranceRule() +
      ", naming the worst element; else it prints the max abs and rel "
      "errors.";
  c.flags = TraceFlags();
  c.flags.push_back(FlagSpec::Bool(
      "check", "compare original and result on the example inputs"));
  for (FlagSpec& f : CompareFlags()) c.flags.push_back(std::move(f));
  c.flags.push_back(
      FlagSpec::Value("output", "FILE", "where to save the .pt").Short('o'));
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunTransform;
  return c;
}

Subcommand DebugCommand() {
  Subcommand c;
  c.name = "debug";
  c.synopsis =
      "MODEL.pt --passes=NAME,... [--targets=TYPE,...] [--rtol=X] "
      "[--atol=X] [--reproducer-dir=DIR] [--html=FILE] [--json]";
  c.summary = "Find which pass breaks which layer, layer by layer.";
  c.description =
      "Partitions the traced model at --targets (default: from the HF "
      "config), runs the passes on each subgraph alone and compares each "
      "subgraph's outputs on its cached inputs before and after every pass. "
      "Prints a table (or the report as JSON) and the first (subgraph, pass) "
      "whose outputs fail " +
      ToleranceRule() +
      " against the outputs before the pass, with its worst element. "
      "--tolerance=X is an alias of --rtol=X. --html=FILE also writes the "
      "report as a self-contained HTML page: each pass's step and "
      "cumulative error per subgraph as bar charts, and the table. Exits 0 "
      "either way.";
  c.flags = TraceFlags();
  c.flags.push_back(
      FlagSpec::Value("html", "FILE", "write the report as an HTML page here"));
  for (FlagSpec& f : CompareFlags(/*tolerance_alias=*/true)) {
    c.flags.push_back(std::move(f));
  }
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunDebug;
  return c;
}

const bool kTransformRegistered = RegisterSubcommand(TransformCommand());
const bool kDebugRegistered = RegisterSubcommand(DebugCommand());

}  // namespace
}  // namespace tracecut::cli
