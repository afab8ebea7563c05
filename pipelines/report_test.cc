#include "pipelines/report.h"

#include <gtest/gtest.h>

#include <string>

#include "util/json.h"

namespace tracecut::pipelines {
namespace {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::ModuleRecord;
using ::tracecut::modifiers::SubgraphTiming;
using ::tracecut::util::Json;

CalibrationResults TwoModules() {
  CalibrationResults results;
  ModuleRecord& a = results.Module("model.layers.0.mlp.down_proj");
  a.type = "torch.nn.modules.linear.Linear";
  a.weight_method = "gptq";
  a.weight_error = 0.1;
  a.rtn_error = 0.3;
  a.calibration_tokens = 64;
  ModuleRecord& b = results.Module("model.layers.0.mlp.experts.3.w1");
  b.type = "torch.nn.modules.linear.Linear";
  b.weight_method = "rtn";
  b.weight_error = 0.5;
  b.calibration_tokens = 0;
  results.warnings.push_back("w");
  SubgraphTiming t;
  t.label = "model.layers.0";
  t.calibrate_seconds = 1;
  t.compress_seconds = 2;
  t.propagate_seconds = 3;
  results.subgraphs.push_back(t);
  return results;
}

TEST(ReportTest, SummaryMeansCoverMeasuredModulesAndListUncalibrated) {
  ReportInfo info;
  info.model = "m.pt";
  info.include_run_section = false;  // --deterministic-report.
  Json report = BuildReport(info, TwoModules(), nullptr);
  EXPECT_EQ(report["format"], "tracecut-calibration-report");
  const Json& s = report["summary"];
  EXPECT_EQ(s["weights_quantized"], 2);
  EXPECT_EQ(s["measured_modules"], 2);
  EXPECT_DOUBLE_EQ(s["mean_output_error"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(s["max_output_error"].get<double>(), 0.5);
  // Against RTN: only the module with both errors.
  EXPECT_EQ(s["rtn_compared_modules"], 1);
  EXPECT_DOUBLE_EQ(s["mean_compared_output_error"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(s["mean_rtn_output_error"].get<double>(), 0.3);
  ASSERT_EQ(s["uncalibrated_modules"].size(), 1u);
  EXPECT_EQ(s["uncalibrated_modules"][0]["path"],
            "model.layers.0.mlp.experts.3.w1");
  // Sorted by path, with the short type.
  ASSERT_EQ(report["modules"].size(), 2u);
  EXPECT_EQ(report["modules"][0]["path"], "model.layers.0.mlp.down_proj");
  EXPECT_EQ(report["modules"][0]["type"], "Linear");
  EXPECT_EQ(report["warnings"][0], "w");
  // Deterministic: no timings.
  EXPECT_FALSE(report.contains("run"));
}

TEST(ReportTest, RunSectionHasTimingsAndTheDevice) {
  ReportInfo info;
  info.include_run_section = true;
  info.device = "cpu";
  Json report = BuildReport(info, TwoModules(), nullptr);
  ASSERT_TRUE(report.contains("run"));
  const Json& run = report["run"];
  EXPECT_DOUBLE_EQ(run["total_seconds"].get<double>(), 6);
  EXPECT_EQ(run["device"], "cpu");
  EXPECT_TRUE(
      run["module_compress_seconds"].contains("model.layers.0.mlp.down_proj"));
}

}  // namespace
}  // namespace tracecut::pipelines
