// The HTML pages of reports: every section for a report with given numbers,
// the numbers themselves in the text and in the bars' sizes, escaping of the
// report's strings, determinism, and bad reports as one error naming the
// field.

#include "pipelines/report_html.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "util/json.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::tracecut::util::testing::StatusIs;
using util::Json;

constexpr char kEvil[] = "model.layers.0.<script>alert('x')</script>&\"q\"";

Json Module(const std::string& path, int64_t subgraph, const char* method,
            double error, double rtn, int64_t tokens) {
  Json m = Json::object();
  m["path"] = path;
  m["type"] = "Linear";
  m["subgraph"] = subgraph;
  Json w = Json::object();
  w["method"] = method;
  w["scheme"] = "int4 sym g128";
  w["output_error"] = error;
  w["rtn_output_error"] = rtn;
  w["calibration_tokens"] = tokens;
  m["weight"] = w;
  m["notes"] = Json::array();
  return m;
}

// What pipelines/report.cc writes for a 2-layer model, with chosen numbers.
Json SampleReport() {
  Json r = Json::object();
  r["format"] = "tracecut-calibration-report";
  r["version"] = 1;
  r["model"] = "/tmp/llama";
  r["recipe"] = "w4.textproto";
  r["recipe_text"] = "modifiers { gptq { scheme { bits: 4 } } }";
  r["pipeline"] = "sequential";
  r["propagate_error"] = true;
  r["sequential_targets"] = Json::array({"LlamaDecoderLayer"});
  Json data = Json::object();
  data["source"] = "synthetic";
  data["samples"] = 64;
  data["seq_len"] = 16;
  data["batches"] = 8;
  data["fingerprint"] = "00000000deadbeef";
  r["data"] = data;
  r["subgraphs"] = Json::array({"(head)", "model.layers.0", "model.layers.1"});
  Json modules = Json::array();
  modules.push_back(
      Module("model.layers.0.mlp.down_proj", 1, "gptq", 0.0625, 0.125, 1024));
  modules.push_back(Module(kEvil, 1, "gptq", 0.03125, 0.0625, 1024));
  modules.push_back(
      Module("model.layers.1.self_attn.q_proj", 2, "gptq", 0.0123, 0.0456, 0));
  modules[2]["notes"] = Json::array({"no calibration tokens"});
  r["modules"] = modules;
  Json summary = Json::object();
  summary["modules"] = 3;
  summary["weights_quantized"] = 3;
  summary["measured_modules"] = 3;
  summary["mean_output_error"] = 0.0354;
  summary["max_output_error"] = 0.0625;
  summary["rtn_compared_modules"] = 3;
  summary["mean_compared_output_error"] = 0.0354;
  summary["mean_rtn_output_error"] = 0.0778;
  Json unc = Json::object();
  unc["path"] = "model.layers.1.self_attn.q_proj";
  unc["calibration_tokens"] = 0;
  unc["method"] = "rtn";
  summary["uncalibrated_modules"] = Json::array({unc});
  r["summary"] = summary;
  r["warnings"] = Json::array({"expert <7> fell back to RTN"});
  Json run = Json::object();
  run["resumed_from_subgraph"] = 0;
  Json cache = Json::object();
  cache["peak_bytes_held"] = 3 * 1024 * 1024;
  cache["peak_values"] = 24;
  cache["bytes_spilled"] = 0;
  cache["spill_count"] = 0;
  cache["reload_count"] = 0;
  run["cache"] = cache;
  Json timings = Json::array();
  Json subs = Json::array();
  for (int i = 0; i < 3; ++i) {
    Json t = Json::object();
    t["subgraph"] = i;
    t["label"] = r["subgraphs"][i];
    t["calibrate_seconds"] = 0.5 * (i + 1);
    t["compress_seconds"] = 0.375;
    t["propagate_seconds"] = 0.125;
    timings.push_back(t);
    Json s = Json::object();
    s["subgraph"] = i;
    s["nodes"] = 100 + i;
    s["param_bytes"] = int64_t{1} << (20 + i);  // 1, 2, 4 MiB.
    s["load_seconds"] = 0.0625;
    s["write_seconds"] = 0.1875;
    s["cache_bytes_held"] = 1024 * (i + 1);
    s["cache_bytes_on_disk"] = 0;
    s["rss_bytes"] = int64_t{300} << 20;
    subs.push_back(s);
  }
  run["timings"] = timings;
  run["subgraphs"] = subs;
  run["total_seconds"] = 4.5;
  run["peak_rss_bytes"] = int64_t{512} << 20;
  r["run"] = run;
  return r;
}

