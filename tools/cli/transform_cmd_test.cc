// The `tracecut transform` and `tracecut debug` subcommands through
// cli::Main: fusing BatchNorm into Conv2d on the CNN fixtures with --check
// (relative tolerance on large activations, --rtol/--atol), an unknown
// pass, and the debugger flagging an inexact pass on BERT.

#include <sys/stat.h>

#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cli/common.h"
#include "tools/cli/testing/cli_test_util.h"
#include "tracer/load.h"
#include "util/json.h"
#include "util/testing/temp_dir.h"

namespace tracecut::cli {
namespace {

using ::testing::HasSubstr;
using ::tracecut::cli::testing::Fixture;
using ::tracecut::cli::testing::Lines;
using ::tracecut::cli::testing::Result;
using ::tracecut::cli::testing::RunTracecut;
using ::tracecut::util::Json;
using ::tracecut::util::testing::TempDir;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// `key` of a JSON object; fails the test (and returns a null) when absent.
const Json* Member(const Json& object, const std::string& key) {
  if (const Json* v = util::FindMember(object, key)) return v;
  ADD_FAILURE() << "no \"" << key << "\" in " << util::DumpJson(object);
  static const Json* null = new Json();
  return null;
}

TEST(TransformCmdTest, FusesBatchNormInCnnWithCheck) {
  const std::string out = TempDir("fuse") + "/cnn_fused.pt";
  Result r = RunTracecut({"transform", Fixture("cnn"),
                          "--passes=fuse-batchnorm2d-in-conv2d", "--check",
                          "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("check passed, max abs error"));
  EXPECT_THAT(r.err, HasSubstr(", max rel error "));
  EXPECT_THAT(r.err, HasSubstr("(atol 1e-05, rtol 0.0001)"));
  EXPECT_THAT(r.err, HasSubstr("fuse-batchnorm2d-in-conv2d: changed"));
  ASSERT_TRUE(Exists(out));
  auto loaded = tracer::LoadModel(out);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

// cnn_large's logits reach ~300: the (correct) fusion moves them by a few
// float32 ulps, ~6e-5. The default relative tolerance accepts that; an
// absolute 1e-5 (the old rule) rejects it, naming the worst element.
TEST(TransformCmdTest, LargeActivationsPassRelativeNotAbsoluteTolerance) {
  const std::string dir = TempDir("large");
  Result ok = RunTracecut({"transform", Fixture("cnn_large"),
                           "--passes=fuse-batchnorm2d-in-conv2d", "--check",
                           "--json", "-o", dir + "/ok.pt"});
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.err, HasSubstr("check passed, max abs error "));
  auto json = util::ParseJson(ok.out, "stdout");
  ASSERT_TRUE(json.ok()) << json.status() << "\n" << ok.out;
  EXPECT_TRUE(Member(*json, "passed")->get<bool>());
  EXPECT_EQ(Member(*json, "rtol")->get<double>(), 1e-4);
  EXPECT_EQ(Member(*json, "atol")->get<double>(), 1e-5);
  const double max_abs = Member(*json, "max_abs_error")->get<double>();
  EXPECT_GT(max_abs, 1e-5);  // What the absolute rule rejected.
  EXPECT_LT(Member(*json, "max_rel_error")->get<double>(), 1e-5);
  EXPECT_EQ(Member(*json, "violations")->get<int64_t>(), 0);
  EXPECT_TRUE(Member(*json, "worst")->is_null());
  EXPECT_EQ(Member(*json, "output")->get<std::string>(), dir + "/ok.pt");
  EXPECT_TRUE(Exists(dir + "/ok.pt"));

  const std::string out = dir + "/abs.pt";
  Result abs = RunTracecut({"transform", Fixture("cnn_large"),
                            "--passes=fuse-batchnorm2d-in-conv2d", "--check",
                            "--rtol=0", "--atol=1e-5", "-o", out});
  EXPECT_EQ(abs.code, 1);
  EXPECT_EQ(Lines(abs.err), 1) << abs.err;
  EXPECT_THAT(abs.err,
              HasSubstr("check failed after fuse-batchnorm2d-in-conv2d: "));
  EXPECT_THAT(abs.err, HasSubstr(" of 20 elements exceed atol 1e-05 + rtol "
                                 "0*|ref|; worst at output [0] element "));
  EXPECT_THAT(abs.err, HasSubstr("; max abs error "));
  EXPECT_FALSE(Exists(out));
}

// With --json a failed check still prints the summary: passed false, the
// worst element, no output.
TEST(TransformCmdTest, FailedCheckJson) {
  const std::string out = TempDir("failed_json") + "/out.pt";
  Result r = RunTracecut({"transform", Fixture("cnn_large"),
                          "--passes=fuse-batchnorm2d-in-conv2d", "--check",
                          "--rtol=0", "--atol=0", "--json", "-o", out});
  EXPECT_EQ(r.code, 1);
  auto json = util::ParseJson(r.out, "stdout");
  ASSERT_TRUE(json.ok()) << json.status() << "\n" << r.out;
  EXPECT_FALSE(Member(*json, "passed")->get<bool>());
  EXPECT_EQ(Member(*json, "rtol")->get<double>(), 0.0);
  EXPECT_TRUE(Member(*json, "output")->is_null());
  EXPECT_GT(Member(*json, "violations")->get<int64_t>(), 0);
  const Json* worst = Member(*json, "worst");
  ASSERT_NE(worst, nullptr);
  EXPECT_EQ(Member(*worst, "path")->get<std::string>(), "[0]");
  EXPECT_EQ(Member(*worst, "index")->size(), 2u);
  EXPECT_GT(Member(*worst, "abs_error")->get<double>(), 0.0);
  EXPECT_FALSE(Exists(out));
}

TEST(TransformCmdTest, ToleranceFlags) {
  const std::string out = TempDir("tolerance_flags") + "/out.pt";
  for (const char* flag : {"--rtol=-1", "--atol=abc", "--rtol=nan",
                           "--atol=inf", "--rtol=1e-3x"}) {
    Result r = RunTracecut({"transform", Fixture("cnn"),
                            "--passes=eliminate-dead-code", "--check", flag,
                            "-o", out});
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_EQ(Lines(r.err), 1) << r.err;
    const std::string name(flag, std::string(flag).find('='));
    EXPECT_THAT(r.err, HasSubstr(name + " wants a finite number >= 0"));
  }
  Result no_check =
      RunTracecut({"transform", Fixture("cnn"), "--passes=eliminate-dead-code",
                   "--rtol=1e-3", "-o", out});
  EXPECT_EQ(no_check.code, 2);
  EXPECT_THAT(no_check.err, HasSubstr("add --check"));
  EXPECT_FALSE(Exists(out));
  Result loose =
      RunTracecut({"transform", Fixture("cnn"), "--passes=eliminate-dead-code",
                   "--check", "--rtol=1e-3", "--atol=0", "-o", out});
  ASSERT_EQ(loose.code, 0) << loose.err;
  EXPECT_THAT(loose.err, HasSubstr("(atol 0, rtol 0.001)"));

  Result help = RunTracecut({"transform", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("--rtol=X"));
  EXPECT_THAT(help.out, HasSubstr("(default 0.0001)"));
  EXPECT_THAT(help.out, HasSubstr("(default 1e-05)"));
  Result debug_help = RunTracecut({"debug", "--help"});
  EXPECT_THAT(debug_help.out, HasSubstr("--tolerance=X"));
  EXPECT_THAT(debug_help.out, HasSubstr("alias of --rtol"));
}

TEST(TransformCmdTest, UnknownPassIsOneLineAndWritesNothing) {
  const std::string out = TempDir("unknown") + "/out.pt";
  Result r = RunTracecut(
      {"transform", Fixture("cnn"), "--passes=no-such-pass", "-o", out});
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("unknown pass 'no-such-pass'"));
  EXPECT_THAT(r.err, HasSubstr("fuse-batchnorm2d-in-conv2d"));
  EXPECT_FALSE(Exists(out));
}

TEST(TransformCmdTest, OutputOverAFifoFailsBeforeTracing) {
  const std::string fifo = TempDir("fifo") + "/out.pt";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  Result r = RunTracecut({"transform", Fixture("cnn"),
                          "--passes=eliminate-dead-code", "-o", fifo});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("'" + fifo + "': it exists and is not a"));
  struct stat st;
  ASSERT_EQ(stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));  // Not replaced by a regular file.
}

// debug reports on stdout only: a report that cannot be written fails.
TEST(TransformCmdTest, DebugWithUnwritableStdoutFails) {
  std::ostringstream out, err;
  out.setstate(std::ios::badbit);  // As a full disk or a closed pipe would.
  Io io{out, err};
  int code =
      Main({"tracecut", "debug", Fixture("llama"),
            "--passes=eliminate-dead-code", "--targets=LlamaDecoderLayer"},
           io);
  const std::string e = err.str();
  EXPECT_EQ(code, 1);
  EXPECT_EQ(Lines(e), 1) << e;
  EXPECT_THAT(e, HasSubstr("cannot write to standard output"));
}

// The tanh approximation moves BERT's layer outputs by ~3e-6: within the
// default tolerances, so a tighter rtol (--tolerance, its alias) and no
// atol make the first layer exceed.
TEST(TransformCmdTest, DebugFlagsGeluTanhApproxOnBert) {
  Result within =
      RunTracecut({"debug", Fixture("bert"), "--passes=gelu-tanh-approx",
                   "--targets=BertLayer", "--json"});
  ASSERT_EQ(within.code, 0) << within.err;
  auto within_json = util::ParseJson(within.out, "debug --json");
  ASSERT_TRUE(within_json.ok()) << within_json.status();
  EXPECT_TRUE(Member(*within_json, "first_exceeding")->is_null());
  EXPECT_EQ(*Member(*within_json, "rtol"), 1e-4);
  EXPECT_EQ(*Member(*within_json, "atol"), 1e-5);
  EXPECT_THAT(
      within.err,
      HasSubstr("all within tolerance (atol 1e-05 + rtol 0.0001*|ref|)"));

  for (const char* rtol : {"--tolerance=1e-7", "--rtol=1e-7"}) {
    Result r =
        RunTracecut({"debug", Fixture("bert"), "--passes=gelu-tanh-approx",
                     "--targets=BertLayer", rtol, "--atol=0", "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    auto json = util::ParseJson(r.out, "debug --json");
    ASSERT_TRUE(json.ok()) << json.status();
    ASSERT_TRUE(json->is_object()) << r.out;
    auto it = json->begin();  // rtol and atol come first.
    ASSERT_EQ(it.key(), "rtol");
    EXPECT_EQ(it.value(), 1e-7);
    ASSERT_EQ((++it).key(), "atol");
    EXPECT_EQ(it.value(), 0.0);
    const Json* first = Member(*json, "first_exceeding");
    ASSERT_TRUE(first->is_object()) << *first;
    EXPECT_EQ(*Member(*first, "pass"), "gelu-tanh-approx");
    EXPECT_THAT(r.err, HasSubstr("first over tolerance (atol 0 + rtol "
                                 "1e-07*|ref|)"));
    EXPECT_THAT(r.err, HasSubstr("pass gelu-tanh-approx"));
    EXPECT_THAT(r.err, HasSubstr("encoder.layer.0"));
    EXPECT_THAT(r.err, HasSubstr("worst at output %"));
  }
  Result both =
      RunTracecut({"debug", Fixture("bert"), "--passes=gelu-tanh-approx",
                   "--targets=BertLayer", "--tolerance=1e-7", "--rtol=1e-7"});
  EXPECT_EQ(both.code, 2);
  EXPECT_THAT(both.err, HasSubstr("--tolerance is an alias of --rtol"));
}

// --reproducer-dir is only written to when a pass fails
// (transforms/instrumentation_test.cc covers the failing case).
TEST(TransformCmdTest, ReproducerDirIsUntouchedWhenPassesSucceed) {
  const std::string out = TempDir("reproducer_dir") + "/out.pt";
  const std::string dir = TempDir("reproducer_dir") + "/repro";
  Result r = RunTracecut({"transform", Fixture("cnn"),
                          "--passes=fuse-batchnorm2d-in-conv2d",
                          "--reproducer-dir=" + dir, "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Exists(out));
  EXPECT_FALSE(Exists(dir));
  Result help = RunTracecut({"transform", "--help"});
  EXPECT_THAT(help.out, HasSubstr("--reproducer-dir=DIR"));
}

}  // namespace
}  // namespace tracecut::cli
