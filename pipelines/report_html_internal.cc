#include "pipelines/report_html_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "pipelines/report_html.h"
#include "util/format.h"

namespace tracecut::pipelines {

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // C0 controls other than tab and newlines are not allowed in HTML
        // text; NUL in particular.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' &&
            c != '\r') {
          out += "&#xFFFD;";
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace html_internal {

using util::Json;

absl::Status Fields::Error(absl::string_view field,
                           absl::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(source_, ": ", field, ": ", what));
}

const Json* Fields::Get(const Json& object, absl::string_view,
                        absl::string_view key) const {
  const Json* v = util::FindMember(object, key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

namespace {

std::string Member(absl::string_view field, absl::string_view key) {
  return field.empty() ? std::string(key) : absl::StrCat(field, ".", key);
}

}  // namespace

absl::StatusOr<std::optional<std::string>> Fields::String(
    const Json& object, absl::string_view field, absl::string_view key) const {
  const Json* v = Get(object, field, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) {
    return Error(Member(field, key), absl::StrCat("expected a string, got ",
                                                  util::JsonTypeName(*v)));
  }
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::optional<double>> Fields::Number(
    const Json& object, absl::string_view field, absl::string_view key) const {
  const Json* v = Get(object, field, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) {
    return Error(Member(field, key), absl::StrCat("expected a number, got ",
                                                  util::JsonTypeName(*v)));
  }
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<std::optional<int64_t>> Fields::Int(
    const Json& object, absl::string_view field, absl::string_view key) const {
  const Json* v = Get(object, field, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    return Error(Member(field, key), absl::StrCat("expected an integer, got ",
                                                  util::JsonTypeName(*v)));
  }
  return std::optional<int64_t>(v->get<int64_t>());
}

absl::StatusOr<std::optional<bool>> Fields::Bool(const Json& object,
                                                 absl::string_view field,
                                                 absl::string_view key) const {
  const Json* v = Get(object, field, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) {
    return Error(Member(field, key), absl::StrCat("expected true or false, "
                                                  "got ",
                                                  util::JsonTypeName(*v)));
  }
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<const Json*> Fields::Array(const Json& object,
                                          absl::string_view field,
                                          absl::string_view key) const {
  static const Json* const kEmpty = new Json(Json::array());
  const Json* v = Get(object, field, key);
  if (v == nullptr) return kEmpty;
  if (!v->is_array()) {
    return Error(Member(field, key), absl::StrCat("expected an array, got ",
                                                  util::JsonTypeName(*v)));
  }
  return v;
}

absl::StatusOr<const Json*> Fields::Object(const Json& object,
                                           absl::string_view field,
                                           absl::string_view key) const {
  const Json* v = Get(object, field, key);
  if (v == nullptr) return static_cast<const Json*>(nullptr);
  if (!v->is_object()) {
    return Error(Member(field, key), absl::StrCat("expected an object, got ",
                                                  util::JsonTypeName(*v)));
  }
  return v;
}

absl::StatusOr<std::vector<std::string>> Fields::Strings(
    const Json& object, absl::string_view field, absl::string_view key) const {
  absl::StatusOr<const Json*> a = Array(object, field, key);
  if (!a.ok()) return a.status();
  std::vector<std::string> out;
  for (size_t i = 0; i < (*a)->size(); ++i) {
    const Json& v = (**a)[i];
    if (!v.is_string()) {
      return Error(
          absl::StrCat(Member(field, key), "[", i, "]"),
          absl::StrCat("expected a string, got ", util::JsonTypeName(v)));
    }
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::string Num(std::optional<double> v) {
  if (!v.has_value() || !std::isfinite(*v)) return "n/a";
  return absl::StrFormat("%.4g", *v);
}

std::string Seconds(double s) {
  if (!std::isfinite(s)) return "n/a";
  if (s < 1) return absl::StrFormat("%.0f ms", s * 1000);
  return absl::StrFormat("%.2f s", s);
}

std::string Bytes(int64_t b) { return util::HumanBytes(b); }

std::string PageStart(absl::string_view title) {
  // System fonts only: the page loads nothing.
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, "
      "initial-scale=1\">\n<title>",
      HtmlEscape(title), "</title>\n", R"css(<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d2330;background:#fff;margin:0 auto;max-width:1000px;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}
h2{font-size:18px;margin:28px 0 8px;padding-top:8px;border-top:1px solid #d8dce6}
h3{font-size:15px;margin:16px 0 4px}
.meta{color:#4a5263;margin:0 0 12px}
.meta code,td code,li code{font:12px/1.3 ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:anywhere}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.card{border:1px solid #d8dce6;border-radius:6px;padding:8px 12px;min-width:150px}
.card .v{font-size:20px;font-weight:600}
.card .k{color:#4a5263;font-size:12px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border-bottom:1px solid #e4e7ee;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f9}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{background:#fdecea}
.note{color:#4a5263}
.warn{color:#8a3b00}
ul.warnings li{margin:2px 0}
pre{background:#f3f5f9;border:1px solid #d8dce6;border-radius:6px;padding:8px 12px;white-space:pre-wrap;word-break:break-all;font:12px/1.4 ui-monospace,"DejaVu Sans Mono",monospace}
figure{margin:8px 0 16px}
figcaption{font-weight:600;margin-bottom:2px}
svg text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;fill:#1d2330}
svg .grid{stroke:#e4e7ee;stroke-width:1}
svg .axis{stroke:#8a93a6;stroke-width:1}
svg .c0{fill:#3461c1}svg .c1{fill:#f0a81e}svg .c2{fill:#2e9e6b}svg .c3{fill:#9b59b6}svg .c4{fill:#8a93a6}
svg text.flag{fill:#c0392b;font-weight:600}
footer{margin-top:32px;color:#8a93a6;font-size:12px}
</style>
</head>
<body>
)css");
}

std::string PageEnd(absl::string_view footer) {
  return absl::StrCat("<footer>", HtmlEscape(footer),
                      "</footer>\n</body>\n</html>\n");
}

namespace {

constexpr int kWidth = 960;
constexpr int kLabelRight = 272;  // Right edge of the row labels.
constexpr int kPlotX = 282;
constexpr int kPlotW = 560;  // Leaves room for the value after a bar.
constexpr int kBarH = 12;
constexpr int kBarGap = 2;
constexpr int kRowGap = 10;
constexpr int kLegendH = 26;
constexpr int kAxisH = 34;
constexpr size_t kMaxLabel = 44;  // Code points; the tooltip has the rest.

std::string F(double v) { return absl::StrFormat("%.1f", v); }

// The first `n` code points of UTF-8 `s`, "…" marking a cut.
std::string Truncate(const std::string& s, size_t n) {
  size_t points = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;
    if (points == n - 1) {
      // Cut here unless this is the last code point.
      size_t rest = 0;
      for (size_t j = i; j < s.size(); ++j) {
        if ((static_cast<unsigned char>(s[j]) & 0xC0) != 0x80) ++rest;
      }
      if (rest > 1) return absl::StrCat(s.substr(0, i), "\u2026");
      return s;
    }
    ++points;
  }
  return s;
}

// 1, 2 or 5 times a power of ten, about max/4.
double NiceStep(double max) {
  const double raw = max / 4;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double m = r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10;
  return m * mag;
}

}  // namespace

std::string BarChart(absl::string_view caption,
                     const std::vector<Series>& series,
                     const std::vector<Row>& rows,
                     const ChartOptions& options) {
  const bool stacked = options.stacked && !options.log_scale;
  const int bars = stacked ? 1 : static_cast<int>(series.size());
  const int row_h = bars * (kBarH + kBarGap) - kBarGap + kRowGap;
  const int height =
      kLegendH + static_cast<int>(rows.size()) * row_h + kAxisH + 4;

  // The domain.
  double max = 0, min_pos = std::numeric_limits<double>::infinity();
  for (const Row& r : rows) {
    double sum = 0;
    for (double v : r.values) {
      if (!std::isfinite(v)) continue;
      if (v > 0) min_pos = std::min(min_pos, v);
      if (stacked) {
        sum += std::max(v, 0.0);
      } else {
        max = std::max(max, v);
      }
    }
    if (stacked) max = std::max(max, sum);
  }
  max = std::max(max, options.include_max);
  if (options.include_min_positive > 0) {
    min_pos = std::min(min_pos, options.include_min_positive);
  }
  std::vector<double> ticks;
  double lo = 0, hi = 1;  // Linear: [0, hi]; log: decades [lo, hi].
  if (options.log_scale) {
    if (std::isfinite(min_pos)) {
      lo = std::floor(std::log10(min_pos));
      hi = std::ceil(std::log10(max));
      if (hi <= lo) hi = lo + 1;
    } else {
      lo = -1;
      hi = 0;
    }
    const int decades = static_cast<int>(hi - lo);
    const int every = std::max(1, (decades + 7) / 8);
    for (int d = 0; d <= decades; d += every) {
      ticks.push_back(std::pow(10.0, lo + d));
    }
  } else {
    double step = max > 0 ? NiceStep(max) : 0.25;
    if (options.binary_ticks && max >= 1024) {
      const double unit =
          std::pow(1024.0, std::floor(std::log(max) / std::log(1024.0)));
      step = NiceStep(max / unit) * unit;
    }
    hi = max > 0 ? std::ceil(max / step - 1e-9) * step : 1;
    for (int i = 0; i * step <= hi * (1 + 1e-9); ++i) ticks.push_back(i * step);
  }
  auto x_of = [&](double v) {
    if (options.log_scale) {
      if (v <= 0) return static_cast<double>(kPlotX);
      const double t = (std::log10(v) - lo) / (hi - lo);
      return kPlotX + std::clamp(t, 0.0, 1.0) * kPlotW;
    }
    return kPlotX + std::clamp(v / hi, 0.0, 1.0) * kPlotW;
  };

  std::string svg = absl::StrCat(
      "<figure>\n<figcaption>", HtmlEscape(caption), "</figcaption>\n",
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", kWidth,
      "\" height=\"", height, "\" viewBox=\"0 0 ", kWidth, " ", height,
      "\" role=\"img\" aria-label=\"", HtmlEscape(caption), "\">\n");
  // Legend.
  int lx = kPlotX;
  for (const Series& s : series) {
    absl::StrAppend(&svg, "<rect class=\"c", s.color, "\" x=\"", lx,
                    "\" y=\"6\" width=\"12\" height=\"12\"/><text x=\"",
                    lx + 16, "\" y=\"16\">", HtmlEscape(s.name), "</text>\n");
    lx += 28 + 7 * static_cast<int>(s.name.size());
  }
  // Grid and axis.
  const int plot_top = kLegendH;
  const int plot_bottom = kLegendH + static_cast<int>(rows.size()) * row_h;
  for (double t : ticks) {
    const std::string x = F(x_of(t));
    absl::StrAppend(&svg, "<line class=\"grid\" x1=\"", x, "\" y1=\"", plot_top,
                    "\" x2=\"", x, "\" y2=\"", plot_bottom, "\"/><text x=\"", x,
                    "\" y=\"", plot_bottom + 14, "\" text-anchor=\"middle\">",
                    HtmlEscape(options.format(t)), "</text>\n");
  }
  absl::StrAppend(&svg, "<line class=\"axis\" x1=\"", kPlotX, "\" y1=\"",
                  plot_top, "\" x2=\"", kPlotX, "\" y2=\"", plot_bottom,
                  "\"/>\n");
  if (!options.axis_label.empty()) {
    absl::StrAppend(&svg, "<text x=\"", kPlotX + kPlotW / 2, "\" y=\"",
                    plot_bottom + 29, "\" text-anchor=\"middle\">",
                    HtmlEscape(options.axis_label), "</text>\n");
  }
  // Rows.
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const int y0 = plot_top + static_cast<int>(r) * row_h + kRowGap / 2;
    const int bars_h = bars * (kBarH + kBarGap) - kBarGap;
    absl::StrAppend(&svg, "<text", row.flagged ? " class=\"flag\"" : "",
                    " x=\"", kLabelRight, "\" y=\"", y0 + bars_h / 2 + 4,
                    "\" text-anchor=\"end\"><title>",
                    HtmlEscape(row.tooltip.empty() ? row.label : row.tooltip),
                    "</title>", HtmlEscape(Truncate(row.label, kMaxLabel)),
                    "</text>\n");
    double start = 0;
    for (size_t s = 0; s < series.size() && s < row.values.size(); ++s) {
      const double v = row.values[s];
      const int y = stacked ? y0 : y0 + static_cast<int>(s) * (kBarH + kBarGap);
      const std::string tip =
          absl::StrCat(series[s].name, ": ",
                       std::isfinite(v) ? options.format(v) : "not measured");
      if (!std::isfinite(v)) {
        if (!stacked) {
          absl::StrAppend(&svg, "<text x=\"", kPlotX + 4, "\" y=\"",
                          y + kBarH - 2, "\" class=\"note\">n/a</text>\n");
        }
        continue;
      }
      const double x0 = stacked ? x_of(start) : kPlotX;
      const double x1 = stacked ? x_of(start + std::max(v, 0.0)) : x_of(v);
      start += std::max(v, 0.0);
      absl::StrAppend(&svg, "<rect class=\"c", series[s].color, "\" x=\"",
                      F(x0), "\" y=\"", y, "\" width=\"",
                      F(std::max(x1 - x0, 0.0)), "\" height=\"", kBarH,
                      "\"><title>", HtmlEscape(tip), "</title></rect>\n");
      if (!stacked) {
        absl::StrAppend(&svg, "<text x=\"", F(x1 + 4), "\" y=\"", y + kBarH - 2,
                        "\">", HtmlEscape(options.format(v)), "</text>\n");
      }
    }
    if (stacked) {
      absl::StrAppend(&svg, "<text x=\"", F(x_of(start) + 4), "\" y=\"",
                      y0 + kBarH - 2, "\">", HtmlEscape(options.format(start)),
                      "</text>\n");
    }
  }
  absl::StrAppend(&svg, "</svg>\n</figure>\n");
  return svg;
}

}  // namespace html_internal
}  // namespace tracecut::pipelines
