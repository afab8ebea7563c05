// `tracecut calibrate` and `tracecut demo` through cli::Main: help, usage
// errors, outputs, --json, stop/resume, and one-line errors without output.

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cli/testing/cli_test_util.h"
#include "util/files.h"
#include "util/json.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using ::tracecut::cli::testing::Fixture;
using ::tracecut::cli::testing::Result;
using ::tracecut::cli::testing::RunTracecut;
using ::tracecut::util::testing::IsOkAndHolds;
using ::tracecut::util::testing::ListDir;
using ::tracecut::util::testing::Runfile;
using ::tracecut::util::testing::TempDir;

std::string Llama() { return Fixture("llama"); }
std::string Recipe() {
  return Runfile("pipelines/testdata/gptq_w4g128.textproto");
}

std::string WriteFile(const std::string& path, const std::string& text) {
  EXPECT_OK(util::WriteFileAtomically(path, text));
  return path;
}

std::string LastLine(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

TEST(CalibrateCmdTest, Help) {
  Result r = RunTracecut({"calibrate", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, StartsWith("usage: tracecut calibrate MODEL "));
  for (const char* flag : {"--recipe", "--data", "--synthetic", "--pipeline",
                           "--resume", "--report", "--json", "--input",
                           "--example-inputs", "--config", ".safetensors"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
  r = RunTracecut({"demo", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("tracecut-demo-out"));
  EXPECT_THAT(r.out, HasSubstr("--device=DEV"));
  // The older flow has no --device; an unknown device is a usage error.
  for (const char* device : {"--device=cpu", "--device=npu"}) {
    Result bad =
        RunTracecut({"demo", device,
                     std::string(device) == "--device=cpu" ? "--torchscript"
                                                           : "--samples=1"});
    EXPECT_EQ(bad.code, 2) << device << ": " << bad.err;
  }
  r = RunTracecut({"--help"});
  EXPECT_THAT(r.out, HasSubstr("calibrate"));
  EXPECT_THAT(r.out, HasSubstr("demo"));
}

TEST(CalibrateCmdTest, UsageErrors) {
  const std::string out = TempDir("usage") + "/m.pt";
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"calibrate"},
           {"calibrate", Llama(), "--synthetic=4", "-o", out},
           {"calibrate", Llama(), "--recipe=" + Recipe(), "-o", out},
           {"calibrate", Llama(), "--recipe=" + Recipe(), "--synthetic=4"},
           {"calibrate", Llama(), "--recipe=" + Recipe(), "--synthetic=4",
            "--data=x.jsonl", "-o", out},
           {"calibrate", Llama(), "--recipe=" + Recipe(), "--synthetic=0", "-o",
            out},
           {"calibrate", Llama(), "--recipe=" + Recipe(), "--synthetic=4",
            "--pipeline=fast", "-o", out},
           {"calibrate", Llama(), "--recipe=" + Recipe(), "--synthetic=4",
            "--propagate-error=maybe", "-o", out},
           {"calibrate", Llama(), "--recipe=" + Recipe(), "--scheme=W4A16",
            "-o", out},
           {"calibrate", Llama(), "--scheme=W4A17", "-o", out},
           // Static activation scales are not calibrated yet.
           {"calibrate", Llama(), "--scheme=FP8", "-o", out},
           {"calibrate", Llama(), "--scheme=W4A16", "--device=tpu", "-o", out},
           {"calibrate", Llama(), "--scheme=W4A16", "--device=cuda:x", "-o",
            out},
           {"calibrate", Llama(), "--scheme=W4A16", "--device=cuda",
            "--nproc-per-node=2", "-o", out},
       }) {
    Result r = RunTracecut(args);
    EXPECT_EQ(r.code, 2) << absl::StrJoin(args, " ") << "\n" << r.err;
    EXPECT_THAT(r.err, StartsWith("tracecut calibrate")) << r.err;
  }
}

TEST(CalibrateCmdTest, WritesModelReportAndJson) {
  const std::string dir = TempDir("ok");
  Result r =
      RunTracecut({"calibrate", Llama(), "--recipe=" + Recipe(),
                   "--synthetic=8", "--batch-size=4", "-o", dir + "/m.pt",
                   "--report=" + dir + "/r.json", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ListDir(dir), std::vector<std::string>({"m.pt", "r.json"}));
  absl::StatusOr<util::Json> json = util::ParseJson(r.out);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_THAT(util::ReadFile(dir + "/r.json"),
              IsOkAndHolds(util::DumpJson(*json, 2) + "\n"));
  EXPECT_EQ(json->at("summary").at("weights_quantized").get<int64_t>(), 14);
  EXPECT_THAT(r.err, HasSubstr("subgraph 3/3 model.layers.1"));
  EXPECT_THAT(LastLine(r.err),
              StartsWith("tracecut calibrate: wrote " + dir + "/m.pt"));
}

TEST(CalibrateCmdTest, SchemeIsRoundToNearestOnEveryLinearButLmHead) {
  const std::string dir = TempDir("scheme");
  // No data flag: one synthetic sample measures the errors.
  Result r = RunTracecut({"calibrate", Llama(), "--scheme=FP8_DYNAMIC", "-o",
                          dir + "/m.pt", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<util::Json> json = util::ParseJson(r.out);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->at("summary").at("weights_quantized").get<int64_t>(), 14);
  EXPECT_THAT(r.out, HasSubstr("float8 sym channel"));
  EXPECT_THAT(r.out, Not(HasSubstr("\"lm_head\"")));
}

// FP8 and NVFP4 calibrate their static input activations on the data: the
// per-tensor fp8 scale is absmax / 448 of what each Linear saw, NVFP4's
// input global scale 448 * 6 / absmax (compressed-tensors'
// calculate_qparams and generate_gparam).
TEST(CalibrateCmdTest, StaticInputActivationsAreCalibratedOnTheData) {
  const std::string dir = TempDir("static-input");
  Result r = RunTracecut(
      {"calibrate", Llama(), "--scheme=FP8", "-o", dir + "/none.pt"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("--scheme=FP8 calibrates the scales of static input "
                        "activations (float8 sym tensor): give --data=FILE"));
  for (const std::string preset : {"FP8", "NVFP4"}) {
    SCOPED_TRACE(preset);
    r = RunTracecut({"calibrate", Llama(), "--scheme=" + preset,
                     "--synthetic=4", "-o", dir + "/" + preset + ".pt",
                     "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    absl::StatusOr<util::Json> json = util::ParseJson(r.out);
    ASSERT_TRUE(json.ok()) << json.status();
    int calibrated = 0;
    for (const util::Json& m : json->at("modules")) {
      const util::Json* in = util::FindMember(m, "input");
      if (in == nullptr) continue;
      ++calibrated;
      EXPECT_EQ(in->at("observer").get<std::string>(), "static_minmax");
      EXPECT_EQ(in->at("batches").get<int64_t>(), 4);
      const double absmax =
          std::max(-in->at("min").get<double>(), in->at("max").get<double>());
      ASSERT_GT(absmax, 0);
      if (preset == "FP8") {
        EXPECT_NEAR(in->at("scale").get<double>(), absmax / 448,
                    absmax / 448 * 1e-6);
      } else {
        EXPECT_NEAR(in->at("global_scale").get<double>(), 448 * 6 / absmax,
                    448 * 6 / absmax * 1e-6);
      }
    }
    EXPECT_EQ(calibrated, 14);
  }
}

// The summary line says what its errors are measured on, and compares GPTQ
// with round-to-nearest over the same modules on the same inputs: the
// report's figures, not a mean over a different set.
TEST(CalibrateCmdTest, SummarySaysWhatTheErrorsAreMeasuredOn) {
  const std::string dir = TempDir("summary");
  Result r = RunTracecut({"calibrate", Llama(), "--recipe=" + Recipe(),
                          "--synthetic=8", "--batch-size=4", "-o",
                          dir + "/m.pt", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<util::Json> json = util::ParseJson(r.out);
  ASSERT_TRUE(json.ok()) << json.status();
  const util::Json& summary = *util::FindMember(*json, "summary");
  EXPECT_EQ(summary.at("output_error_measured_on").get<std::string>(),
            "per-module outputs on the calibration inputs");
  EXPECT_EQ(summary.at("measured_modules").get<int64_t>(), 14);
  EXPECT_EQ(summary.at("rtn_compared_modules").get<int64_t>(), 14);
  // Over the same modules, the compared GPTQ mean is the mean.
  EXPECT_DOUBLE_EQ(summary.at("mean_compared_output_error").get<double>(),
                   summary.at("mean_output_error").get<double>());
  // The means are those of the modules' own figures.
  double gptq = 0, rtn = 0;
  int n = 0;
  for (const util::Json& m : json->at("modules")) {
    const util::Json* w = util::FindMember(m, "weight");
    if (w == nullptr || !w->at("rtn_output_error").is_number()) continue;
    gptq += w->at("output_error").get<double>();
    rtn += w->at("rtn_output_error").get<double>();
    ++n;
  }
  ASSERT_EQ(n, 14);
  EXPECT_NEAR(summary.at("mean_output_error").get<double>(), gptq / n, 1e-12);
  EXPECT_NEAR(summary.at("mean_rtn_output_error").get<double>(), rtn / n,
              1e-12);
  EXPECT_THAT(LastLine(r.err),
              HasSubstr("14 weights quantized; per-module output error on the "
                        "calibration inputs, mean over 14 modules: "));
  EXPECT_THAT(LastLine(r.err),
              HasSubstr(", round-to-nearest on the same modules and inputs "));

  // Without a report nobody reads the baseline: it is not measured, the
  // line gives GPTQ's figure alone, and the model is the same bytes.
  Result quiet =
      RunTracecut({"calibrate", Llama(), "--recipe=" + Recipe(),
                   "--synthetic=8", "--batch-size=4", "-o", dir + "/quiet.pt"});
  ASSERT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_THAT(LastLine(quiet.err),
              HasSubstr("per-module output error on the calibration inputs, "
                        "mean over 14 modules: "));
  EXPECT_THAT(LastLine(quiet.err), Not(HasSubstr("round-to-nearest")));
  ASSERT_OK_AND_ASSIGN(const std::string quiet_model,
                       util::ReadFile(dir + "/quiet.pt"));
  ASSERT_OK_AND_ASSIGN(const std::string model, util::ReadFile(dir + "/m.pt"));
  EXPECT_TRUE(quiet_model == model);  // Binary: not printed.
}

// --config=FILE, as for trace: a config.json in place of the embedded one.
TEST(CalibrateCmdTest, ConfigFlag) {
  const std::string dir = TempDir("config_flag");
  // The embedded config with a smaller vocabulary: --synthetic draws from
  // it, and it is what the output embeds.
  const std::string config =
      WriteFile(dir + "/config.json",
                R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 128,
          "intermediate_size": 256, "max_position_embeddings": 64,
          "model_type": "llama", "num_attention_heads": 4,
          "num_hidden_layers": 2, "num_key_value_heads": 4,
          "rms_norm_eps": 1e-06, "vocab_size": 100})");
  // Recorded in the output in place of the embedded one.
  Result r = RunTracecut({"calibrate", Llama(), "--recipe=" + Recipe(),
                          "--synthetic=4", "--config=" + config, "-o",
                          dir + "/m.pt", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  // TorchScript archives store their files uncompressed.
  EXPECT_THAT(util::ReadFile(dir + "/m.pt"),
              IsOkAndHolds(HasSubstr(R"("vocab_size": 100})")));
  // Without vocab_size in it, --synthetic has no vocabulary to draw from.
  WriteFile(dir + "/no_vocab.json", R"({"model_type": "llama"})");
  r = RunTracecut({"calibrate", Llama(), "--recipe=" + Recipe(),
                   "--synthetic=4", "--config=" + dir + "/no_vocab.json", "-o",
                   dir + "/m3.pt"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("vocab_size"));
  // A config that is not JSON is an error naming it.
  WriteFile(dir + "/bad.json", "{");
  r = RunTracecut({"calibrate", Llama(), "--recipe=" + Recipe(),
                   "--synthetic=4", "--config=" + dir + "/bad.json", "-o",
                   dir + "/m2.pt"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(dir + "/bad.json"));
  EXPECT_EQ(access((dir + "/m2.pt").c_str(), F_OK), -1);
}

TEST(CalibrateCmdTest, StopThenResumeMatchesUninterrupted) {
  const std::string full = TempDir("cmd_full");
  const std::string part = TempDir("cmd_part");
  auto args = [&](const std::string& dir) {
    return std::vector<std::string>{"calibrate",
                                    Llama(),
                                    "--recipe=" + Recipe(),
                                    "--synthetic=8",
                                    "--batch-size=2",
                                    "--deterministic-report",
                                    "-o",
                                    dir + "/m.pt",
                                    "--report=" + dir + "/r.json"};
  };
  Result a = RunTracecut(args(full));
  ASSERT_EQ(a.code, 0) << a.err;
  std::vector<std::string> stop = args(part);
  stop.push_back("--stop-after=0");
  Result s = RunTracecut(stop);
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_THAT(LastLine(s.err), HasSubstr("stopped after subgraph 1/3"));
  EXPECT_EQ(ListDir(part), std::vector<std::string>({"m.pt.run"}));
  std::vector<std::string> resume = args(part);
  resume.push_back("--resume");
  Result b = RunTracecut(resume);
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_THAT(b.err, HasSubstr("resuming from"));
  ASSERT_OK_AND_ASSIGN(const std::string full_model,
                       util::ReadFile(full + "/m.pt"));
  ASSERT_OK_AND_ASSIGN(const std::string part_model,
                       util::ReadFile(part + "/m.pt"));
  EXPECT_TRUE(full_model == part_model);  // Binary: not printed.
  ASSERT_OK_AND_ASSIGN(const std::string full_report,
                       util::ReadFile(full + "/r.json"));
  EXPECT_THAT(util::ReadFile(part + "/r.json"), IsOkAndHolds(full_report));
  EXPECT_EQ(ListDir(part), std::vector<std::string>({"m.pt", "r.json"}));
}

// --device=cpu is today's run, byte for byte. --device=cuda computes on a
// GPU where there is one (docs/devices.md); where there is none (CI) it is
// one error line and nothing is written.
TEST(CalibrateCmdTest, DeviceFlag) {
  auto args = [&](const std::string& dir, const std::string& device) {
    std::vector<std::string> a = {"calibrate",
                                  Llama(),
                                  "--recipe=" + Recipe(),
                                  "--synthetic=4",
                                  "--deterministic-report",
                                  "-o",
                                  dir + "/m.pt",
                                  "--report=" + dir + "/r.json"};
    if (!device.empty()) a.push_back("--device=" + device);
    return a;
  };
  const std::string plain = TempDir("device_plain");
  const std::string cpu = TempDir("device_cpu");
  Result a = RunTracecut(args(plain, ""));
  ASSERT_EQ(a.code, 0) << a.err;
  Result b = RunTracecut(args(cpu, "cpu"));
  ASSERT_EQ(b.code, 0) << b.err;
  for (const char* file : {"/m.pt", "/r.json"}) {
    ASSERT_OK_AND_ASSIGN(const std::string want, util::ReadFile(plain + file));
    ASSERT_OK_AND_ASSIGN(const std::string got, util::ReadFile(cpu + file));
    EXPECT_TRUE(want == got) << file;  // Binary: not printed.
  }

  // auto: the GPU where there is one, else the CPU, saying why.
  const std::string automatic = TempDir("device_auto");
  Result d = RunTracecut(args(automatic, "auto"));
  ASSERT_EQ(d.code, 0) << d.err;
  if (!absl::StrContains(d.err, "computed on cuda")) {
    EXPECT_THAT(d.err,
                HasSubstr("--device=auto: computing on the CPU (CUDA: "));
    ASSERT_OK_AND_ASSIGN(const std::string want,
                         util::ReadFile(plain + "/m.pt"));
    ASSERT_OK_AND_ASSIGN(const std::string got,
                         util::ReadFile(automatic + "/m.pt"));
    EXPECT_TRUE(want == got);
  }

  const std::string gpu = TempDir("device_cuda");
  Result c = RunTracecut(args(gpu, "cuda"));
  if (c.code == 0) {  // A GPU machine.
    EXPECT_THAT(c.err, HasSubstr("computed on cuda:0"));
    return;
  }
  EXPECT_EQ(c.code, 1) << c.err;
  EXPECT_THAT(c.err, StartsWith("tracecut calibrate: error: --device=cuda: "
                                "CUDA: "));
  EXPECT_EQ(std::count(c.err.begin(), c.err.end(), '\n'), 1) << c.err;
  EXPECT_TRUE(ListDir(gpu).empty()) << c.err;
}

TEST(CalibrateCmdTest, ErrorsAreOneLineAndLeaveNothing) {
  const std::string dir = TempDir("errors");
  const std::string bad_recipe =
      WriteFile(dir + "/bad.textproto", "modifiers { gptq { scheme { bits: ");
  const std::string no_match = WriteFile(
      dir + "/nomatch.textproto",
      "modifiers { gptq { scheme { bits: 4 } targets: \"Conv2d\" } }");
  const std::string data = WriteFile(dir + "/ids.jsonl", "[1, 2, 999]\n");
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"--recipe=" + bad_recipe, "--synthetic=4"}, "bad.textproto:1:"},
      {{"--recipe=" + no_match, "--synthetic=4"},
       "targets [Conv2d] match no leaf module"},
      {{"--recipe=" + Recipe(), "--data=" + data},
       "token id 999 at sample 0, position 2"},
      {{"--recipe=" + Recipe(), "--synthetic=4", "--targets=GPT2Block"},
       "GPT2Block"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"calibrate", Llama(), "-o",
                                     dir + "/out/m.pt",
                                     "--report=" + dir + "/out/r.json"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    mkdir((dir + "/out").c_str(), 0755);
    Result r = RunTracecut(args);
    EXPECT_EQ(r.code, 1) << absl::StrJoin(args, " ");
    EXPECT_THAT(LastLine(r.err), StartsWith("tracecut calibrate: "));
    EXPECT_THAT(LastLine(r.err), HasSubstr(c.expected)) << r.err;
    EXPECT_TRUE(ListDir(dir + "/out").empty()) << r.err;
  }
}

// The TorchScript flow (the main one needs the tracecut binary's Python
// runfiles: //tests/demo:demo_test).
TEST(CalibrateCmdTest, TorchScriptDemoRunsAndWritesOutputs) {
  const std::string dir = TempDir("demo");
  Result r = RunTracecut(
      {"demo", "--torchscript", "--samples=16", "-o", dir + "/out", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("partition: 3 subgraphs"));
  EXPECT_THAT(r.err, HasSubstr("final-logit relative error"));
  absl::StatusOr<util::Json> json = util::ParseJson(r.out);
  ASSERT_TRUE(json.ok()) << json.status() << r.out;
  const util::Json* results = util::FindMember(*json, "results");
  ASSERT_NE(results, nullptr);
  double gptq =
      results->at("gptq").at("final_logit_relative_error").get<double>();
  double rtn =
      results->at("rtn").at("final_logit_relative_error").get<double>();
  EXPECT_GT(gptq, 0);
  EXPECT_GT(rtn, 0);
  EXPECT_EQ(ListDir(dir + "/out"),
            std::vector<std::string>(
                {"llama-gptq-w4g128.pt", "llama-gptq-w4g128.report.json",
                 "llama-rtn-w4g128.pt", "llama-rtn-w4g128.report.json",
                 "summary.json"}));
}

}  // namespace
}  // namespace tracecut::cli
