#include "pipelines/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pipelines/report_html_internal.h"
#include "pipelines/report_html_read.h"
#include "util/status_macros.h"

namespace tracecut::pipelines {
namespace {

using html_internal::BarChart;
using html_internal::Bytes;
using html_internal::ChartOptions;
using html_internal::Fields;
using html_internal::kNaN;
using html_internal::Module;
using html_internal::Num;
using html_internal::Read;
using html_internal::Report;
using html_internal::Row;
using html_internal::Seconds;
using html_internal::Series;
using html_internal::SubgraphRun;
using html_internal::Uncalibrated;
using util::Json;

std::string MethodName(absl::string_view method) {
  if (method == "gptq") return "GPTQ";
  if (method == "rtn") return "round-to-nearest";
  return std::string(method);
}

std::string SubgraphLabel(const Report& r, int64_t i) {
  if (i >= 0 && i < static_cast<int64_t>(r.subgraphs.size())) {
    return absl::StrCat("#", i, " ", r.subgraphs[i]);
  }
  return absl::StrCat("#", i);
}

// A module's name inside its subgraph: "self_attn.q_proj" in
// "model.layers.0".
std::string ShortPath(const Report& r, const Module& m) {
  if (m.subgraph >= 0 &&
      m.subgraph < static_cast<int64_t>(r.subgraphs.size())) {
    const std::string prefix = absl::StrCat(r.subgraphs[m.subgraph], ".");
    if (absl::StartsWith(m.path, prefix) && m.path.size() > prefix.size()) {
      return m.path.substr(prefix.size());
    }
  }
  return m.path;
}

std::string Card(absl::string_view value, absl::string_view key) {
  return absl::StrCat("<div class=\"card\"><div class=\"v\">",
                      HtmlEscape(value), "</div><div class=\"k\">",
                      HtmlEscape(key), "</div></div>\n");
}

std::string Code(absl::string_view s) {
  return absl::StrCat("<code>", HtmlEscape(s), "</code>");
}

std::string NoRun(absl::string_view what) {
  return absl::StrCat(
      "<p class=\"note\">", HtmlEscape(what),
      " not recorded: this report has no <code>run</code> section (it was "
      "written with <code>--deterministic-report</code>).</p>\n");
}

std::string SummarySection(const Report& r) {
  std::string out = "<section id=\"summary\">\n<h2>The run</h2>\n";
  std::vector<std::string> data;
  if (r.samples.has_value())
    data.push_back(absl::StrCat(*r.samples, " samples"));
  if (r.seq_len.value_or(0) > 0) {
    data.push_back(
        r.min_seq_len.has_value()
            ? absl::StrCat(*r.min_seq_len, "-", *r.seq_len, " tokens each")
            : absl::StrCat(*r.seq_len, " tokens each"));
  }
  if (r.batches.has_value())
    data.push_back(absl::StrCat(*r.batches, " batches"));
  absl::StrAppend(
      &out, "<p class=\"meta\">model ", Code(r.model), "<br>recipe ",
      Code(r.recipe), ", pipeline ", Code(r.pipeline),
      r.propagate_error.has_value()
          ? absl::StrCat(", error propagation ",
                         *r.propagate_error ? "on" : "off")
          : "",
      r.targets.empty() ? ""
                        : absl::StrCat(", sequential targets ",
                                       Code(absl::StrJoin(r.targets, ", "))),
      "<br>data ", Code(r.data_source), ": ",
      HtmlEscape(absl::StrJoin(data, ", ")),
      r.fingerprint.empty()
          ? ""
          : absl::StrCat(" (fingerprint ", Code(r.fingerprint), ")"));
  for (const std::string& in : r.data_inputs) {
    absl::StrAppend(&out, "<br>input ", Code(in));
  }
  absl::StrAppend(&out, "</p>\n<div class=\"cards\">\n");
  absl::StrAppend(&out, Card(absl::StrCat(r.modules.size()), "modules"));
  if (r.weights_quantized.has_value()) {
    absl::StrAppend(
        &out, Card(absl::StrCat(*r.weights_quantized), "weights quantized"));
  }
  if (r.compared.value_or(0) > 0) {
    absl::StrAppend(
        &out,
        Card(Num(r.mean_compared),
             absl::StrCat("mean output error over ", *r.compared, " modules")),
        Card(Num(r.mean_rtn), "round-to-nearest on the same modules"));
  } else if (r.measured.value_or(0) > 0) {
    absl::StrAppend(
        &out, Card(Num(r.mean_error), absl::StrCat("mean output error over ",
                                                   *r.measured, " modules")));
  }
  if (r.max_error.has_value()) {
    absl::StrAppend(&out, Card(Num(r.max_error), "max output error"));
  }
  absl::StrAppend(&out,
                  Card(absl::StrCat(r.uncalibrated.size()), "uncalibrated"),
                  Card(absl::StrCat(r.warnings.size()), "warnings"));
  if (r.total_seconds.has_value()) {
    absl::StrAppend(&out, Card(Seconds(*r.total_seconds),
                               "calibrate + compress + propagate"));
  }
  if (r.peak_rss.has_value()) {
    absl::StrAppend(&out, Card(Bytes(*r.peak_rss), "peak resident memory"));
  }
  if (r.cache_peak_held.has_value()) {
    absl::StrAppend(&out,
                    Card(Bytes(*r.cache_peak_held), "peak cache in memory"));
  }
  absl::StrAppend(&out, "</div>\n");
  if (r.resumed_from.value_or(0) > 0) {
    absl::StrAppend(&out, "<p class=\"note\">Resumed at subgraph ",
                    *r.resumed_from,
                    ": figures of the subgraphs before it come from the "
                    "checkpoint or are missing.</p>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

std::string WarningsSection(const Report& r) {
  std::string out = "<section id=\"warnings\">\n<h2>Warnings</h2>\n";
  std::vector<std::string> items;
  for (const std::string& w : r.warnings) {
    items.push_back(HtmlEscape(w));
  }
  for (const Uncalibrated& u : r.uncalibrated) {
    items.push_back(absl::StrCat(
        Code(u.path), ": no calibration token reached it; quantized ",
        HtmlEscape(MethodName(u.method)),
        " from its weights alone, not counted in the means"));
  }
  for (const Module& m : r.modules) {
    for (const std::string& n : m.notes) {
      items.push_back(absl::StrCat(Code(m.path), ": ", HtmlEscape(n)));
    }
  }
  if (items.empty()) {
    absl::StrAppend(&out,
                    "<p>None: every quantized module saw calibration tokens "
                    "and nothing fell back.</p>\n");
  } else {
    absl::StrAppend(&out, "<ul class=\"warnings\">\n");
    for (const std::string& i : items) {
      absl::StrAppend(&out, "<li class=\"warn\">", i, "</li>\n");
    }
    absl::StrAppend(&out, "</ul>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

std::string PartitionSection(const Report& r) {
  std::string out = absl::StrCat(
      "<section id=\"partition\">\n<h2>Partition</h2>\n<p>", r.subgraphs.size(),
      " subgraphs",
      r.targets.empty()
          ? ""
          : absl::StrCat(", split at ", Code(absl::StrJoin(r.targets, ", "))),
      ".</p>\n");
  std::map<int64_t, std::pair<int, int>> counts;  // modules, quantized
  for (const Module& m : r.modules) {
    ++counts[m.subgraph].first;
    if (m.quantized) ++counts[m.subgraph].second;
  }
  bool any_sizes = false;
  absl::StrAppend(&out,
                  "<table>\n<tr><th class=\"n\">#</th><th>subgraph</th><th "
                  "class=\"n\">nodes</th><th class=\"n\">parameters</th><th "
                  "class=\"n\">modules</th><th class=\"n\">quantized</th>"
                  "</tr>\n");
  std::vector<Row> rows;
  for (size_t i = 0; i < r.subgraphs.size(); ++i) {
    auto it = r.runs.find(static_cast<int64_t>(i));
    const SubgraphRun* s = it == r.runs.end() ? nullptr : &it->second;
    const bool sized =
        s != nullptr && s->nodes.has_value() && s->param_bytes.has_value();
    any_sizes = any_sizes || sized;
    const auto& c = counts[static_cast<int64_t>(i)];
    absl::StrAppend(
        &out, "<tr><td class=\"n\">", i, "</td><td>", Code(r.subgraphs[i]),
        "</td><td class=\"n\">",
        sized ? absl::StrCat(*s->nodes) : std::string("n/a"),
        "</td><td class=\"n\">",
        sized ? HtmlEscape(Bytes(*s->param_bytes)) : std::string("n/a"),
        "</td><td class=\"n\">", c.first, "</td><td class=\"n\">", c.second,
        "</td></tr>\n");
    if (sized) {
      rows.push_back({SubgraphLabel(r, static_cast<int64_t>(i)),
                      "",
                      {static_cast<double>(*s->param_bytes)}});
    }
  }
  absl::StrAppend(&out, "</table>\n");
  if (any_sizes) {
    ChartOptions o;
    o.format = [](double v) { return Bytes(static_cast<int64_t>(v)); };
    o.binary_ticks = true;
    o.axis_label = "parameter bytes read by the subgraph";
    absl::StrAppend(&out, BarChart("Parameters per subgraph",
                                   {{"parameters", 0}}, rows, o));
  } else if (!r.has_run) {
    absl::StrAppend(&out, NoRun("Node counts and parameter bytes"));
  } else {
    absl::StrAppend(&out,
                    "<p class=\"note\">Node counts and parameter bytes are "
                    "not in this report (written by a tracecut before they "
                    "were recorded).</p>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

std::string ErrorsSection(const Report& r) {
  std::string out =
      "<section id=\"errors\">\n<h2>Per-module error against "
      "round-to-nearest</h2>\n<p>Relative output error of each quantized "
      "module on the calibration inputs it saw, ||(W &minus; W<sub>q</sub>) "
      "X|| / ||W X||, for the method and for round-to-nearest on the same "
      "inputs. These are per-module errors, not the error of the model's "
      "final output.</p>\n";
  std::map<int64_t, std::vector<const Module*>> by_subgraph;
  for (const Module& m : r.modules) {
    if (m.quantized) by_subgraph[m.subgraph].push_back(&m);
  }
  if (by_subgraph.empty()) {
    absl::StrAppend(&out,
                    "<p>No module's weights were quantized.</p>\n</section>\n");
    return out;
  }
  // One scale for every layer's chart.
  double largest = 0;
  for (const auto& [sub, modules] : by_subgraph) {
    for (const Module* m : modules) {
      for (double v : {m->error, m->rtn_error}) {
        if (std::isfinite(v)) largest = std::max(largest, v);
      }
    }
  }
  for (const auto& [sub, modules] : by_subgraph) {
    std::vector<std::string> methods;
    for (const Module* m : modules) {
      const std::string name = MethodName(m->method);
      if (std::find(methods.begin(), methods.end(), name) == methods.end()) {
        methods.push_back(name);
      }
    }
    // A round-to-nearest run has no baseline of its own: one bar each.
    bool baseline = false;
    for (const Module* m : modules) {
      baseline = baseline || std::isfinite(m->rtn_error);
    }
    std::vector<Row> rows;
    for (const Module* m : modules) {
      rows.push_back({ShortPath(r, *m), m->path, {m->error, m->rtn_error}});
      if (!baseline) rows.back().values.pop_back();
    }
    std::vector<Series> series = {{absl::StrJoin(methods, " / "), 0}};
    if (baseline) series.push_back({"round-to-nearest", 1});
    absl::StrAppend(
        &out,
        BarChart(absl::StrCat("Subgraph ", SubgraphLabel(r, sub)), series, rows,
                 ChartOptions{.axis_label = "relative output error",
                              .include_max = largest}));
  }
  absl::StrAppend(
      &out,
      "<h3>All quantized modules</h3>\n<table>\n<tr><th>module</th>"
      "<th>type</th><th class=\"n\">subgraph</th><th>method</th>"
      "<th>scheme</th><th class=\"n\">output error</th><th "
      "class=\"n\">round-to-nearest</th><th class=\"n\">ratio</th><th "
      "class=\"n\">tokens</th></tr>\n");
  for (const Module& m : r.modules) {
    if (!m.quantized) continue;
    const double ratio =
        std::isfinite(m.error) && std::isfinite(m.rtn_error) && m.rtn_error > 0
            ? m.error / m.rtn_error
            : kNaN;
    absl::StrAppend(
        &out, m.tokens == 0 ? "<tr class=\"bad\">" : "<tr>", "<td>",
        Code(m.path), "</td><td>", HtmlEscape(m.type), "</td><td class=\"n\">",
        m.subgraph, "</td><td>", HtmlEscape(MethodName(m.method)), "</td><td>",
        HtmlEscape(m.scheme), "</td><td class=\"n\">", Num(m.error),
        "</td><td class=\"n\">", Num(m.rtn_error), "</td><td class=\"n\">",
        Num(ratio), "</td><td class=\"n\">", m.tokens, "</td></tr>\n");
  }
  absl::StrAppend(&out, "</table>\n</section>\n");
  return out;
}

std::string TimeSection(const Report& r) {
  std::string out = "<section id=\"time\">\n<h2>Time per subgraph</h2>\n";
  if (!r.has_run) {
    absl::StrAppend(&out, NoRun("Timings"), "</section>\n");
    return out;
  }
  bool any_io = false;
  for (const auto& [i, s] : r.runs) any_io = any_io || std::isfinite(s.io);
  std::vector<Series> series = {
      {"calibrate", 0}, {"compress", 1}, {"propagate", 2}};
  if (any_io) series.push_back({"weight I/O", 3});
  std::vector<Row> rows;
  std::string table =
      "<table>\n<tr><th>subgraph</th><th class=\"n\">calibrate</th><th "
      "class=\"n\">compress</th><th class=\"n\">propagate</th><th "
      "class=\"n\">weight I/O</th></tr>\n";
  for (const auto& [i, s] : r.runs) {
    if (!std::isfinite(s.calibrate) && !std::isfinite(s.io)) continue;
    Row row{SubgraphLabel(r, i), "", {s.calibrate, s.compress, s.propagate}};
    if (any_io) row.values.push_back(s.io);
    rows.push_back(std::move(row));
    absl::StrAppend(&table, "<tr><td>", HtmlEscape(SubgraphLabel(r, i)),
                    "</td><td class=\"n\">", Seconds(s.calibrate),
                    "</td><td class=\"n\">", Seconds(s.compress),
                    "</td><td class=\"n\">", Seconds(s.propagate),
                    "</td><td class=\"n\">", Seconds(s.io), "</td></tr>\n");
  }
  absl::StrAppend(&table, "</table>\n");
  ChartOptions o;
  o.stacked = true;
  o.format = Seconds;
  o.axis_label = "seconds";
  absl::StrAppend(
      &out, BarChart("Calibrate / compress / propagate / I/O", series, rows, o),
      table);
  absl::StrAppend(
      &out,
      "<p class=\"note\">calibrate: the pass over all batches with the "
      "modifiers' hooks; compress: the modifiers' quantization step "
      "(GPTQ's solve); propagate: the pass with the compressed weights "
      "whose outputs feed the next subgraph; weight I/O: reading the "
      "subgraph's weights from the checkpoint and writing its shard ",
      any_io ? "(streamed runs)"
             : "(not recorded: the weights were not "
               "streamed, or the report predates it)",
      ".</p>\n</section>\n");
  return out;
}

std::string MemorySection(const Report& r) {
  std::string out =
      "<section id=\"memory\">\n<h2>Memory and the intermediates "
      "cache</h2>\n";
  if (!r.has_run) {
    absl::StrAppend(&out, NoRun("Memory and cache use"), "</section>\n");
    return out;
  }
  absl::StrAppend(&out, "<div class=\"cards\">\n");
  if (r.peak_rss.has_value()) {
    absl::StrAppend(&out, Card(Bytes(*r.peak_rss), "peak resident memory"));
  }
  if (r.streamed_peak.has_value()) {
    absl::StrAppend(&out, Card(Bytes(*r.streamed_peak),
                               "most streamed weights held at once"));
  }
  if (r.cache_peak_held.has_value()) {
    absl::StrAppend(&out,
                    Card(Bytes(*r.cache_peak_held), "peak cache in memory"));
  }
  if (r.cache_peak_values.has_value()) {
    absl::StrAppend(&out, Card(absl::StrCat(*r.cache_peak_values),
                               "most cached values at once"));
  }
  if (r.cache_spilled.has_value()) {
    absl::StrAppend(&out, Card(Bytes(*r.cache_spilled), "spilled to disk"));
  }
  if (r.spill_count.has_value()) {
    absl::StrAppend(&out, Card(absl::StrCat(*r.spill_count, " / ",
                                            r.reload_count.value_or(0)),
                               "spills / reloads"));
  }
  absl::StrAppend(&out, "</div>\n");
  // Two charts: the process's memory dwarfs the cache's.
  auto d = [](const std::optional<int64_t>& v) {
    return v.has_value() ? static_cast<double>(*v) : kNaN;
  };
  std::vector<Row> rss_rows, cache_rows;
  for (const auto& [i, s] : r.runs) {
    if (s.rss.has_value()) {
      rss_rows.push_back({SubgraphLabel(r, i), "", {d(s.rss)}});
    }
    if (s.cache_held.has_value()) {
      cache_rows.push_back(
          {SubgraphLabel(r, i), "", {d(s.cache_held), d(s.cache_on_disk)}});
    }
  }
  ChartOptions o;
  o.format = [](double v) { return Bytes(static_cast<int64_t>(v)); };
  o.binary_ticks = true;
  o.axis_label = "bytes, after each subgraph";
  if (!rss_rows.empty()) {
    absl::StrAppend(&out, BarChart("Resident memory after each subgraph",
                                   {{"resident memory", 0}}, rss_rows, o));
  }
  if (!cache_rows.empty()) {
    absl::StrAppend(
        &out, BarChart("Intermediates cache after each subgraph",
                       {{"in memory", 1}, {"on disk", 2}}, cache_rows, o));
  }
  if (rss_rows.empty() && cache_rows.empty()) {
    absl::StrAppend(&out,
                    "<p class=\"note\">Memory after each subgraph is not in "
                    "this report (written by a tracecut before it was "
                    "recorded).</p>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

std::string RecipeSection(const Report& r) {
  std::string out = absl::StrCat("<section id=\"recipe\">\n<h2>Recipe</h2>\n",
                                 "<p>", Code(r.recipe), "</p>\n");
  if (r.recipe_text.empty()) {
    absl::StrAppend(&out,
                    "<p class=\"note\">The recipe's text is not in this "
                    "report.</p>\n");
  } else {
    absl::StrAppend(&out, "<pre>", HtmlEscape(r.recipe_text), "</pre>\n");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

}  // namespace

absl::StatusOr<std::string> CalibrationReportHtml(const Json& report,
                                                  absl::string_view source) {
  Fields fields(source);
  ASSIGN_OR_RETURN(Report r, Read(report, fields));
  std::string out = html_internal::PageStart(
      absl::StrCat("tracecut calibration report: ", r.model));
  absl::StrAppend(&out, "<h1>Calibration report</h1>\n<p class=\"meta\">",
                  Code(std::string(source)), "</p>\n");
  absl::StrAppend(&out, SummarySection(r), WarningsSection(r),
                  PartitionSection(r), ErrorsSection(r), TimeSection(r),
                  MemorySection(r), RecipeSection(r));
  absl::StrAppend(&out,
                  html_internal::PageEnd("Made by tracecut report from the "
                                         "JSON report alone."));
  return out;
}

absl::StatusOr<std::string> ReportHtml(const Json& report,
                                       absl::string_view source) {
  if (report.is_object() && util::FindMember(report, "format") == nullptr &&
      util::FindMember(report, "steps") != nullptr) {
    return DebugReportHtml(report, source);
  }
  return CalibrationReportHtml(report, source);
}

}  // namespace tracecut::pipelines
