#ifndef TRACECUT_PIPELINES_REPORT_HTML_READ_H_
#define TRACECUT_PIPELINES_REPORT_HTML_READ_H_

// The calibration report as report_html.cc renders it, read from its JSON
// (report_html_read.cc). Not API.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipelines/report_html_internal.h"
#include "util/json.h"

namespace tracecut::pipelines::html_internal {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// What a report says, read and checked once; the sections render from it.
struct Module {
  std::string path;
  std::string type;
  int64_t subgraph = -1;
  bool quantized = false;  // A weight method other than "observer".
  std::string method;
  std::string scheme;
  double error = kNaN;
  double rtn_error = kNaN;
  double gptq_loss = kNaN;
  int64_t tokens = 0;
  std::vector<std::string> notes;
};

struct SubgraphRun {
  std::optional<int64_t> nodes;
  std::optional<int64_t> param_bytes;
  double calibrate = kNaN, compress = kNaN, propagate = kNaN, io = kNaN;
  std::optional<int64_t> cache_held, cache_on_disk, rss;
};

struct Uncalibrated {
  std::string path;
  std::string method;
};

struct Report {
  std::string model, recipe, recipe_text, pipeline;
  std::optional<bool> propagate_error;
  std::vector<std::string> targets;
  std::string data_source;
  std::optional<int64_t> samples, seq_len, min_seq_len, batches;
  std::string fingerprint;
  std::vector<std::string> data_inputs;
  std::vector<std::string> subgraphs;
  std::vector<Module> modules;
  std::optional<int64_t> weights_quantized;
  std::optional<double> mean_error, max_error, mean_compared, mean_rtn;
  std::optional<int64_t> measured, compared;
  std::vector<Uncalibrated> uncalibrated;
  std::vector<std::string> warnings;
  // The run section (absent in a --deterministic-report).
  bool has_run = false;
  std::map<int64_t, SubgraphRun> runs;  // By subgraph index.
  std::optional<double> total_seconds;
  std::optional<int64_t> peak_rss, cache_peak_held, cache_peak_values,
      cache_spilled, spill_count, reload_count, streamed_peak;
  std::optional<int64_t> resumed_from;
};

// Reads and checks `j`, a calibration report; errors name the field.
absl::StatusOr<Report> Read(const util::Json& j, const Fields& f);

}  // namespace tracecut::pipelines::html_internal

#endif  // TRACECUT_PIPELINES_REPORT_HTML_READ_H_
