// The `tracecut trace` subcommand through cli::Main: help, usage errors,
// every output format, --json, and atomic output.

#include <sys/stat.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/proto.h"
#include "ir/text.h"
#include "tools/cli/common.h"
#include "tools/cli/testing/cli_test_util.h"
#include "util/files.h"
#include "util/json.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;
using ::tracecut::cli::testing::Fixture;
using ::tracecut::cli::testing::Lines;
using ::tracecut::cli::testing::Result;
using ::tracecut::cli::testing::RunTracecut;
using ::tracecut::util::testing::IsOkAndHolds;
using ::tracecut::util::testing::ListDir;
using ::tracecut::util::testing::TempDir;

TEST(TracecutTest, HelpForToolAndSubcommand) {
  Result r = RunTracecut({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("trace"));
  r = RunTracecut({"trace", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, StartsWith("usage: tracecut trace MODEL.pt"));
  EXPECT_THAT(r.out, HasSubstr("--leaf=TYPE_OR_PATH"));
  EXPECT_THAT(r.out, HasSubstr("--json"));
}

TEST(TracecutTest, UsageErrorsAreOneLineAndExitTwo) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {},
           {"nope"},
           {"trace"},
           {"trace", "a.pt", "b.pt"},
           {"trace", "a.pt", "--format=svg"},
           {"trace", "a.pt", "--bogus"},
           {"trace", "a.pt", "--json=yes"},
           {"trace", "a.pt", "-o"},
           {"trace", "a.pt", "--config=a", "--config=b"},
       }) {
    Result r = RunTracecut(args);
    EXPECT_EQ(r.code, 2) << absl::StrJoin(args, " ");
    EXPECT_EQ(Lines(r.err), 1) << r.err;
    EXPECT_THAT(r.err, StartsWith("tracecut")) << r.err;
  }
}

TEST(TracecutTest, TraceErrorsAreOneLineAndExitOne) {
  const std::string dir = TempDir("errors");
  Result r =
      RunTracecut({"trace", Fixture("dynamic_branch"), "-o", dir + "/g.txt"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(Lines(r.err), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--leaf=encoder.block.gate"));
  EXPECT_TRUE(ListDir(dir).empty());  // No output, no temp file.

  r = RunTracecut({"trace", dir + "/missing.pt"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing.pt"));
}

TEST(TracecutTest, TextToStdoutParsesBack) {
  Result r = RunTracecut({"trace", Fixture("llama")});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<std::unique_ptr<ir::Graph>> g = ir::ParseGraph(r.out);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_GT((*g)->size(), 100u);
  EXPECT_EQ(ir::PrintGraph(**g), r.out);
}

TEST(TracecutTest, EveryFormatToAFile) {
  const std::string dir = TempDir("formats");
  for (const char* format : {"text", "proto", "dot", "json"}) {
    const std::string path = absl::StrCat(dir, "/llama.", format);
    Result r = RunTracecut({"trace", Fixture("llama"),
                            absl::StrCat("--format=", format), "-o", path,
                            "--leaf=LlamaMLP"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(r.out.empty());
    EXPECT_THAT(r.err, HasSubstr("wrote"));
    ASSERT_OK_AND_ASSIGN(const std::string bytes, util::ReadFile(path));
    ASSERT_FALSE(bytes.empty()) << format;
    if (std::string(format) == "proto") {
      absl::StatusOr<std::unique_ptr<ir::Graph>> g =
          ir::DeserializeGraph(bytes);
      ASSERT_TRUE(g.ok()) << g.status();
    } else if (std::string(format) == "json") {
      absl::StatusOr<util::Json> j = util::ParseJson(bytes);
      ASSERT_TRUE(j.ok()) << j.status();
      EXPECT_GT(j->at("nodes").size(), 100u);
    } else if (std::string(format) == "dot") {
      EXPECT_THAT(bytes, StartsWith("digraph"));
    } else {
      EXPECT_THAT(bytes, HasSubstr("call_module[model.layers.0.mlp]"));
    }
  }
  // Only the outputs: no temporaries left behind.
  EXPECT_EQ(ListDir(dir).size(), 4u);
}

TEST(TracecutTest, JsonSummary) {
  const std::string dir = TempDir("summary");
  Result r = RunTracecut(
      {"trace", Fixture("shape_branch"), "--json", "-o", dir + "/g.txt"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<util::Json> j = util::ParseJson(r.out);
  ASSERT_TRUE(j.ok()) << j.status() << r.out;
  const util::Json* counts = util::FindMember(*j, "op_counts");
  ASSERT_NE(counts, nullptr);
  EXPECT_EQ(counts->at("placeholder").get<int64_t>(), 1);
  EXPECT_EQ(counts->at("output").get<int64_t>(), 1);
  EXPECT_EQ(counts->at("call_module").get<int64_t>(), 1);
  ASSERT_EQ(j->at("call_module_targets").size(), 1u);
  EXPECT_EQ(j->at("assumptions").size(), 2u);
  EXPECT_EQ(j->at("output").get<std::string>(), dir + "/g.txt");
  EXPECT_THAT(util::ReadFile(dir + "/g.txt"), IsOkAndHolds(Not(IsEmpty())));

  // --json alone: the summary only.
  r = RunTracecut({"trace", Fixture("shape_branch"), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(util::ParseJson(r.out).ok());
}

TEST(WriteOutputTest, AtomicReplaceAndErrors) {
  const std::string dir = TempDir("atomic");
  std::ostringstream out, err;
  Io io{out, err};
  const std::string path = dir + "/f.txt";
  ASSERT_TRUE(WriteOutput(path, "one", io).ok());
  ASSERT_TRUE(WriteOutput(path, "two", io).ok());
  EXPECT_THAT(util::ReadFile(path), IsOkAndHolds("two"));
  EXPECT_EQ(ListDir(dir).size(), 1u);
  absl::Status s = WriteOutput(dir + "/no/such/dir/f.txt", "x", io);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no/such/dir/f.txt"));
  ASSERT_TRUE(WriteOutput("-", "stdout", io).ok());
  EXPECT_EQ(out.str(), "stdout");
}

TEST(WriteOutputTest, SpecialFilesAreNotReplaced) {
  // A rename over a FIFO (or a device such as /dev/null, as root) would
  // replace the node with a regular file.
  const std::string dir = TempDir("special");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  std::ostringstream out, err;
  Io io{out, err};
  absl::Status s = WriteOutput(fifo, "x", io);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr(fifo));
  s = CheckOutputPath(fifo);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  struct stat st;
  ASSERT_EQ(stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"fifo"});
}

}  // namespace
}  // namespace tracecut::cli
