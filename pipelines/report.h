#ifndef TRACECUT_PIPELINES_REPORT_H_
#define TRACECUT_PIPELINES_REPORT_H_

// The calibration report: what a run computed, as deterministic JSON.
//
//   ReportInfo info;
//   info.model = "llama.pt";
//   ...
//   util::Json report = BuildReport(info, results, &pipeline_result);
//   std::string text = util::DumpJson(report, 2) + "\n";
//
//   {"format": "tracecut-calibration-report", "version": 1,
//    "model": "llama.pt", "recipe": "w4.textproto", "pipeline": "sequential",
//    "propagate_error": true, "sequential_targets": ["LlamaDecoderLayer"],
//    "data": {"source": ..., "samples": 64, "seq_len": 16, "batches": 8,
//             "fingerprint": "8c1f..."},
//    (data read from tensors adds "inputs": ["pixel_values: float32[8, 3,
//    32, 32]", ...]; seq_len is 0 without token ids; samples of different
//    lengths add "min_seq_len", seq_len being the longest),
//    "subgraphs": ["(head)", "model.layers.0", "model.layers.1"],
//    "modules": [{"path": "model.layers.0.mlp.down_proj", "type": "Linear",
//                 "subgraph": 1,
//                 "weight": {"method": "gptq", "scheme": "int4 sym g128",
//                            "scale": {"shape": [128, 2], "min": ..,
//                                      "max": .., "mean": ..},
//                            "zero_point": {"min": 0, "max": 0},
//                            "output_error": 0.061, "rtn_output_error": 0.083,
//                            "gptq_loss": .., "calibration_tokens": 1024},
//                 "input": {"observer": "minmax", "scheme": ..., "min": ..,
//                           "max": .., "batches": 8, "scale": ..,
//                           "zero_point": 0},
//                 "notes": []}, ...],
//    "summary": {"weights_quantized": 14,
//                "output_error_measured_on": "per-module outputs on the "
//                                            "calibration inputs",
//                "measured_modules": 14, "mean_output_error": ..,
//                "max_output_error": .., "rtn_compared_modules": 14,
//                "mean_compared_output_error": ..,
//                "mean_rtn_output_error": ..,
//                "uncalibrated_modules": [{"path": "...experts.3.w1",
//                    "calibration_tokens": 0, "method": "rtn"}]},
//    "warnings": [...],
//    "run": {"resumed_from_subgraph": 0, "timings": [...], "cache": {...},
//            "compress_seconds": {...},
//            "subgraphs": [{"subgraph": 1, "label": "model.layers.0",
//                           "nodes": 31, "param_bytes": 786432,
//                           "load_seconds": .., "write_seconds": ..,
//                           "cache_values": .., "cache_bytes_held": ..,
//                           "cache_bytes_on_disk": .., "rss_bytes": ..}],
//            "peak_rss_bytes": .., "streamed_peak_weight_bytes": ..}}
//
// "recipe_text" (after "recipe") is the recipe in one line of text format.
// run.subgraphs covers the subgraphs this process ran (a resumed run's
// later ones); load/write_seconds are the streamed weights' I/O (0 when not
// streaming); peak_rss_bytes is the process's peak resident memory.
//
// Modules are sorted by path. Errors are relative output errors on the
// calibration inputs (modifier.h, ModuleRecord), not errors of the model's
// final outputs; the means cover modules that saw calibration tokens, the
// others are listed as uncalibrated. mean_compared_output_error and
// mean_rtn_output_error are over the same rtn_compared_modules (those with
// a round-to-nearest baseline measured on the same inputs).
// Everything but "run" (timings, cache statistics: they depend on the machine
// and on whether the run was resumed) is the same, byte for byte, for the same
// model, recipe, data and options; ReportInfo::include_run_section drops "run".

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "modifiers/modifier.h"
#include "pipelines/pipeline.h"
#include "util/json.h"

namespace tracecut::pipelines {

struct ReportInfo {
  std::string model;
  std::string recipe;
  std::string pipeline;
  bool propagate_error = true;
  std::vector<std::string> sequential_targets;
  std::string data_source;
  int64_t samples = 0;
  int64_t seq_len = 0;
  int64_t min_seq_len = 0;  // The shortest sample; == seq_len when uniform.
  int64_t batches = 0;
  uint64_t data_fingerprint = 0;
  std::vector<std::string> data_inputs;  // Empty for token ids.
  // The recipe as text (one line of text format), for the HTML page.
  std::string recipe_text;
  // Streamed runs: the most checkpoint weight bytes held at once.
  std::optional<int64_t> streamed_peak_weight_bytes;
  // Where subgraphs computed ("cpu", "cuda:0"); the run section states it.
  std::string device = "cpu";
  bool include_run_section = true;
};

util::Json BuildReport(const ReportInfo& info,
                       const modifiers::CalibrationResults& results,
                       const PipelineResult* pipeline);

// Summary statistics of a tensor for the report: {"shape", "min", "max",
// "mean"} (floating) or {"shape", "min", "max"} (integer); null when
// undefined.
util::Json TensorSummary(const at::Tensor& t);

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_REPORT_H_
