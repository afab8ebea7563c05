// `tracecut partition MODEL.pt`: trace a TorchScript model and split its
// graph into sequential subgraphs (partition/partitioner.h), printing the
// plan as a table, JSON or DOT, and optionally checking it numerically.

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ir/graph.h"
#include "ir/status_macros.h"
#include "partition/check.h"
#include "partition/module_sizes.h"
#include "partition/partitioner.h"
#include "partition/plan.h"
#include "tools/cli/common.h"
#include "tracer/hf/config.h"
#include "tracer/hf/json.h"
#include "tracer/load.h"
#include "tracer/tracer.h"

namespace tracecut::cli {
namespace {

constexpr double kTolerance = 1e-5;

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

std::string FormatError(double e) {
  std::ostringstream s;
  s.precision(3);
  s << std::scientific << e;
  return s.str();
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
  tracer::TraceOptions options;
  if (args.Has("no-default-leaves")) {
    options.leaf_policy = tracer::LeafPolicy::None();
  }
  for (std::string& leaf : args.GetAll("leaf")) {
    options.leaf_policy.AddTypeOrPath(std::move(leaf));
  }
  if (std::optional<std::string> config = args.Get("config")) {
    options.config_path = *config;
  }
  ASSIGN_OR_RETURN(tracer::LoadedModel loaded, tracer::LoadModel(model));
  ASSIGN_OR_RETURN(options, tracer::WithModelFiles(loaded, std::move(options)));
  ASSIGN_OR_RETURN(runtime::GraphModule gm,
                   tracer::Trace(loaded.module, options));

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
  if (check) {
    ASSIGN_OR_RETURN(tracer::ExampleInputs inputs,
                     tracer::ResolveExampleInputs(loaded.module, options));
    ASSIGN_OR_RETURN(result, partition::CheckPartition(gm, p, inputs.values));
    if (!(result->max_abs_error <= kTolerance)) {
      int worst = -1;
      for (int i = 0; i < static_cast<int>(result->subgraph_errors.size());
           ++i) {
        if (worst < 0 ||
            result->subgraph_errors[i] > result->subgraph_errors[worst]) {
          worst = i;
        }
      }
      return absl::InternalError(absl::StrCat(
          "check failed: max abs error ", FormatError(result->max_abs_error),
          " > ", FormatError(kTolerance), "; first divergent subgraph ",
          SubgraphLabel(p, result->first_divergent), ", largest at ",
          SubgraphLabel(p, worst)));
    }
  }

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
    ASSIGN_OR_RETURN(
        tracer::hf::Json summary,
        tracer::hf::Json::Parse(partition::PlanToJson(plan), "plan"));
    summary.Set("model", tracer::hf::Json(model));
    summary.Set("format", tracer::hf::Json(format));
    summary.Set("output", output.has_value() ? tracer::hf::Json(*output)
                                             : tracer::hf::Json());
    if (result.has_value()) {
      tracer::hf::Json c = tracer::hf::Json::MakeObject();
      c.Set("passed", tracer::hf::Json(true));
      c.Set("tolerance", tracer::hf::Json(kTolerance));
      c.Set("max_abs_error", tracer::hf::Json(result->max_abs_error));
      tracer::hf::Json errors = tracer::hf::Json::MakeArray();
      for (double e : result->subgraph_errors) {
        errors.Append(tracer::hf::Json(e));
      }
      c.Set("subgraph_errors", std::move(errors));
      c.Set("first_divergent", tracer::hf::Json(result->first_divergent));
      c.Set("peak_cached_values", tracer::hf::Json(result->peak_cached_values));
      summary.Set("check", std::move(c));
    } else {
      summary.Set("check", tracer::hf::Json());
    }
    io.out << summary.Dump(2) << "\n";
  }
  if (result.has_value()) {
    io.err << "tracecut partition: check passed, max abs error "
           << FormatError(result->max_abs_error) << " over "
           << p.subgraphs.size() << " subgraphs\n";
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
      "[--format=text|json|dot] [--check] [--json] [-o FILE]";
  c.summary = "Split a traced model into sequential subgraphs.";
  c.description =
      "Traces MODEL.pt as `tracecut trace` does, then splits the graph at "
      "every sequential target (default: the decoder layer type of the HF "
      "config's architecture) into a head subgraph and one subgraph per "
      "target instance, the tail going with the last. Modules matching "
      "--ignore (default: lm_head) never start a subgraph. The plan goes to "
      "stdout as a table (text), deterministic JSON or Graphviz DOT, or "
      "atomically to -o FILE. --check runs the whole graph and the subgraphs "
      "in order on the model's example inputs and fails when outputs differ "
      "by more than 1e-5.";
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
      FlagSpec::Value("leaf", "TYPE_OR_PATH",
                      "keep this module type or path/glob as a call_module "
                      "when tracing")
          .Repeated(),
      FlagSpec::Bool("no-default-leaves",
                     "inline torch.nn built-ins and Conv1D too"),
      FlagSpec::Value("config", "FILE",
                      "HF config.json to use instead of the embedded one"),
      FlagSpec::Value("format", "FORMAT", "text (default), json or dot"),
      FlagSpec::Bool("check",
                     "run the whole graph and the partition on the example "
                     "inputs; fail beyond 1e-5, else print the max error"),
      FlagSpec::Value("output", "FILE", "write the plan here ('-': stdout)")
          .Short('o'),
      FlagSpec::Bool("json",
                     "print the plan as JSON (plus model, format, output and "
                     "check result) on stdout"),
  };
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunPartition;
  return c;
}

const bool kRegistered = RegisterSubcommand(PartitionCommand());

}  // namespace
}  // namespace tracecut::cli