std::string Render(const Json& report) {
  absl::StatusOr<std::string> html = CalibrationReportHtml(report, "r.json");
  EXPECT_OK(html);
  return html.ok() ? *html : "";
}

TEST(HtmlEscapeTest, EscapesMarkupQuotesAndControls) {
  EXPECT_EQ(HtmlEscape("a<b>&\"c\"'d'"),
            "a&lt;b&gt;&amp;&quot;c&quot;&#39;d&#39;");
  EXPECT_EQ(HtmlEscape(std::string("x\0y\x01z\tw\n", 8)),
            "x&#xFFFD;y&#xFFFD;z\tw\n");
  EXPECT_EQ(HtmlEscape("model.layers.0.mlp \xC3\xA9"),
            "model.layers.0.mlp \xC3\xA9");
}

TEST(CalibrationReportHtmlTest, EverySectionIsPresent) {
  const std::string html = Render(SampleReport());
  for (const char* id : {"summary", "warnings", "partition", "errors", "time",
                         "memory", "recipe"}) {
    EXPECT_THAT(html, HasSubstr(absl::StrCat("<section id=\"", id, "\">")))
        << id;
  }
  EXPECT_TRUE(absl::StartsWith(html, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::EndsWith(html, "</html>\n"));
}

TEST(CalibrationReportHtmlTest, HoldsTheReportsFigures) {
  const std::string html = Render(SampleReport());
  // Module paths, errors (4 significant digits) and their ratio.
  EXPECT_THAT(html, HasSubstr("model.layers.0.mlp.down_proj"));
  EXPECT_THAT(html, HasSubstr(">0.0625<"));
  EXPECT_THAT(html, HasSubstr(">0.125<"));
  EXPECT_THAT(html, HasSubstr(">0.0123<"));
  EXPECT_THAT(html, HasSubstr(">0.0456<"));
  EXPECT_THAT(html, HasSubstr(">0.5<"));  // 0.0625 / 0.125.
  // Summary means.
  EXPECT_THAT(html, HasSubstr(">0.0354<"));
  EXPECT_THAT(html, HasSubstr(">0.0778<"));
  // Partition: nodes and parameter bytes.
  EXPECT_THAT(html, HasSubstr(">101<"));
  EXPECT_THAT(html, HasSubstr(">2.0 MiB<"));
  EXPECT_THAT(html, HasSubstr(">4.0 MiB<"));
  // Time split: 1.5 s calibrating subgraph 2, 375 ms compressing, 250 ms
  // of weight I/O (load + write) each.
  EXPECT_THAT(html, HasSubstr(">1.50 s<"));
  EXPECT_THAT(html, HasSubstr(">375 ms<"));
  EXPECT_THAT(html, HasSubstr(">250 ms<"));
  EXPECT_THAT(html, HasSubstr("weight I/O"));
  // Memory.
  EXPECT_THAT(html, HasSubstr(">512.0 MiB<"));
  EXPECT_THAT(html, HasSubstr(">3.0 MiB<"));
  // Warnings, uncalibrated modules, notes, the recipe.
  EXPECT_THAT(html, HasSubstr("expert &lt;7&gt; fell back to RTN"));
  EXPECT_THAT(html, HasSubstr("no calibration token reached it"));
  EXPECT_THAT(html, HasSubstr("no calibration tokens"));
  EXPECT_THAT(html, HasSubstr("modifiers { gptq { scheme { bits: 4 } } }"));
}

// The bars of one layer's chart: widths proportional to the errors.
TEST(CalibrationReportHtmlTest, BarLengthsFollowTheNumbers) {
  const std::string html = Render(SampleReport());
  const size_t start = html.find("Subgraph #1 model.layers.0");
  ASSERT_NE(start, std::string::npos);
  const size_t end = html.find("</figure>", start);
  const std::string chart = html.substr(start, end - start);
  std::regex rect("width=\"([0-9.]+)\" height=\"12\"><title>([^<]*)</title>");
  std::vector<double> widths;
  std::vector<std::string> titles;
  for (auto it = std::sregex_iterator(chart.begin(), chart.end(), rect);
       it != std::sregex_iterator(); ++it) {
    double w = 0;
    ASSERT_TRUE(absl::SimpleAtod((*it)[1].str(), &w));
    widths.push_back(w);
    titles.push_back((*it)[2].str());
  }
  // down_proj (GPTQ, RTN), then the module with the hostile name.
  ASSERT_EQ(widths.size(), 4u);
  EXPECT_EQ(titles[0], "GPTQ: 0.0625");
  EXPECT_EQ(titles[1], "round-to-nearest: 0.125");
  EXPECT_NEAR(widths[1] / widths[0], 2.0, 0.01);
  EXPECT_NEAR(widths[0] / widths[2], 2.0, 0.01);
  EXPECT_NEAR(widths[1] / widths[3], 2.0, 0.01);
}

TEST(CalibrationReportHtmlTest, EscapesEveryStringOfTheReport) {
  Json r = SampleReport();
  r["model"] = "</title><script>x()</script>";
  r["recipe_text"] = "<img src=x onerror=y()>";
  r["sequential_targets"] = Json::array({"<b>Layer</b>"});
  r["subgraphs"][1] = "<i>layers.0</i>";
  const std::string html = Render(r);
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("<img")));
  EXPECT_THAT(html, Not(HasSubstr("<b>Layer")));
  EXPECT_THAT(html, Not(HasSubstr("<i>layers")));
  EXPECT_THAT(html, Not(HasSubstr("alert('x')")));
  EXPECT_THAT(html,
              HasSubstr("model.layers.0.&lt;script&gt;alert(&#39;x&#39;)&lt;/"
                        "script&gt;&amp;&quot;q&quot;"));
  EXPECT_THAT(html, HasSubstr("&lt;/title&gt;&lt;script&gt;x()"));
}

