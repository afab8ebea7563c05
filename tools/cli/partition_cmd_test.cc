// The `tracecut partition` subcommand through cli::Main: the HF fixtures
// split into head + one subgraph per decoder layer with --check passing,
// --help, and errors for targets matching nothing.

#include <ATen/Parallel.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cli/testing/cli_test_util.h"
#include "tracer/hf/config.h"
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
using ::tracecut::util::testing::ListDir;
using ::tracecut::util::testing::TempDir;

const Json* Member(const Json& object, const std::string& key) {
  return util::FindMember(object, key);
}

int64_t NumHiddenLayers(const std::string& stem) {
  auto loaded = tracer::LoadModel(Fixture(stem));
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok() || !loaded->config.has_value()) return -1;
  for (const char* key : {"num_hidden_layers", "n_layer", "num_layers"}) {
    auto n = loaded->config->FindInt(key);
    if (n.ok() && n->has_value()) return **n;
  }
  return -1;
}

class PartitionFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PartitionFixtureTest, OneSubgraphPerLayerAndCheckPasses) {
  const std::string stem = GetParam();
  const int64_t layers = NumHiddenLayers(stem);
  ASSERT_GT(layers, 0) << stem << ": no num_hidden_layers in its config";

  Result r = RunTracecut({"partition", Fixture(stem), "--check", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("max abs error"));
  auto json = util::ParseJson(r.out, "stdout");
  ASSERT_TRUE(json.ok()) << json.status() << "\n" << r.out;

  const Json* subgraphs = Member(*json, "subgraphs");
  ASSERT_NE(subgraphs, nullptr) << r.out;
  ASSERT_EQ(static_cast<int64_t>(subgraphs->size()), layers + 1) << r.out;

  // Every target instance's module path appears in exactly one subgraph; the
  // head (index 0) has none, each later subgraph exactly one.
  std::map<std::string, int> seen;
  for (size_t i = 0; i < subgraphs->size(); ++i) {
    const Json* paths = Member((*subgraphs)[i], "module_paths");
    ASSERT_NE(paths, nullptr);
    EXPECT_EQ(paths->size(), i == 0 ? 0u : 1u) << stem << " subgraph " << i;
    for (const Json& p : *paths) ++seen[p.get<std::string>()];
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), layers);
  for (const auto& [path, count] : seen) {
    EXPECT_EQ(count, 1) << path;
  }

