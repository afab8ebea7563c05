// `tracecut partition MODEL.pt`: trace a TorchScript model and split its
// graph into sequential subgraphs (partition/partitioner.h), printing the
// plan as a table, JSON or DOT, and optionally checking it numerically.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "partition/check.h"
#include "partition/module_sizes.h"
#include "partition/partitioner.h"
#include "partition/plan.h"
#include "runtime/compare.h"
#include "tools/cli/common.h"
#include "tools/cli/compare_flags.h"
#include "tools/cli/model_flags.h"
#include "tracer/hf/config.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

using util::Json;

// Every comma-separated item of every value of a repeated flag.
std::vector<std::string> SplitAll(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      out.emplace_back(item);
    }
  }
  return out;
}

// "#3 (model.layers.2)" or "#0 (head)".
std::string SubgraphLabel(const partition::Partition& p, int index) {
  if (index < 0 || index >= static_cast<int>(p.subgraphs.size())) {
    return absl::StrCat("#", index);
  }
  const auto& paths = p.subgraphs[index].module_paths;
  return absl::StrCat("#", index, " (",
                      paths.empty() ? "head" : absl::StrJoin(paths, ", "), ")");
}

// The one line of a failed check: how many elements of what exceed the
// tolerances, the worst (its value path and index), and where the
// partitioned run first diverges from the whole graph.
std::string CheckFailure(const partition::Partition& p,
                         const partition::CheckResult& r) {
  std::string out = "check failed: ";
  if (!r.output.passed) {
    absl::StrAppend(&out, r.output.FailureSummary("model output"));
    if (r.first_failing >= 0) {
      absl::StrAppend(&out, "; first subgraph over tolerance ",
                      SubgraphLabel(p, r.first_failing));
    }
  } else {
    // The model's output passed, a subgraph's values did not.
    absl::StrAppend(&out, "subgraph ", SubgraphLabel(p, r.first_failing), ": ",
                    r.subgraphs[r.first_failing].FailureSummary("output"));
  }
  if (r.first_divergent >= 0 && r.first_divergent != r.first_failing) {
    absl::StrAppend(&out, "; first divergent subgraph ",
                    SubgraphLabel(p, r.first_divergent));
  }
  return out;
}

// --json's stdout: the plan, model, format, output and the check result.
// Non-finite errors are null.
absl::StatusOr<std::string> JsonSummary(
    const partition::PartitionPlan& plan, const std::string& model,
    const std::string& format, const std::optional<std::string>& output,
    const std::optional<partition::CheckResult>& result) {
  ASSIGN_OR_RETURN(Json summary,
                   util::ParseJson(partition::PlanToJson(plan), "plan"));
  summary["model"] = Json(model);
  summary["format"] = Json(format);
  summary["output"] = output.has_value() ? Json(*output) : Json();
  if (!result.has_value()) {
    summary["check"] = Json();
    return util::DumpJson(summary, 2);
  }
  const runtime::CompareResult& out = result->output;
  Json c = Json::object();
  c["passed"] = Json(result->passed);
  c["rtol"] = Json(out.rtol);
  c["atol"] = Json(out.atol);
  c["max_abs_error"] = Json(out.max_abs_error);
  c["max_rel_error"] = Json(out.max_rel_error);
  c["elements"] = Json(out.elements);
  c["violations"] = Json(out.violations);
  c["worst"] = WorstJson(out.worst);
  Json abs_errors = Json::array();
  Json rel_errors = Json::array();
  for (const runtime::CompareResult& s : result->subgraphs) {
    abs_errors.push_back(Json(s.max_abs_error));
    rel_errors.push_back(Json(s.max_rel_error));
  }
  c["subgraph_errors"] = std::move(abs_errors);
  c["subgraph_rel_errors"] = std::move(rel_errors);
  c["first_divergent"] = Json(result->first_divergent);
  c["first_failing"] = Json(result->first_failing);
  if (result->first_failing >= 0) {
    const runtime::CompareResult& s = result->subgraphs[result->first_failing];
    Json f = Json::object();
    f["violations"] = Json(s.violations);
    f["elements"] = Json(s.elements);
    f["worst"] = WorstJson(s.worst);
    c["first_failing_detail"] = std::move(f);
  }
  c["peak_cached_values"] = Json(result->peak_cached_values);
  summary["check"] = std::move(c);
  return util::DumpJson(summary, 2);
}

