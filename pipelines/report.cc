#include "pipelines/report.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

namespace tracecut::pipelines {
namespace {

using tracer::hf::Json;

Json StringArray(const std::vector<std::string>& v) {
  Json a = Json::MakeArray();
  for (const std::string& s : v) a.Append(Json(s));
  return a;
}

// NaN (not measured) becomes null.
Json Number(double v) { return std::isfinite(v) ? Json(v) : Json(); }

// A one-element tensor's value.
Json Scalar(const at::Tensor& t) {
  if (!t.defined() || t.numel() != 1) return Json();
  if (t.is_floating_point()) return Json(t.item<double>());
  return Json(t.item<int64_t>());
}

Json RangeJson(const ActivationRange& r) {
  Json j = Json::MakeObject();
  j.Set("observer", Json(r.observer));
  j.Set("scheme", Json(r.scheme));
  j.Set("min", Json(r.min));
  j.Set("max", Json(r.max));
  j.Set("batches", Json(r.batches));
  j.Set("scale", Scalar(r.scale));
  j.Set("zero_point", Scalar(r.zero_point));
  return j;
}

}  // namespace

Json TensorSummary(const at::Tensor& t) {
  if (!t.defined()) return Json();
  Json j = Json::MakeObject();
  Json shape = Json::MakeArray();
  for (int64_t d : t.sizes()) shape.Append(Json(d));
  j.Set("shape", std::move(shape));
  if (t.numel() == 0) return j;
  if (t.is_floating_point()) {
    at::Tensor f = t.to(at::kDouble);
    j.Set("min", Json(f.min().item<double>()));
    j.Set("max", Json(f.max().item<double>()));
    j.Set("mean", Json(f.mean().item<double>()));
  } else {
    at::Tensor i = t.to(at::kLong);
    j.Set("min", Json(i.min().item<int64_t>()));
    j.Set("max", Json(i.max().item<int64_t>()));
  }
  return j;
}

Json BuildReport(const ReportInfo& info, const CalibrationResults& results,
                 const PipelineResult* pipeline) {
  Json report = Json::MakeObject();
  report.Set("format", Json("tracecut-calibration-report"));
  report.Set("version", Json(1));
  report.Set("model", Json(info.model));
  report.Set("recipe", Json(info.recipe));
  report.Set("pipeline", Json(info.pipeline));
  report.Set("propagate_error", Json(info.propagate_error));
  report.Set("sequential_targets", StringArray(info.sequential_targets));
  Json data = Json::MakeObject();
  data.Set("source", Json(info.data_source));
  data.Set("samples", Json(info.samples));
  data.Set("seq_len", Json(info.seq_len));
  data.Set("batches", Json(info.batches));
  data.Set("fingerprint",
           Json(absl::StrFormat("%016x", info.data_fingerprint)));
  if (!info.data_inputs.empty()) {
    data.Set("inputs", StringArray(info.data_inputs));
  }
  report.Set("data", std::move(data));
  report.Set("subgraphs",
             StringArray(pipeline != nullptr ? pipeline->labels
                                             : std::vector<std::string>()));

  Json modules = Json::MakeArray();
  // Quantized modules no calibration token reached (rtn_modifier.h).
  Json uncalibrated = Json::MakeArray();
  int64_t quantized = 0, measured = 0, compared = 0;
  double sum_err = 0, max_err = 0, sum_compared = 0, sum_rtn = 0;
  for (const auto& [path, r] : results.modules) {
    Json m = Json::MakeObject();
    m.Set("path", Json(path));
    m.Set("type", Json(ShortType(r.type)));
    m.Set("subgraph", Json(static_cast<int64_t>(r.subgraph)));
    if (!r.weight_method.empty()) {
      Json w = Json::MakeObject();
      w.Set("method", Json(r.weight_method));
      w.Set("scheme", Json(r.weight_scheme));
      w.Set("scale", TensorSummary(r.weight_scale));
      w.Set("zero_point", TensorSummary(r.weight_zero_point));
      w.Set("act_order", Json(r.weight_g_idx.defined()));
      w.Set("output_error", Number(r.weight_error));
      w.Set("rtn_output_error", Number(r.rtn_error));
      w.Set("gptq_loss", Number(r.gptq_loss));
      w.Set("calibration_tokens", Json(r.calibration_tokens));
      m.Set("weight", std::move(w));
      if (r.weight_method != "observer") {
        ++quantized;
        if (r.calibration_tokens == 0) {
          Json u = Json::MakeObject();
          u.Set("path", Json(path));
          u.Set("calibration_tokens", Json(r.calibration_tokens));
          u.Set("method", Json(r.weight_method));
          uncalibrated.Append(std::move(u));
        }
      }
      if (std::isfinite(r.weight_error)) {
        ++measured;
        sum_err += r.weight_error;
        max_err = std::max(max_err, r.weight_error);
      }
      // Against round-to-nearest: only modules with both errors, both
      // measured on the same calibration inputs (the same Hessian).
      if (std::isfinite(r.weight_error) && std::isfinite(r.rtn_error)) {
        ++compared;
        sum_compared += r.weight_error;
        sum_rtn += r.rtn_error;
      }
    }
    if (!r.input.observer.empty()) m.Set("input", RangeJson(r.input));
    if (!r.output.observer.empty()) m.Set("output", RangeJson(r.output));
    m.Set("notes", StringArray(r.notes));
    modules.Append(std::move(m));
  }
  report.Set("modules", std::move(modules));

  Json summary = Json::MakeObject();
  summary.Set("modules", Json(static_cast<int64_t>(results.modules.size())));
  summary.Set("weights_quantized", Json(quantized));
  // What the errors are: per-module relative output errors of the
  // quantized weights on the calibration inputs (modifier.h).
  summary.Set("output_error_measured_on",
              Json("per-module outputs on the calibration inputs"));
  summary.Set("measured_modules", Json(measured));
  summary.Set("mean_output_error",
              measured > 0 ? Json(sum_err / measured) : Json());
  summary.Set("max_output_error", measured > 0 ? Json(max_err) : Json());
  // The comparison with round-to-nearest, over the same modules on the same
  // inputs (mean_output_error may cover more modules: RTN-quantized ones).
  summary.Set("rtn_compared_modules", Json(compared));
  summary.Set("mean_compared_output_error",
              compared > 0 ? Json(sum_compared / compared) : Json());
  summary.Set("mean_rtn_output_error",
              compared > 0 ? Json(sum_rtn / compared) : Json());
  // The means above cover measured modules only; these were not measured.
  summary.Set("uncalibrated_modules", std::move(uncalibrated));
  report.Set("summary", std::move(summary));
  report.Set("warnings", StringArray(results.warnings));

  if (info.include_run_section) {
    Json run = Json::MakeObject();
    if (pipeline != nullptr) {
      run.Set("resumed_from_subgraph",
              Json(static_cast<int64_t>(pipeline->first_subgraph)));
      Json cache = Json::MakeObject();
      cache.Set("peak_bytes_held", Json(pipeline->cache.peak_bytes_held));
      cache.Set("peak_values", Json(pipeline->peak_cache_values));
      cache.Set("bytes_spilled", Json(pipeline->cache.bytes_spilled));
      cache.Set("spill_count", Json(pipeline->cache.spill_count));
      cache.Set("reload_count", Json(pipeline->cache.reload_count));
      run.Set("cache", std::move(cache));
    }
    Json timings = Json::MakeArray();
    double total = 0;
    for (const SubgraphTiming& t : results.subgraphs) {
      Json j = Json::MakeObject();
      j.Set("subgraph", Json(static_cast<int64_t>(t.index)));
      j.Set("label", Json(t.label));
      j.Set("calibrate_seconds", Json(t.calibrate_seconds));
      j.Set("compress_seconds", Json(t.compress_seconds));
      j.Set("propagate_seconds", Json(t.propagate_seconds));
      total += t.calibrate_seconds + t.compress_seconds + t.propagate_seconds;
      timings.Append(std::move(j));
    }
    run.Set("timings", std::move(timings));
    run.Set("total_seconds", Json(total));
    Json compress = Json::MakeObject();
    for (const auto& [path, r] : results.modules) {
      if (!r.weight_method.empty() && r.weight_method != "observer") {
        compress.Set(path, Json(r.compress_seconds));
      }
    }
    run.Set("module_compress_seconds", std::move(compress));
    report.Set("run", std::move(run));
  }
  return report;
}

}  // namespace tracecut::pipelines
