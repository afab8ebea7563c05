// Reading a calibration report's JSON for its page (report_html_read.h).

#include "pipelines/report_html_read.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "pipelines/report_html_internal.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::pipelines::html_internal {
namespace {

using util::Json;

double Or(std::optional<double> v) { return v.value_or(kNaN); }

// Member `key` of `o` into `out`: "" when absent.
absl::Status ReadString(const Fields& f, const Json& o, absl::string_view field,
                        absl::string_view key, std::string& out) {
  ASSIGN_OR_RETURN(std::optional<std::string> v, f.String(o, field, key));
  out = v.value_or("");
  return absl::OkStatus();
}

// Its modules (`modules`).
absl::Status ReadModules(const Json& j, const Fields& f, Report& r) {
  ASSIGN_OR_RETURN(const Json* modules, f.Array(j, "", "modules"));
  for (size_t i = 0; i < modules->size(); ++i) {
    const Json& m = (*modules)[i];
    const std::string field = absl::StrCat("modules[", i, "]");
    if (!m.is_object()) {
      return f.Error(field, absl::StrCat("expected an object, got ",
                                         util::JsonTypeName(m)));
    }
    Module mod;
    ASSIGN_OR_RETURN(std::optional<std::string> path,
                     f.String(m, field, "path"));
    if (!path.has_value()) return f.Error(field, "has no path");
    mod.path = *path;
    RETURN_IF_ERROR(ReadString(f, m, field, "type", mod.type));
    ASSIGN_OR_RETURN(std::optional<int64_t> sub, f.Int(m, field, "subgraph"));
    mod.subgraph = sub.value_or(-1);
    ASSIGN_OR_RETURN(const Json* w, f.Object(m, field, "weight"));
    if (w != nullptr) {
      const std::string wf = absl::StrCat(field, ".weight");
      RETURN_IF_ERROR(ReadString(f, *w, wf, "method", mod.method));
      RETURN_IF_ERROR(ReadString(f, *w, wf, "scheme", mod.scheme));
      mod.quantized = !mod.method.empty() && mod.method != "observer";
      ASSIGN_OR_RETURN(std::optional<double> e,
                       f.Number(*w, wf, "output_error"));
      mod.error = Or(e);
      ASSIGN_OR_RETURN(e, f.Number(*w, wf, "rtn_output_error"));
      mod.rtn_error = Or(e);
      ASSIGN_OR_RETURN(e, f.Number(*w, wf, "gptq_loss"));
      mod.gptq_loss = Or(e);
      ASSIGN_OR_RETURN(std::optional<int64_t> t,
                       f.Int(*w, wf, "calibration_tokens"));
      mod.tokens = t.value_or(0);
    }
    ASSIGN_OR_RETURN(mod.notes, f.Strings(m, field, "notes"));
    r.modules.push_back(std::move(mod));
  }
  return absl::OkStatus();
}

// Its summary (`summary`), when it has one.
absl::Status ReadSummary(const Json& j, const Fields& f, Report& r) {
  ASSIGN_OR_RETURN(const Json* summary, f.Object(j, "", "summary"));
  if (summary != nullptr) {
    const std::string sf = "summary";
    ASSIGN_OR_RETURN(r.weights_quantized,
                     f.Int(*summary, sf, "weights_quantized"));
    ASSIGN_OR_RETURN(r.measured, f.Int(*summary, sf, "measured_modules"));
    ASSIGN_OR_RETURN(r.mean_error, f.Number(*summary, sf, "mean_output_error"));
    ASSIGN_OR_RETURN(r.max_error, f.Number(*summary, sf, "max_output_error"));
    ASSIGN_OR_RETURN(r.compared, f.Int(*summary, sf, "rtn_compared_modules"));
    ASSIGN_OR_RETURN(r.mean_compared,
                     f.Number(*summary, sf, "mean_compared_output_error"));
    ASSIGN_OR_RETURN(r.mean_rtn,
                     f.Number(*summary, sf, "mean_rtn_output_error"));
    ASSIGN_OR_RETURN(const Json* unc,
                     f.Array(*summary, sf, "uncalibrated_modules"));
    for (size_t i = 0; i < unc->size(); ++i) {
      const Json& u = (*unc)[i];
      const std::string uf =
          absl::StrCat("summary.uncalibrated_modules[", i, "]");
      if (!u.is_object()) {
        return f.Error(uf, absl::StrCat("expected an object, got ",
                                        util::JsonTypeName(u)));
      }
      Uncalibrated entry;
      RETURN_IF_ERROR(ReadString(f, u, uf, "path", entry.path));
      RETURN_IF_ERROR(ReadString(f, u, uf, "method", entry.method));
      r.uncalibrated.push_back(std::move(entry));
    }
  }
  return absl::OkStatus();
}

// Its run section (`run`), absent in a --deterministic-report.
absl::Status ReadRun(const Json& j, const Fields& f, Report& r) {
  ASSIGN_OR_RETURN(const Json* run, f.Object(j, "", "run"));
  if (run != nullptr) {
    r.has_run = true;
    ASSIGN_OR_RETURN(r.resumed_from,
                     f.Int(*run, "run", "resumed_from_subgraph"));
    ASSIGN_OR_RETURN(r.total_seconds, f.Number(*run, "run", "total_seconds"));
    ASSIGN_OR_RETURN(r.peak_rss, f.Int(*run, "run", "peak_rss_bytes"));
    ASSIGN_OR_RETURN(r.streamed_peak,
                     f.Int(*run, "run", "streamed_peak_weight_bytes"));
    ASSIGN_OR_RETURN(const Json* cache, f.Object(*run, "run", "cache"));
    if (cache != nullptr) {
      ASSIGN_OR_RETURN(r.cache_peak_held,
                       f.Int(*cache, "run.cache", "peak_bytes_held"));
      ASSIGN_OR_RETURN(r.cache_peak_values,
                       f.Int(*cache, "run.cache", "peak_values"));
      ASSIGN_OR_RETURN(r.cache_spilled,
                       f.Int(*cache, "run.cache", "bytes_spilled"));
      ASSIGN_OR_RETURN(r.spill_count,
                       f.Int(*cache, "run.cache", "spill_count"));
      ASSIGN_OR_RETURN(r.reload_count,
                       f.Int(*cache, "run.cache", "reload_count"));
    }
    ASSIGN_OR_RETURN(const Json* timings, f.Array(*run, "run", "timings"));
    for (size_t i = 0; i < timings->size(); ++i) {
      const Json& t = (*timings)[i];
      const std::string tf = absl::StrCat("run.timings[", i, "]");
      if (!t.is_object()) {
        return f.Error(tf, absl::StrCat("expected an object, got ",
                                        util::JsonTypeName(t)));
      }
      ASSIGN_OR_RETURN(std::optional<int64_t> index, f.Int(t, tf, "subgraph"));
      if (!index.has_value()) return f.Error(tf, "has no subgraph");
      SubgraphRun& s = r.runs[*index];
      ASSIGN_OR_RETURN(std::optional<double> v,
                       f.Number(t, tf, "calibrate_seconds"));
      s.calibrate = Or(v);
      ASSIGN_OR_RETURN(v, f.Number(t, tf, "compress_seconds"));
      s.compress = Or(v);
      ASSIGN_OR_RETURN(v, f.Number(t, tf, "propagate_seconds"));
      s.propagate = Or(v);
    }
    ASSIGN_OR_RETURN(const Json* subs, f.Array(*run, "run", "subgraphs"));
    for (size_t i = 0; i < subs->size(); ++i) {
      const Json& t = (*subs)[i];
      const std::string tf = absl::StrCat("run.subgraphs[", i, "]");
      if (!t.is_object()) {
        return f.Error(tf, absl::StrCat("expected an object, got ",
                                        util::JsonTypeName(t)));
      }
      ASSIGN_OR_RETURN(std::optional<int64_t> index, f.Int(t, tf, "subgraph"));
      if (!index.has_value()) return f.Error(tf, "has no subgraph");
      SubgraphRun& s = r.runs[*index];
      ASSIGN_OR_RETURN(s.nodes, f.Int(t, tf, "nodes"));
      ASSIGN_OR_RETURN(s.param_bytes, f.Int(t, tf, "param_bytes"));
      ASSIGN_OR_RETURN(std::optional<double> load,
                       f.Number(t, tf, "load_seconds"));
      ASSIGN_OR_RETURN(std::optional<double> write,
                       f.Number(t, tf, "write_seconds"));
      if (load.has_value() || write.has_value()) {
        s.io = load.value_or(0) + write.value_or(0);
      }
      ASSIGN_OR_RETURN(s.cache_held, f.Int(t, tf, "cache_bytes_held"));
      ASSIGN_OR_RETURN(s.cache_on_disk, f.Int(t, tf, "cache_bytes_on_disk"));
      ASSIGN_OR_RETURN(s.rss, f.Int(t, tf, "rss_bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Report> Read(const Json& j, const Fields& f) {
  Report r;
  if (!j.is_object()) {
    return f.Error("(top level)", absl::StrCat("expected an object, got ",
                                               util::JsonTypeName(j)));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> format,
                   f.String(j, "", "format"));
  if (format != "tracecut-calibration-report") {
    return f.Error(
        "format",
        absl::StrCat("expected \"tracecut-calibration-report\", "
                     "got ",
                     format.has_value() ? absl::StrCat("\"", *format, "\"")
                                        : std::string("nothing")));
  }
  RETURN_IF_ERROR(ReadString(f, j, "", "model", r.model));
  RETURN_IF_ERROR(ReadString(f, j, "", "recipe", r.recipe));
  RETURN_IF_ERROR(ReadString(f, j, "", "recipe_text", r.recipe_text));
  RETURN_IF_ERROR(ReadString(f, j, "", "pipeline", r.pipeline));
  ASSIGN_OR_RETURN(r.propagate_error, f.Bool(j, "", "propagate_error"));
  ASSIGN_OR_RETURN(r.targets, f.Strings(j, "", "sequential_targets"));
  ASSIGN_OR_RETURN(const Json* data, f.Object(j, "", "data"));
  if (data != nullptr) {
    RETURN_IF_ERROR(ReadString(f, *data, "data", "source", r.data_source));
    ASSIGN_OR_RETURN(r.samples, f.Int(*data, "data", "samples"));
    ASSIGN_OR_RETURN(r.seq_len, f.Int(*data, "data", "seq_len"));
    ASSIGN_OR_RETURN(r.min_seq_len, f.Int(*data, "data", "min_seq_len"));
    ASSIGN_OR_RETURN(r.batches, f.Int(*data, "data", "batches"));
    RETURN_IF_ERROR(ReadString(f, *data, "data", "fingerprint", r.fingerprint));
    ASSIGN_OR_RETURN(r.data_inputs, f.Strings(*data, "data", "inputs"));
  }
  ASSIGN_OR_RETURN(r.subgraphs, f.Strings(j, "", "subgraphs"));
  RETURN_IF_ERROR(ReadModules(j, f, r));
  RETURN_IF_ERROR(ReadSummary(j, f, r));
  ASSIGN_OR_RETURN(r.warnings, f.Strings(j, "", "warnings"));
  RETURN_IF_ERROR(ReadRun(j, f, r));
  return r;
}

}  // namespace tracecut::pipelines::html_internal