absl::Status RunPartition(const ParsedArgs& args, Io& io) {
  const std::string model = args.positional()[0];
  const std::string format = args.Get("format").value_or("text");
  if (format != "text" && format != "json" && format != "dot") {
    return UsageError(
        absl::StrCat("unknown --format '", format, "' (text, json or dot)"));
  }
  const bool json = args.Has("json");
  const bool check = args.Has("check");
  std::optional<std::string> output = args.Get("output");
  if (output.has_value())
    RETURN_IF_ERROR(CheckOutputIsNotInput(*output, model));
  ASSIGN_OR_RETURN(runtime::CompareOptions tolerances,
                   CheckOptionsFromFlags(args));

  partition::PartitionOptions popts;
  if (std::optional<std::string> n = args.Get("targets-per-subgraph")) {
    if (!absl::SimpleAtoi(*n, &popts.targets_per_subgraph) ||
        popts.targets_per_subgraph < 0) {
      return UsageError(
          absl::StrCat("--targets-per-subgraph wants a count >= "
                       "0, not '",
                       *n, "'"));
    }
  }
  if (std::optional<std::string> n = args.Get("max-param-bytes")) {
    if (!absl::SimpleAtoi(*n, &popts.max_param_bytes) ||
        popts.max_param_bytes < 0) {
      return UsageError(absl::StrCat(
          "--max-param-bytes wants a byte count >= 0, not '", *n, "'"));
    }
  }

  // Trace as `tracecut trace` does, keeping the options for the inputs.
  ASSIGN_OR_RETURN(TracedModel traced, LoadAndTrace(args));
  const tracer::LoadedModel& loaded = traced.loaded;
  const tracer::TraceOptions& options = traced.options;
  runtime::GraphModule& gm = traced.gm;

  // Targets and ignore: flags, else the HF defaults of the model's config.
  std::optional<tracer::hf::HfDefaults> defaults;
  if (options.config.has_value()) {
    defaults = tracer::hf::DefaultsFor(*options.config);
  }
  popts.targets = SplitAll(args.GetAll("targets"));
  if (popts.targets.empty()) {
    if (defaults.has_value()) popts.targets = defaults->sequential_targets;
    if (popts.targets.empty()) {
      return UsageError(absl::StrCat(
          "no sequential targets known for ", model,
          defaults.has_value() && !defaults->model_type.empty()
              ? absl::StrCat(" (model_type '", defaults->model_type, "')")
              : std::string(" (no HF config)"),
          "; give --targets=TYPE,..."));
    }
  }
  if (args.Has("ignore")) {
    popts.ignore = SplitAll(args.GetAll("ignore"));
  } else if (defaults.has_value()) {
    popts.ignore = defaults->ignore;
  } else {
    popts.ignore = {"lm_head"};
  }
  popts.param_bytes = partition::ModuleParamBytes(gm.module());

  ASSIGN_OR_RETURN(partition::Partition p,
                   partition::PartitionGraph(gm.graph(), popts));
  const partition::PartitionPlan plan = partition::BuildPlan(p, popts);

  std::optional<partition::CheckResult> result;
  std::string check_failure;
  if (check) {
    ASSIGN_OR_RETURN(tracer::ExampleInputs inputs,
                     tracer::ResolveExampleInputs(loaded.module, options));
    ASSIGN_OR_RETURN(
        result, partition::CheckPartition(gm, p, inputs.values, tolerances));
    if (!result->passed) check_failure = CheckFailure(p, *result);
  }
  if (!check_failure.empty() && json) {
    // The summary still goes to stdout (passed: false), then the error.
    ASSIGN_OR_RETURN(std::string summary,
                     JsonSummary(plan, model, format, std::nullopt, result));
    io.out << summary << "\n";
  }
  if (!check_failure.empty()) return absl::InternalError(check_failure);

  std::string rendered;
  if (format == "text") {
    rendered = partition::PlanToText(plan);
  } else if (format == "json") {
    rendered = partition::PlanToJson(plan);
  } else {
    rendered = partition::PartitionToDot(gm.graph(), p);
  }

  // With --json, stdout carries the plan summary; the rendering goes to -o.
  if (output.has_value()) {
    RETURN_IF_ERROR(WriteOutput(*output, rendered, io));
  } else if (!json) {
    RETURN_IF_ERROR(WriteOutput("-", rendered, io));
  }
  if (json) {
    ASSIGN_OR_RETURN(std::string summary,
                     JsonSummary(plan, model, format, output, result));
    io.out << summary << "\n";
  }
  if (result.has_value()) {
    io.err << "tracecut partition: check passed, "
           << result->output.ErrorSummary() << " over " << p.subgraphs.size()
           << " subgraphs (atol " << tolerances.atol << ", rtol "
           << tolerances.rtol << ")\n";
  }
  if (!json && output.has_value() && *output != "-") {
    io.err << "tracecut partition: wrote " << *output << " ("
           << p.subgraphs.size() << " subgraphs)\n";
  }
  return absl::OkStatus();
}

