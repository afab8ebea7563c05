// The `tracecut transform` and `tracecut debug` subcommands through
// cli::Main: fusing BatchNorm into Conv2d on the CNN fixture with --check,
// an unknown pass, and the debugger flagging an inexact pass on BERT.

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cli/common.h"
#include "tracer/load.h"

namespace tracecut::cli {
namespace {

using ::testing::HasSubstr;

std::string Fixture(const std::string& stem) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "",
                      "/tests/fixtures/", stem, ".pt");
}

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name);
  mkdir(dir.c_str(), 0755);
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result RunTracecut(std::vector<std::string> args) {
  args.insert(args.begin(), "tracecut");
  std::ostringstream out, err;
  Io io{out, err};
  int code = Main(args, io);
  return {code, out.str(), err.str()};
}

TEST(TransformCmdTest, FusesBatchNormInCnnWithCheck) {
  const std::string out = TempDir("fuse") + "/cnn_fused.pt";
  Result r = RunTracecut({"transform", Fixture("cnn"),
                          "--passes=fuse-batchnorm2d-in-conv2d", "--check",
                          "-o", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("check passed, max abs error"));
  EXPECT_THAT(r.err, HasSubstr("fuse-batchnorm2d-in-conv2d: changed"));
  ASSERT_TRUE(Exists(out));
  auto loaded = tracer::LoadModel(out);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

TEST(TransformCmdTest, UnknownPassIsOneLineAndWritesNothing) {
  const std::string out = TempDir("unknown") + "/out.pt";
  Result r = RunTracecut(
      {"transform", Fixture("cnn"), "--passes=no-such-pass", "-o", out});
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
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
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
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
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
  EXPECT_THAT(e, HasSubstr("cannot write to standard output"));
}

// The tanh approximation is ~7.6e-7 relative on BERT's layers: within the
// default 1e-5, so a tighter tolerance makes the first layer exceed.
TEST(TransformCmdTest, DebugFlagsGeluTanhApproxOnBert) {
  Result r = RunTracecut({"debug", Fixture("bert"), "--passes=gelu-tanh-approx",
                          "--targets=BertLayer", "--tolerance=1e-7", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"first_exceeding\""));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\"first_exceeding\": null")));
  EXPECT_THAT(r.err, HasSubstr("first over tolerance"));
  EXPECT_THAT(r.err, HasSubstr("pass gelu-tanh-approx"));
  EXPECT_THAT(r.err, HasSubstr("encoder.layer.0"));
}

}  // namespace
}  // namespace tracecut::cli