TEST(CalibrationReportHtmlTest, SameReportSameBytes) {
  const Json r = SampleReport();
  const std::string first = Render(r);
  absl::StatusOr<Json> reparsed = util::ParseJson(util::DumpJson(r, 2));
  ASSERT_OK(reparsed);
  EXPECT_EQ(Render(*reparsed), first);
  EXPECT_EQ(Render(r), first);
}

TEST(CalibrationReportHtmlTest, DeterministicReportSaysWhatIsMissing) {
  Json r = SampleReport();
  r.erase("run");
  const std::string html = Render(r);
  EXPECT_THAT(html, HasSubstr("<section id=\"time\">"));
  EXPECT_THAT(html, HasSubstr("Timings not recorded"));
  EXPECT_THAT(html, HasSubstr("Memory and cache use not recorded"));
  EXPECT_THAT(html, HasSubstr("Node counts and parameter bytes not recorded"));
  // No time chart drawn from nothing.
  EXPECT_THAT(html, Not(HasSubstr("Calibrate / compress / propagate")));
}

TEST(CalibrationReportHtmlTest, BadReportNamesTheField) {
  Json r = SampleReport();
  r["modules"][1]["path"] = 7;
  EXPECT_THAT(CalibrationReportHtml(r, "r.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("r.json: modules[1].path: expected a "
                                 "string, got integer")));
  r = SampleReport();
  r["run"]["timings"][0]["calibrate_seconds"] = "slow";
  EXPECT_THAT(CalibrationReportHtml(r, "r.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("run.timings[0].calibrate_seconds")));
  EXPECT_THAT(CalibrationReportHtml(Json::array(), "r.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected an object, got array")));
  Json other = Json::object();
  other["format"] = "something-else";
  EXPECT_THAT(ReportHtml(other, "o.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("o.json: format: expected "
                                 "\"tracecut-calibration-report\"")));
}