  const Json* check = Member(*json, "check");
  ASSERT_NE(check, nullptr);
  const Json* passed = Member(*check, "passed");
  ASSERT_NE(passed, nullptr);
  EXPECT_TRUE(passed->get<bool>());
  const Json* error = Member(*check, "max_abs_error");
  ASSERT_NE(error, nullptr);
  EXPECT_LE(error->get<double>(), 1e-5);
  // The tolerances, the relative error, the first subgraph over them.
  for (const char* key :
       {"rtol", "atol", "max_rel_error", "elements", "violations", "worst",
        "subgraph_errors", "subgraph_rel_errors", "first_divergent",
        "first_failing"}) {
    EXPECT_NE(Member(*check, key), nullptr) << key;
  }
  EXPECT_EQ(Member(*check, "rtol")->get<double>(), 1e-4);
  EXPECT_EQ(Member(*check, "atol")->get<double>(), 1e-5);
  EXPECT_EQ(Member(*check, "max_rel_error")->get<double>(), 0.0);
  EXPECT_GT(Member(*check, "elements")->get<int64_t>(), 0);
  EXPECT_EQ(Member(*check, "violations")->get<int64_t>(), 0);
  EXPECT_TRUE(Member(*check, "worst")->is_null());
  EXPECT_EQ(Member(*check, "first_failing")->get<int64_t>(), -1);
  EXPECT_EQ(Member(*check, "subgraph_errors")->size(),
            static_cast<size_t>(layers + 1));
  EXPECT_THAT(r.err, HasSubstr(", max rel error 0 over "));
  EXPECT_THAT(r.err, HasSubstr("(atol 1e-05, rtol 0.0001)"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PartitionFixtureTest,
                         ::testing::Values("llama", "opt", "gpt2", "bert"));

TEST(PartitionCmdTest, UnknownTargetIsOneLineErrorAndNoOutput) {
  const std::string dir = TempDir("no_such_layer");
  const std::string out = dir + "/plan.txt";
  Result r = RunTracecut(
      {"partition", Fixture("llama"), "--targets=NoSuchLayer", "-o", out});
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tracecut partition:"));
  EXPECT_THAT(r.err, HasSubstr("NoSuchLayer"));
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(ListDir(dir).empty());
}

TEST(PartitionCmdTest, TextAndDotFormats) {
  Result text = RunTracecut({"partition", Fixture("llama")});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("LlamaDecoderLayer"));
  Result dot = RunTracecut({"partition", Fixture("llama"), "--format=dot"});
  ASSERT_EQ(dot.code, 0) << dot.err;
  EXPECT_THAT(dot.out, HasSubstr("digraph"));
  Result json = RunTracecut({"partition", Fixture("llama"), "--format=json"});
  ASSERT_EQ(json.code, 0) << json.err;
  Result again = RunTracecut({"partition", Fixture("llama"), "--format=json"});
  EXPECT_EQ(json.out, again.out);
}

TEST(PartitionCmdTest, Help) {
  Result r = RunTracecut({"partition", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--targets"));
  EXPECT_THAT(r.out, HasSubstr("--check"));
  EXPECT_THAT(r.out, HasSubstr("--rtol=X"));
  EXPECT_THAT(r.out, HasSubstr("--atol=X"));
  EXPECT_THAT(r.out, HasSubstr("(default 0.0001)"));
  EXPECT_THAT(r.out, HasSubstr("(default 1e-05)"));
}

TEST(PartitionCmdTest, ToleranceFlags) {
  Result tight = RunTracecut({"partition", Fixture("llama"), "--check",
                              "--rtol=0", "--atol=0", "--json"});
  ASSERT_EQ(tight.code, 0) << tight.err;  // Subgraphs reproduce exactly.
  auto json = util::ParseJson(tight.out, "stdout");
  ASSERT_TRUE(json.ok()) << json.status();
  const Json* check = Member(*json, "check");
  ASSERT_NE(check, nullptr);
  EXPECT_EQ(Member(*check, "rtol")->get<double>(), 0.0);
  EXPECT_EQ(Member(*check, "atol")->get<double>(), 0.0);

  for (const char* flag : {"--rtol=-1", "--atol=abc"}) {
    Result r = RunTracecut({"partition", Fixture("llama"), "--check", flag});
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_EQ(Lines(r.err), 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("wants a finite number >= 0"));
    EXPECT_EQ(r.out, "");
  }
  Result no_check = RunTracecut({"partition", Fixture("llama"), "--atol=1"});
  EXPECT_EQ(no_check.code, 2);
  EXPECT_THAT(no_check.err, HasSubstr("add --check"));
}

// --device says where --check runs (docs/devices.md): cpu is the plain
// check; cuda is the GPU where there is one, else one error line; an
// unknown device or --device without --check is a usage error.
TEST(PartitionCmdTest, DeviceFlag) {
  Result cpu = RunTracecut(
      {"partition", Fixture("llama"), "--check", "--device=cpu", "--json"});
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_THAT(cpu.err, HasSubstr("check passed"));
  Result cuda =
      RunTracecut({"partition", Fixture("llama"), "--check", "--device=cuda"});
  if (cuda.code != 0) {  // No GPU here (CI).
    EXPECT_EQ(cuda.code, 1);
    EXPECT_EQ(Lines(cuda.err), 1) << cuda.err;
    EXPECT_THAT(cuda.err, HasSubstr("error: --device=cuda: CUDA: "));
  } else {
    EXPECT_THAT(cuda.err, HasSubstr("check passed"));
  }
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"partition", Fixture("llama"), "--check", "--device=gpu"},
           {"partition", Fixture("llama"), "--device=cpu"}}) {
    Result r = RunTracecut(args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(Lines(r.err), 1) << r.err;
  }
}

TEST(PartitionCmdTest, BadFormatIsUsageError) {
  Result r = RunTracecut({"partition", Fixture("llama"), "--format=proto"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(Lines(r.err), 1) << r.err;
}

// --threads sizes LibTorch's intra-op pool for the command (every subcommand
// takes it); a value that is not a positive count is a usage error before
// any work.
TEST(PartitionCmdTest, ThreadsFlag) {
  Result r = RunTracecut({"partition", Fixture("llama"), "--threads=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(at::get_num_threads(), 1);
  for (const char* bad : {"--threads=0", "--threads=-2", "--threads=two"}) {
    Result e = RunTracecut({"partition", Fixture("llama"), bad});
    EXPECT_EQ(e.code, 2) << bad;
    EXPECT_THAT(e.err, HasSubstr("--threads: expected a whole number")) << bad;
    EXPECT_EQ(Lines(e.err), 1) << e.err;
  }
}

}  // namespace
}  // namespace tracecut::cli
