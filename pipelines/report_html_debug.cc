// The page of the transform debugger's report (transforms/debugger.h,
// DebugReport::ToJson): which pass changed which layer's outputs, by how
// much.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "pipelines/report_html.h"
#include "pipelines/report_html_internal.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

using html_internal::BarChart;
using html_internal::ChartOptions;
using html_internal::Fields;
using html_internal::Num;
using html_internal::Row;
using util::Json;

struct Step {
  int64_t subgraph = 0;
  std::string pass;
  bool changed = false;
  bool exceeds = false;
  std::optional<double> max_abs, max_rel, cumulative_abs, cumulative_rel;
  int64_t violations = 0;
  int64_t touched = 0;
};

// "#1 (model.layers.0)", "#0 (head)".
std::string Label(const std::map<int64_t, std::vector<std::string>>& paths,
                  int64_t i) {
  auto it = paths.find(i);
  if (it == paths.end()) return absl::StrCat("#", i);
  return absl::StrCat(
      "#", i, " (",
      it->second.empty() ? "head" : absl::StrJoin(it->second, ", "), ")");
}

// Errors span many decades, and a pass that preserves the computation
// exactly has error 0: a log scale, with exact zeros said in words.
std::string Sci(double v) {
  if (!std::isfinite(v)) return "n/a";
  if (v == 0) return "0";
  return absl::StrFormat("%.2e", v);
}

// Module paths by subgraph index.
using SubgraphPaths = std::map<int64_t, std::vector<std::string>>;

// The report's subgraphs (`subgraphs`): their module paths.
absl::StatusOr<SubgraphPaths> ReadPaths(const Json& report, const Fields& f) {
  SubgraphPaths paths;
  ASSIGN_OR_RETURN(const Json* subs, f.Array(report, "", "subgraphs"));
  for (size_t i = 0; i < subs->size(); ++i) {
    const Json& s = (*subs)[i];
    const std::string field = absl::StrCat("subgraphs[", i, "]");
    if (!s.is_object()) {
      return f.Error(field, absl::StrCat("expected an object, got ",
                                         util::JsonTypeName(s)));
    }
    ASSIGN_OR_RETURN(std::optional<int64_t> index, f.Int(s, field, "index"));
    ASSIGN_OR_RETURN(std::vector<std::string> p,
                     f.Strings(s, field, "module_paths"));
    paths[index.value_or(static_cast<int64_t>(i))] = std::move(p);
  }
  return paths;
}

// The report's steps (`steps`), in order.
absl::StatusOr<std::vector<Step>> ReadSteps(const Json& report,
                                            const Fields& f) {
  std::vector<Step> steps;
  ASSIGN_OR_RETURN(const Json* rows, f.Array(report, "", "steps"));
  for (size_t i = 0; i < rows->size(); ++i) {
    const Json& s = (*rows)[i];
    const std::string field = absl::StrCat("steps[", i, "]");
    if (!s.is_object()) {
      return f.Error(field, absl::StrCat("expected an object, got ",
                                         util::JsonTypeName(s)));
    }
    Step step;
    ASSIGN_OR_RETURN(std::optional<int64_t> sub, f.Int(s, field, "subgraph"));
    step.subgraph = sub.value_or(0);
    ASSIGN_OR_RETURN(std::optional<std::string> pass,
                     f.String(s, field, "pass"));
    step.pass = pass.value_or("");
    ASSIGN_OR_RETURN(std::optional<bool> b, f.Bool(s, field, "changed"));
    step.changed = b.value_or(false);
    ASSIGN_OR_RETURN(b, f.Bool(s, field, "exceeds"));
    step.exceeds = b.value_or(false);
    ASSIGN_OR_RETURN(step.max_abs, f.Number(s, field, "max_abs"));
    ASSIGN_OR_RETURN(step.max_rel, f.Number(s, field, "max_rel"));
    ASSIGN_OR_RETURN(step.cumulative_abs,
                     f.Number(s, field, "cumulative_max_abs"));
    ASSIGN_OR_RETURN(step.cumulative_rel,
                     f.Number(s, field, "cumulative_max_rel"));
    ASSIGN_OR_RETURN(std::optional<int64_t> v, f.Int(s, field, "violations"));
    step.violations = v.value_or(0);
    ASSIGN_OR_RETURN(std::vector<std::string> touched,
                     f.Strings(s, field, "touched_nodes"));
    step.touched = static_cast<int64_t>(touched.size());
    steps.push_back(std::move(step));
  }
  return steps;
}

// The first step over the tolerance (`first_exceeding`), in words.
absl::StatusOr<std::string> Verdict(const Json& report, const Fields& f,
                                    const SubgraphPaths& paths) {
  ASSIGN_OR_RETURN(const Json* first, f.Object(report, "", "first_exceeding"));
  std::string verdict;
  if (first != nullptr) {
    ASSIGN_OR_RETURN(std::optional<int64_t> sub,
                     f.Int(*first, "first_exceeding", "subgraph"));
    ASSIGN_OR_RETURN(std::optional<std::string> pass,
                     f.String(*first, "first_exceeding", "pass"));
    ASSIGN_OR_RETURN(std::optional<std::string> worst,
                     f.String(*first, "first_exceeding", "worst"));
    ASSIGN_OR_RETURN(std::optional<std::string> mismatch,
                     f.String(*first, "first_exceeding", "mismatch"));
    verdict = absl::StrCat(
        "<p class=\"warn\">First over the tolerance: subgraph <code>",
        HtmlEscape(Label(paths, sub.value_or(0))), "</code>, pass <code>",
        HtmlEscape(pass.value_or("?")), "</code>",
        mismatch.has_value()
            ? absl::StrCat(": outputs changed: ", HtmlEscape(*mismatch))
            : "",
        worst.has_value() ? absl::StrCat("; worst element <code>",
                                         HtmlEscape(*worst), "</code>")
                          : "",
        ".</p>\n");
  } else {
    verdict = "<p>Every pass kept every subgraph within the tolerance.</p>\n";
  }
  return verdict;
}

