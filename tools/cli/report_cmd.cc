// `tracecut report REPORT.json [-o report.html]`: a calibration report (or
// the debugger's) as one self-contained HTML page (pipelines/report_html.h).

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "pipelines/report_html.h"
#include "tools/cli/common.h"
#include "util/files.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

using util::Json;

// REPORT.json -> REPORT.html; anything else gets ".html" appended.
std::string DefaultOutput(const std::string& input) {
  if (absl::EndsWith(input, ".json")) {
    return absl::StrCat(input.substr(0, input.size() - 5), ".html");
  }
  return absl::StrCat(input, ".html");
}

absl::Status RunReport(const ParsedArgs& args, Io& io) {
  const std::string input = UserPath(args.positional()[0]);
  std::optional<std::string> o = args.Get("output");
  const std::string output =
      o.has_value() ? (*o == "-" ? *o : UserPath(*o)) : DefaultOutput(input);
  if (output != "-") {
    RETURN_IF_ERROR(CheckOutputPath(output));
    RETURN_IF_ERROR(CheckOutputIsNotInput(output, input));
  }
  ASSIGN_OR_RETURN(std::string text, util::ReadFile(input));
  ASSIGN_OR_RETURN(Json report, util::ParseJson(text, input));
  ASSIGN_OR_RETURN(std::string html, pipelines::ReportHtml(report, input));
  RETURN_IF_ERROR(WriteOutput(output, html, io));
  if (args.Has("json")) {
    Json j = Json::object();
    j["report"] = Json(input);
    j["html"] = Json(output);
    j["bytes"] = Json(static_cast<int64_t>(html.size()));
    io.out << util::DumpJson(j, 2) << "\n";
  }
  if (output != "-") io.err << "tracecut report: wrote " << output << "\n";
  return absl::OkStatus();
}

Subcommand ReportCommand() {
  Subcommand c;
  c.name = "report";
  c.synopsis = "REPORT.json [-o report.html] [--json]";
  c.summary = "Render a JSON report as one self-contained HTML page.";
  c.description =
      "Reads a calibration report (`tracecut calibrate --report=FILE`) or a "
      "debugger report (`tracecut debug --json`) and writes one HTML file "
      "with inline CSS and inline SVG charts: it loads nothing from the "
      "network and runs no script. A calibration report's page shows the "
      "run, its warnings (modules no calibration token reached, fallbacks), "
      "the partition (subgraphs, nodes, parameter bytes), each quantized "
      "module's output error against round-to-nearest as a bar chart per "
      "layer, each subgraph's time split (calibrate / compress / propagate "
      "/ weight I/O), memory and cache use after each subgraph, and the "
      "recipe. Figures the report lacks (a --deterministic-report has no "
      "timings) are said to be missing. Every string from the report is "
      "HTML-escaped. -o defaults to REPORT.html beside the report; -o - "
      "writes to stdout.";
  c.flags = {
      FlagSpec::Value("output", "FILE", "where to write the page").Short('o'),
      FlagSpec::Bool("json",
                     "print {\"report\", \"html\", \"bytes\"} on "
                     "stdout"),
  };
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunReport;
  return c;
}

const bool kRegistered = RegisterSubcommand(ReportCommand());

}  // namespace
}  // namespace tracecut::cli
