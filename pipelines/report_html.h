#ifndef TRACECUT_PIPELINES_REPORT_HTML_H_
#define TRACECUT_PIPELINES_REPORT_HTML_H_

// Reports as one self-contained HTML page: inline CSS and inline SVG charts,
// no script, no font, no network. Works on the JSON alone (what
// pipelines/report.h writes, or the debugger's DebugReport::ToJson()), so a
// report from another machine or an earlier run renders the same way.
//
//   ASSIGN_OR_RETURN(util::Json report, util::ParseJson(text, path));
//   ASSIGN_OR_RETURN(std::string html, ReportHtml(report, path));
//   RETURN_IF_ERROR(util::WriteFileAtomically("report.html", html));
//
// A calibration report's page has these sections (each an element with the
// id in parentheses): the run at a glance (summary), warnings: the run's
// warnings, modules that saw no calibration tokens and module notes
// (warnings), the partition: subgraphs, their nodes and parameter bytes
// (partition), per-module output error of the method against
// round-to-nearest, one bar chart per subgraph (errors), the time split of
// each subgraph: calibrate / compress / propagate / weight I/O (time),
// memory and the intermediates cache (memory), and the recipe (recipe).
// Figures a report does not hold (a --deterministic-report has no "run"
// section) are said to be missing, not drawn as zeros.
//
// Every string taken from the report is HTML-escaped (module names come
// from the model). The output is a function of the JSON only: the same
// report gives the same bytes.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/json.h"

namespace tracecut::pipelines {

// `text` with &, <, >, " and ' replaced by character references.
std::string HtmlEscape(absl::string_view text);

// The page of a calibration report ("format":
// "tracecut-calibration-report"). `source` names the report in messages and
// the page's title. A report of another shape is InvalidArgument naming the
// field ("report.json: modules[3].path: expected a string, got integer").
absl::StatusOr<std::string> CalibrationReportHtml(const util::Json& report,
                                                  absl::string_view source);

// The page of the layer-by-layer transform debugger's report
// (transforms/debugger.h): the verdict, each pass's step error per subgraph
// as a bar chart (log scale), and the table of steps.
absl::StatusOr<std::string> DebugReportHtml(const util::Json& report,
                                            absl::string_view source);

// Either page, by the report's shape: "format" says calibration report; a
// "steps" array without "format" is a debugger report.
absl::StatusOr<std::string> ReportHtml(const util::Json& report,
                                       absl::string_view source);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_REPORT_HTML_H_