Json DebugSample() {
  Json r = Json::object();
  r["rtol"] = 1e-4;
  r["atol"] = 1e-5;
  Json first = Json::object();
  first["subgraph"] = 1;
  first["pass"] = "gelu-tanh-approx";
  first["module_paths"] = Json::array({"encoder.layer.0"});
  first["max_abs"] = 0.0021;
  first["max_rel"] = 0.0105;
  first["violations"] = 12;
  first["elements"] = 512;
  first["worst"] = "%add_3[0, 1]: 0.2 vs 0.2021";
  first["mismatch"] = nullptr;
  r["first_exceeding"] = first;
  Json subs = Json::array();
  for (int i = 0; i < 2; ++i) {
    Json s = Json::object();
    s["index"] = i;
    s["module_paths"] =
        i == 0 ? Json::array() : Json::array({"encoder.layer.0"});
    s["input_names"] = Json::array();
    s["output_names"] = Json::array();
    subs.push_back(s);
  }
  r["subgraphs"] = subs;
  Json steps = Json::array();
  auto step = [](int sub, const char* pass, double rel, bool exceeds) {
    Json s = Json::object();
    s["subgraph"] = sub;
    s["pass"] = pass;
    s["changed"] = rel != 0;
    s["preserves_computation"] = true;
    s["max_abs"] = rel / 5;
    s["max_rel"] = rel;
    s["violations"] = exceeds ? 12 : 0;
    s["cumulative_max_abs"] = rel / 5;
    s["cumulative_max_rel"] = rel;
    s["exceeds"] = exceeds;
    s["touched_nodes"] = Json::array({"gelu"});
    return s;
  };
  steps.push_back(step(0, "fuse-bias-in-linear", 0, false));
  steps.push_back(step(1, "fuse-bias-in-linear", 3.5e-8, false));
  steps.push_back(step(1, "gelu-tanh-approx", 0.0105, true));
  r["steps"] = steps;
  return r;
}

TEST(DebugReportHtmlTest, VerdictChartsAndSteps) {
  absl::StatusOr<std::string> html = ReportHtml(DebugSample(), "d.json");
  ASSERT_OK(html);
  for (const char* id : {"verdict", "errors", "steps"}) {
    EXPECT_THAT(*html, HasSubstr(absl::StrCat("<section id=\"", id, "\">")));
  }
  EXPECT_THAT(*html, HasSubstr("First over the tolerance"));
  EXPECT_THAT(*html, HasSubstr("gelu-tanh-approx"));
  EXPECT_THAT(*html, HasSubstr("#1 (encoder.layer.0)"));
  EXPECT_THAT(*html, HasSubstr(">1.05e-02<"));
  EXPECT_THAT(*html, HasSubstr(">3.50e-08<"));
  EXPECT_THAT(*html, HasSubstr("%add_3[0, 1]: 0.2 vs 0.2021"));
  // The step over the tolerance is flagged in the chart and the table.
  EXPECT_THAT(*html, HasSubstr("class=\"flag\""));
  EXPECT_THAT(*html, HasSubstr("<tr class=\"bad\">"));
  absl::StatusOr<std::string> again = ReportHtml(DebugSample(), "d.json");
  ASSERT_OK(again);
  EXPECT_EQ(*again, *html);
}

TEST(DebugReportHtmlTest, BadStepNamesTheField) {
  Json r = DebugSample();
  r["steps"][2]["max_rel"] = "big";
  EXPECT_THAT(DebugReportHtml(r, "d.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("d.json: steps[2].max_rel: expected a "
                                 "number, got string")));
}

}  // namespace
}  // namespace tracecut::pipelines