Subcommand PartitionCommand() {
  Subcommand c;
  c.name = "partition";
  c.synopsis =
      "MODEL.pt [--targets=TYPE,...] [--ignore=TYPE_OR_PATH,...] "
      "[--targets-per-subgraph=N] [--max-param-bytes=N] "
      "[--leaf=TYPE_OR_PATH]... [--config=config.json] [--no-default-leaves] "
      "[--format=text|json|dot] [--check [--rtol=X] [--atol=X]] [--json] "
      "[-o FILE]";
  c.summary = "Split a traced model into sequential subgraphs.";
  c.description =
      "Traces MODEL.pt as `tracecut trace` does, then splits the graph at "
      "every sequential target (default: the decoder layer type of the HF "
      "config's architecture) into a head subgraph and one subgraph per "
      "target instance, the tail going with the last. Modules matching "
      "--ignore (default: lm_head) never start a subgraph. The plan goes to "
      "stdout as a table (text), deterministic JSON or Graphviz DOT, or "
      "atomically to -o FILE. --check runs the whole graph and the subgraphs "
      "in order on the model's example inputs, compares every subgraph's "
      "outputs and the model's output with the whole graph's, "
      "and fails unless " +
      ToleranceRule() +
      "; the error names the worst element (value and index) and the first "
      "subgraph over tolerance.";
  c.flags = {
      FlagSpec::Value("targets", "TYPE,...",
                      "module types, paths, globs or re: patterns that start "
                      "a subgraph (default: from the HF config)")
          .Repeated(),
      FlagSpec::Value("ignore", "TYPE_OR_PATH,...",
                      "modules that never start a subgraph (default: from "
                      "the HF config, lm_head)")
          .Repeated(),
      FlagSpec::Value("targets-per-subgraph", "N",
                      "group N consecutive targets per subgraph"),
      FlagSpec::Value("max-param-bytes", "N",
                      "group consecutive targets while their parameters fit "
                      "in N bytes"),
      FlagSpec::Value("format", "FORMAT", "text (default), json or dot"),
      FlagSpec::Bool("check",
                     "run the whole graph and the partition on the example "
                     "inputs; fail beyond --rtol/--atol, else print the max "
                     "abs and rel errors"),
      FlagSpec::Value("output", "FILE", "write the plan here ('-': stdout)")
          .Short('o'),
      CompareFlags()[0],
      CompareFlags()[1],
      CompareFlags()[2],
      FlagSpec::Bool("json",
                     "print the plan as JSON (plus model, format, output and "
                     "check result, also when the check fails) on stdout"),
  };
  for (FlagSpec& f : ModelFlags()) c.flags.push_back(std::move(f));
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunPartition;
  return c;
}

const bool kRegistered = RegisterSubcommand(PartitionCommand());

}  // namespace
}  // namespace tracecut::cli