// One chart per subgraph: each pass's step error and the cumulative
// error against the untransformed subgraph.
std::string ErrorsSection(const std::vector<Step>& steps,
                          const SubgraphPaths& paths) {
  std::string out;
  absl::StrAppend(
      &out,
      "<section id=\"errors\">\n<h2>Per-layer error of each pass</h2>\n<p>"
      "Largest relative error of the subgraph's outputs on its cached "
      "inputs (the untransformed model's values, so errors do not "
      "accumulate across layers): after the pass against just before it "
      "(step), and against the untransformed subgraph (cumulative). Log "
      "scale; an exact 0 draws no bar. Red: over the tolerance.</p>\n");
  std::map<int64_t, std::vector<const Step*>> by_subgraph;
  for (const Step& s : steps) by_subgraph[s.subgraph].push_back(&s);
  // One scale for every subgraph's chart.
  double largest = 0, smallest = 0;
  for (const Step& s : steps) {
    for (const std::optional<double>& v : {s.max_rel, s.cumulative_rel}) {
      if (!v.has_value() || !std::isfinite(*v) || *v <= 0) continue;
      largest = std::max(largest, *v);
      smallest = smallest == 0 ? *v : std::min(smallest, *v);
    }
  }
  for (const auto& [sub, list] : by_subgraph) {
    std::vector<Row> chart_rows;
    for (const Step* s : list) {
      chart_rows.push_back(
          {s->pass,
           "",
           {s->max_rel.value_or(NAN), s->cumulative_rel.value_or(NAN)},
           s->exceeds});
    }
    ChartOptions o;
    o.log_scale = true;
    o.format = Sci;
    o.axis_label = "max relative error";
    o.include_max = largest;
    o.include_min_positive = smallest;
    absl::StrAppend(&out,
                    BarChart(absl::StrCat("Subgraph ", Label(paths, sub)),
                             {{"step", 0}, {"cumulative", 1}}, chart_rows, o));
  }
  if (by_subgraph.empty()) {
    absl::StrAppend(&out, "<p>The report has no steps.</p>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

// Every step, in a table.
std::string StepsSection(const std::vector<Step>& steps,
                         const SubgraphPaths& paths) {
  std::string out;
  absl::StrAppend(
      &out,
      "<section id=\"steps\">\n<h2>Steps</h2>\n<table>\n<tr><th>subgraph</th>"
      "<th>pass</th><th>changed</th><th class=\"n\">max abs</th><th "
      "class=\"n\">max rel</th><th class=\"n\">cumulative abs</th><th "
      "class=\"n\">cumulative rel</th><th class=\"n\">over</th><th "
      "class=\"n\">touched</th></tr>\n");
  for (const Step& s : steps) {
    absl::StrAppend(
        &out, s.exceeds ? "<tr class=\"bad\">" : "<tr>", "<td><code>",
        HtmlEscape(Label(paths, s.subgraph)), "</code></td><td><code>",
        HtmlEscape(s.pass), "</code></td><td>", s.changed ? "yes" : "no",
        "</td><td class=\"n\">", Sci(s.max_abs.value_or(NAN)),
        "</td><td class=\"n\">", Sci(s.max_rel.value_or(NAN)),
        "</td><td class=\"n\">", Sci(s.cumulative_abs.value_or(NAN)),
        "</td><td class=\"n\">", Sci(s.cumulative_rel.value_or(NAN)),
        "</td><td class=\"n\">", s.violations, "</td><td class=\"n\">",
        s.touched, "</td></tr>\n");
  }
  absl::StrAppend(&out, "</table>\n</section>\n");
  return out;
}

}  // namespace

absl::StatusOr<std::string> DebugReportHtml(const Json& report,
                                            absl::string_view source) {
  Fields f(source);
  if (!report.is_object()) {
    return f.Error("(top level)", absl::StrCat("expected an object, got ",
                                               util::JsonTypeName(report)));
  }
  ASSIGN_OR_RETURN(std::optional<double> rtol, f.Number(report, "", "rtol"));
  ASSIGN_OR_RETURN(std::optional<double> atol, f.Number(report, "", "atol"));
  ASSIGN_OR_RETURN(SubgraphPaths paths, ReadPaths(report, f));
  ASSIGN_OR_RETURN(std::vector<Step> steps, ReadSteps(report, f));
  ASSIGN_OR_RETURN(std::string verdict, Verdict(report, f, paths));

  std::string out = html_internal::PageStart("tracecut debug report");
  absl::StrAppend(
      &out, "<h1>Transform debugger report</h1>\n<p class=\"meta\"><code>",
      HtmlEscape(source),
      "</code><br>tolerance |after &minus; before| "
      "&le; atol + rtol&middot;|before|, atol ",
      Num(atol), ", rtol ", Num(rtol), "</p>\n<section id=\"verdict\">\n",
      verdict, "</section>\n");
  absl::StrAppend(&out, ErrorsSection(steps, paths), StepsSection(steps, paths),
                  html_internal::PageEnd("Made by tracecut debug from its "
                                         "report alone."));
  return out;
}

}  // namespace tracecut::pipelines
