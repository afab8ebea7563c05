#include "pipelines/report.h"

#include <ATen/ATen.h>
#include <sys/resource.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::ActivationRange;
using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::ShortType;
using ::tracecut::modifiers::SubgraphTiming;
namespace {

using util::Json;

Json StringArray(const std::vector<std::string>& v) {
  Json a = Json::array();
  for (const std::string& s : v) a.push_back(Json(s));
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
  Json j = Json::object();
  j["observer"] = Json(r.observer);
  j["scheme"] = Json(r.scheme);
  j["min"] = Json(r.min);
  j["max"] = Json(r.max);
  j["batches"] = Json(r.batches);
  j["scale"] = Scalar(r.scale);
  j["zero_point"] = Scalar(r.zero_point);
  if (r.global_scale.defined()) j["global_scale"] = Scalar(r.global_scale);
  return j;
}

}  // namespace

Json TensorSummary(const at::Tensor& t) {
  if (!t.defined()) return Json();
  Json j = Json::object();
  Json shape = Json::array();
  for (int64_t d : t.sizes()) shape.push_back(Json(d));
  j["shape"] = std::move(shape);
  if (t.numel() == 0) return j;
  if (t.is_floating_point()) {
    at::Tensor f = t.to(at::kDouble);
    j["min"] = Json(f.min().item<double>());
    j["max"] = Json(f.max().item<double>());
    j["mean"] = Json(f.mean().item<double>());
  } else {
    at::Tensor i = t.to(at::kLong);
    j["min"] = Json(i.min().item<int64_t>());
    j["max"] = Json(i.max().item<int64_t>());
  }
  return j;
}

