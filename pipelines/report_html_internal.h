#ifndef TRACECUT_PIPELINES_REPORT_HTML_INTERNAL_H_
#define TRACECUT_PIPELINES_REPORT_HTML_INTERNAL_H_

// The pieces report_html.cc (with report_html_read.cc) and
// report_html_debug.cc share: the page frame, number formats, reading the
// report's JSON with errors naming the field, and horizontal bar charts as
// inline SVG. Not API.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "util/json.h"

namespace tracecut::pipelines::html_internal {

// The report's fields, read with errors that name them: "report.json:
// modules[3].path: expected a string, got integer". A field that is absent
// or null is "not recorded" (nullopt), never an error.
class Fields {
 public:
  explicit Fields(absl::string_view source) : source_(source) {}

  absl::Status Error(absl::string_view field, absl::string_view what) const;

  // Member `key` of `object` (`field` names the object in messages).
  const util::Json* Get(const util::Json& object, absl::string_view field,
                        absl::string_view key) const;
  absl::StatusOr<std::optional<std::string>> String(
      const util::Json& object, absl::string_view field,
      absl::string_view key) const;
  absl::StatusOr<std::optional<double>> Number(const util::Json& object,
                                               absl::string_view field,
                                               absl::string_view key) const;
  absl::StatusOr<std::optional<int64_t>> Int(const util::Json& object,
                                             absl::string_view field,
                                             absl::string_view key) const;
  absl::StatusOr<std::optional<bool>> Bool(const util::Json& object,
                                           absl::string_view field,
                                           absl::string_view key) const;
  // An array (empty when absent) / an object (nullptr when absent).
  absl::StatusOr<const util::Json*> Array(const util::Json& object,
                                          absl::string_view field,
                                          absl::string_view key) const;
  absl::StatusOr<const util::Json*> Object(const util::Json& object,
                                           absl::string_view field,
                                           absl::string_view key) const;
  // The strings of an array (each checked).
  absl::StatusOr<std::vector<std::string>> Strings(const util::Json& object,
                                                   absl::string_view field,
                                                   absl::string_view key) const;

 private:
  std::string source_;
};

// "0.06123" (4 significant digits), "n/a" for nullopt / non-finite.
std::string Num(std::optional<double> v);
// "1.25 s" / "830 ms".
std::string Seconds(double s);
// util::HumanBytes, escaped-safe.
std::string Bytes(int64_t b);

// The document up to <body>'s content, with the inline style sheet, and
// its end.
std::string PageStart(absl::string_view title);
std::string PageEnd(absl::string_view footer);

// One bar chart series: its name in the legend and its colour (0..4, CSS
// classes c0..c4).
struct Series {
  std::string name;
  int color = 0;
};

// One row of a chart: a label left of the bars (escaped here), the full
// text for its tooltip, and one value per series (NaN: not measured).
struct Row {
  std::string label;
  std::string tooltip;
  std::vector<double> values;
  bool flagged = false;  // Drawn with a red label (over tolerance).
};

struct ChartOptions {
  bool log_scale = false;  // Zero and negative values draw no bar.
  bool stacked = false;    // Values of a row end to end (linear only).
  // Text of a value (at the bar's end and on the axis).
  std::function<std::string(double)> format = [](double v) { return Num(v); };
  std::string axis_label;
  // Ticks at round numbers of KiB / MiB / GiB (for byte counts).
  bool binary_ticks = false;
  // When > 0, the domain covers these too: charts that share them share
  // their scale (the layers of one report side by side).
  double include_max = 0;
  double include_min_positive = 0;  // Log scale.
};

// A horizontal bar chart as an inline <svg> (with a <title> per bar), in a
// <figure> with `caption`. Grouped (one bar per series per row) unless
// `stacked`. Deterministic: coordinates are written with fixed precision.
std::string BarChart(absl::string_view caption,
                     const std::vector<Series>& series,
                     const std::vector<Row>& rows, const ChartOptions& options);

}  // namespace tracecut::pipelines::html_internal

#endif  // TRACECUT_PIPELINES_REPORT_HTML_INTERNAL_H_