namespace {

// The per-module entries and their summary.
void AddModules(const CalibrationResults& results, Json& report) {
  Json modules = Json::array();
  // Quantized modules no calibration token reached (weight_quant_modifier.h).
  Json uncalibrated = Json::array();
  int64_t quantized = 0, measured = 0, compared = 0;
  double sum_err = 0, max_err = 0, sum_compared = 0, sum_rtn = 0;
  for (const auto& [path, r] : results.modules) {
    Json m = Json::object();
    m["path"] = Json(path);
    m["type"] = Json(ShortType(r.type));
    m["subgraph"] = Json(static_cast<int64_t>(r.subgraph));
    if (!r.weight_method.empty()) {
      Json w = Json::object();
      w["method"] = Json(r.weight_method);
      w["scheme"] = Json(r.weight_scheme);
      w["scale"] = TensorSummary(r.weight_scale);
      w["zero_point"] = TensorSummary(r.weight_zero_point);
      w["act_order"] = Json(r.weight_g_idx.defined());
      w["output_error"] = Number(r.weight_error);
      w["rtn_output_error"] = Number(r.rtn_error);
      w["gptq_loss"] = Number(r.gptq_loss);
      w["calibration_tokens"] = Json(r.calibration_tokens);
      m["weight"] = std::move(w);
      if (r.weight_method != "observer") {
        ++quantized;
        if (r.calibration_tokens == 0) {
          Json u = Json::object();
          u["path"] = Json(path);
          u["calibration_tokens"] = Json(r.calibration_tokens);
          u["method"] = Json(r.weight_method);
          uncalibrated.push_back(std::move(u));
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
    if (!r.input.observer.empty()) m["input"] = RangeJson(r.input);
    if (!r.kv_cache_scheme.empty()) {
      m["k_cache"] = RangeJson(r.k_cache);
      m["v_cache"] = RangeJson(r.v_cache);
    }
    if (!r.output.observer.empty()) m["output"] = RangeJson(r.output);
    m["notes"] = StringArray(r.notes);
    modules.push_back(std::move(m));
  }
  report["modules"] = std::move(modules);

  Json summary = Json::object();
  summary["modules"] = Json(static_cast<int64_t>(results.modules.size()));
  summary["weights_quantized"] = Json(quantized);
  // What the errors are: per-module relative output errors of the
  // quantized weights on the calibration inputs (modifier.h).
  summary["output_error_measured_on"] =
      Json("per-module outputs on the calibration inputs");
  summary["measured_modules"] = Json(measured);
  summary["mean_output_error"] =
      measured > 0 ? Json(sum_err / measured) : Json();
  summary["max_output_error"] = measured > 0 ? Json(max_err) : Json();
  // The comparison with round-to-nearest, over the same modules on the same
  // inputs (mean_output_error may cover more modules: RTN-quantized ones).
  summary["rtn_compared_modules"] = Json(compared);
  summary["mean_compared_output_error"] =
      compared > 0 ? Json(sum_compared / compared) : Json();
  summary["mean_rtn_output_error"] =
      compared > 0 ? Json(sum_rtn / compared) : Json();
  // The means above cover measured modules only; these were not measured.
  summary["uncalibrated_modules"] = std::move(uncalibrated);
  report["summary"] = std::move(summary);
}

// Timings, memory and cache statistics: what differs from run to run.
Json RunSection(const ReportInfo& info, const CalibrationResults& results,
                const PipelineResult* pipeline) {
  Json run = Json::object();
  if (pipeline != nullptr) {
    run["resumed_from_subgraph"] =
        Json(static_cast<int64_t>(pipeline->first_subgraph));
    Json cache = Json::object();
    cache["peak_bytes_held"] = Json(pipeline->cache.peak_bytes_held);
    cache["peak_values"] = Json(pipeline->peak_cache_values);
    cache["bytes_spilled"] = Json(pipeline->cache.bytes_spilled);
    cache["spill_count"] = Json(pipeline->cache.spill_count);
    cache["reload_count"] = Json(pipeline->cache.reload_count);
    run["cache"] = std::move(cache);
  }
  Json timings = Json::array();
  double total = 0;
  for (const SubgraphTiming& t : results.subgraphs) {
    Json j = Json::object();
    j["subgraph"] = Json(static_cast<int64_t>(t.index));
    j["label"] = Json(t.label);
    j["calibrate_seconds"] = Json(t.calibrate_seconds);
    j["compress_seconds"] = Json(t.compress_seconds);
    j["propagate_seconds"] = Json(t.propagate_seconds);
    total += t.calibrate_seconds + t.compress_seconds + t.propagate_seconds;
    timings.push_back(std::move(j));
  }
  run["timings"] = std::move(timings);
  run["total_seconds"] = Json(total);
  Json compress = Json::object();
  for (const auto& [path, r] : results.modules) {
    if (!r.weight_method.empty() && r.weight_method != "observer") {
      compress[path] = Json(r.compress_seconds);
    }
  }
  run["module_compress_seconds"] = std::move(compress);
  if (pipeline != nullptr) {
    Json subgraphs = Json::array();
    for (const SubgraphCacheStats& st : pipeline->subgraphs) {
      Json j = Json::object();
      j["subgraph"] = Json(static_cast<int64_t>(st.index));
      j["label"] = Json(st.label);
      j["nodes"] = Json(st.nodes);
      j["param_bytes"] = Json(st.param_bytes);
      j["load_seconds"] = Json(st.load_seconds);
      j["write_seconds"] = Json(st.write_seconds);
      j["cache_values"] = Json(st.values);
      j["cache_bytes_held"] = Json(st.bytes_held);
      j["cache_bytes_on_disk"] = Json(st.bytes_on_disk);
      j["rss_bytes"] = Json(st.rss_bytes);
      if (st.device_peak_bytes > 0) {
        j["device_peak_bytes"] = Json(st.device_peak_bytes);
      }
      subgraphs.push_back(std::move(j));
    }
    run["subgraphs"] = std::move(subgraphs);
  }
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    run["peak_rss_bytes"] = Json(static_cast<int64_t>(usage.ru_maxrss) * 1024);
  }
  run["device"] = Json(info.device);
  if (pipeline != nullptr && !pipeline->subgraphs.empty() &&
      pipeline->subgraphs.back().device_peak_bytes > 0) {
    run["device_peak_bytes"] =
        Json(pipeline->subgraphs.back().device_peak_bytes);
  }
  if (info.streamed_peak_weight_bytes.has_value()) {
    run["streamed_peak_weight_bytes"] = Json(*info.streamed_peak_weight_bytes);
  }
  return run;
}

}  // namespace

Json BuildReport(const ReportInfo& info, const CalibrationResults& results,
                 const PipelineResult* pipeline) {
  Json report = Json::object();
  report["format"] = Json("tracecut-calibration-report");
  report["version"] = Json(1);
  report["model"] = Json(info.model);
  report["recipe"] = Json(info.recipe);
  report["recipe_text"] = Json(info.recipe_text);
  report["pipeline"] = Json(info.pipeline);
  report["propagate_error"] = Json(info.propagate_error);
  report["sequential_targets"] = StringArray(info.sequential_targets);
  Json data = Json::object();
  data["source"] = Json(info.data_source);
  data["samples"] = Json(info.samples);
  data["seq_len"] = Json(info.seq_len);
  if (info.min_seq_len != info.seq_len) {
    data["min_seq_len"] = Json(info.min_seq_len);
  }
  data["batches"] = Json(info.batches);
  data["fingerprint"] = Json(absl::StrFormat("%016x", info.data_fingerprint));
  if (!info.data_inputs.empty()) {
    data["inputs"] = StringArray(info.data_inputs);
  }
  report["data"] = std::move(data);
  report["subgraphs"] = StringArray(
      pipeline != nullptr ? pipeline->labels : std::vector<std::string>());

  AddModules(results, report);
  report["warnings"] = StringArray(results.warnings);
  if (info.include_run_section) {
    report["run"] = RunSection(info, results, pipeline);
  }
  return report;
}

}  // namespace tracecut::pipelines
