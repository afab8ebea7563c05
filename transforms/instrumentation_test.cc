#include "transforms/instrumentation.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/text.h"
#include "transforms/change_truediv_to_mul_by_inverse.h"
#include "transforms/merge_linears.h"
#include "transforms/pass_pipeline.h"
#include "transforms/test_util.h"
#include "util/files.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::transforms {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeGraphModule;
using testing::MakeLinear;
using testing::MakeRoot;
using ::testing::StartsWith;
using util::testing::IsOkAndHolds;
using util::testing::ListDir;
using util::testing::StatusIs;
using util::testing::TempDir;

// q and k on %x (merge-linears fires), then x / 4 (truediv fires) and a
// division by zero that FailsOnDivByZero rejects.
torch::jit::Module Root() {
  torch::jit::Module root = MakeRoot();
  root.register_module("q", MakeLinear(root, 4, 4, true, 1));
  root.register_module("k", MakeLinear(root, 4, 2, false, 2));
  return root;
}

constexpr char kGraph[] = R"(graph {
  %x = placeholder[x]()
  %q = call_module[q](%x) scope[:"Root", q:"torch.nn.modules.linear.Linear"]
  %k = call_module[k](%x) scope[:"Root", k:"torch.nn.modules.linear.Linear"]
  %div = call_function[aten::div.Scalar](%q, 4.0)
  %div_1 = call_function[aten::div.Scalar](%k, 0.0)
  %output = output[output]((%div, %div_1))
})";

// Fails, naming the node, on a division by the constant zero.
class FailsOnDivByZero : public Transformation {
 public:
  absl::string_view name() const override { return "fails-on-div-by-zero"; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override {
    for (const ir::Node* n : gm.graph().nodes()) {
      if (n->target() == "aten::div.Scalar" && n->args().size() == 2 &&
          n->args()[1] == ir::Argument::Double(0.0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("division by zero at %", n->name()));
      }
    }
    return false;
  }
};

// Points %div at an operator name no verifier accepts, claiming a change.
class BreaksDiv : public Transformation {
 public:
  absl::string_view name() const override { return "breaks-div"; }
  absl::StatusOr<bool> Run(runtime::GraphModule& gm) override {
    ir::Node* div = gm.graph().FindNode("div");
    if (div == nullptr) return false;
    div->set_target("not an operator!");
    return true;
  }
};

// Logs every hook as "<tag> <hook> <pass>".
class Log : public Instrumentation {
 public:
  Log(std::string tag, std::vector<std::string>& log, bool fail_after = false)
      : tag_(std::move(tag)), log_(log), fail_after_(fail_after) {}

  absl::Status RunBeforePipeline(const runtime::GraphModule&) override {
    log_.push_back(absl::StrCat(tag_, " start"));
    return absl::OkStatus();
  }
  absl::Status RunBeforePass(const PassRun& pass,
                             const runtime::GraphModule&) override {
    log_.push_back(absl::StrCat(tag_, " before ", pass.name));
    return absl::OkStatus();
  }
  absl::Status RunAfterPass(const PassRun& pass, const runtime::GraphModule&,
                            bool changed) override {
    log_.push_back(absl::StrCat(tag_, " after ", pass.name,
                                changed ? " changed" : " unchanged"));
    if (fail_after_) return absl::InternalError(absl::StrCat(tag_, " says no"));
    return absl::OkStatus();
  }
  absl::Status RunAfterPassFailed(const PassRun& pass,
                                  const runtime::GraphModule&,
                                  absl::Status error) override {
    log_.push_back(absl::StrCat(tag_, " failed ", pass.name));
    return absl::Status(error.code(),
                        absl::StrCat(error.message(), " (seen by ", tag_, ")"));
  }

 private:
  std::string tag_;
  std::vector<std::string>& log_;
  bool fail_after_;
};

TEST(InstrumentationTest, HooksRunInOrderAroundEveryPass) {
  std::vector<std::string> log;
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  pipeline.AddInstrumentation<Log>("a", log);
  pipeline.AddInstrumentation<Log>("b", log);
  runtime::GraphModule gm = MakeGraphModule(Root(), R"(graph {
  %x = placeholder[x]()
  %q = call_module[q](%x)
  %output = output[output](%q)
})");
  EXPECT_THAT(pipeline.Run(gm), IsOkAndHolds(false));
  EXPECT_THAT(log, ElementsAre("a start", "b start",               //
                               "a before merge-linears",           //
                               "b before merge-linears",           //
                               "a after merge-linears unchanged",  //
                               "b after merge-linears unchanged",  //
                               "a before change-truediv-to-mul-by-inverse",
                               "b before change-truediv-to-mul-by-inverse",
                               "a after change-truediv-to-mul-by-inverse "
                               "unchanged",
                               "b after change-truediv-to-mul-by-inverse "
                               "unchanged"));
}

TEST(InstrumentationTest, FailuresGoThroughEveryInstrumentation) {
  std::vector<std::string> log;
  PassPipeline pipeline;
  pipeline.AddPass<FailsOnDivByZero>();
  pipeline.AddInstrumentation<Log>("a", log);
  pipeline.AddInstrumentation<Log>("b", log);
  EXPECT_THAT(pipeline.Apply(MakeGraphModule(Root(), kGraph)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "fails-on-div-by-zero failed: division by zero at "
                       "%div_1 (seen by a) (seen by b)"));
  EXPECT_THAT(log,
              ElementsAre("a start", "b start", "a before fails-on-div-by-zero",
                          "b before fails-on-div-by-zero",
                          "a failed fails-on-div-by-zero",
                          "b failed fails-on-div-by-zero"));
}

TEST(InstrumentationTest, AnAfterPassErrorStopsTheRestAndFailsThePass) {
  std::vector<std::string> log;
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  pipeline.AddInstrumentation<Log>("a", log, /*fail_after=*/true);
  pipeline.AddInstrumentation<Log>("b", log);
  EXPECT_THAT(pipeline.Apply(MakeGraphModule(Root(), kGraph)),
              StatusIs(absl::StatusCode::kInternal,
                       "a says no (seen by a) (seen by b)"));
  EXPECT_THAT(
      log,
      ElementsAre("a start", "b start", "a before merge-linears",
                  "b before merge-linears", "a after merge-linears changed",
                  "a failed merge-linears", "b failed merge-linears"));
  // The pass itself succeeded: it has its record.
  ASSERT_EQ(pipeline.records().size(), 1u);
  EXPECT_TRUE(pipeline.records()[0].changed);
}

TEST(InstrumentationTest, ReverseIsInstrumentedToo) {
  std::vector<std::string> log;
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  ASSERT_OK_AND_ASSIGN(runtime::GraphModule out,
                       pipeline.Apply(MakeGraphModule(Root(), kGraph)));
  pipeline.AddInstrumentation<Log>("a", log);
  EXPECT_THAT(pipeline.Reverse(out), IsOkAndHolds(true));
  EXPECT_THAT(log, ElementsAre("a start", "a before merge-linears (reverse)",
                               "a after merge-linears (reverse) changed"));
}

TEST(InstrumentationTest, ScopedInstrumentationIsRemovedAtScopeEnd) {
  PassPipeline pipeline;
  pipeline.AddPass<MergeLinears>();
  PassChangeRecorder recorder;
  {
    ScopedInstrumentation scope(pipeline, recorder);
    EXPECT_EQ(pipeline.instrumentations().size(), 1u);
    EXPECT_OK(pipeline.Apply(MakeGraphModule(Root(), kGraph)).status());
  }
  EXPECT_TRUE(pipeline.instrumentations().empty());
  ASSERT_EQ(recorder.entries().size(), 1u);
  EXPECT_EQ(recorder.entries()[0].pass, "merge-linears");
  EXPECT_TRUE(recorder.entries()[0].changed);
  EXPECT_THAT(recorder.entries()[0].touched_nodes,
              ElementsAre("q_k_merged", "split_with_sizes", "q", "k"));
}

TEST(InstrumentationTest, VerifierChecksOnlyChangedPasses) {
  VerifierInstrumentation verifier;
  runtime::GraphModule gm = MakeGraphModule(Root(), kGraph);
  gm.graph().FindNode("k")->set_target("no.such.module");
  BreaksDiv pass;
  const PassRun run{&pass, "breaks-div", 1, false};
  EXPECT_OK(verifier.RunAfterPass(run, gm, /*changed=*/false));
  EXPECT_THAT(verifier.RunAfterPass(run, gm, /*changed=*/true),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       StartsWith("failed after breaks-div: %k")));
  EXPECT_THAT(verifier.RunBeforePipeline(gm),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       StartsWith("invalid input: %k")));
}

TEST(InstrumentationTest, IrDumpFollowsThePattern) {
  std::vector<std::string> dumped;
  IrDumpInstrumentation dump("re:merge-.*", /*only_if_changed=*/false,
                             [&](absl::string_view pass, absl::string_view) {
                               dumped.push_back(std::string(pass));
                             });
  runtime::GraphModule gm = MakeGraphModule(Root(), kGraph);
  MergeLinears merge;
  BreaksDiv other;
  EXPECT_OK(dump.RunAfterPass({&merge, "merge-linears", 1, false}, gm, false));
  EXPECT_OK(dump.RunAfterPass({&other, "breaks-div", 2, false}, gm, true));
  EXPECT_THAT(dumped, ElementsAre("merge-linears"));
}

// Note [Reproducers]: the file names the pass and holds its input (here the
// output of the passes before it), parses as IR, and rerunning the pass on
// it fails the same way.
TEST(ReproducerTest, FailingPassLeavesAReproducerThatFailsAgain) {
  const std::string dir = TempDir("repro");
  PassPipelineOptions options;
  options.reproducer_dir = dir;
  PassPipeline pipeline("optimize", options);
  pipeline.AddPass<MergeLinears>();
  pipeline.AddPass<ChangeTrueDivToMulByInverse>();
  pipeline.AddPass<FailsOnDivByZero>();
  const std::string path = dir + "/fails-on-div-by-zero.ir";
  const std::string error =
      "fails-on-div-by-zero failed: division by zero at %div_1";
  EXPECT_THAT(pipeline.Apply(MakeGraphModule(Root(), kGraph)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat(error, " [reproducer: ", path, "]")));

  ASSERT_OK_AND_ASSIGN(std::string text, util::ReadFile(path));
  EXPECT_THAT(text, StartsWith("# tracecut reproducer"));
  EXPECT_THAT(text, HasSubstr("# pass: fails-on-div-by-zero\n"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("#   INVALID_ARGUMENT: ", error)));
  // The plain IR parser reads it (comments are '#').
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ir::Graph> parsed, ir::ParseGraph(text));
  // The input of the failing pass: the earlier passes' rewrites are in it.
  EXPECT_NE(parsed->FindNode("q_k_merged"), nullptr);
  EXPECT_EQ(parsed->FindNode("div")->target(), "aten::mul.Scalar");

  ASSERT_OK_AND_ASSIGN(Reproducer repro, ReadReproducer(path));
  EXPECT_EQ(repro.pass, "fails-on-div-by-zero");
  EXPECT_FALSE(repro.reverse);
  EXPECT_TRUE(ir::StructurallyEqual(*repro.graph, *parsed));
  // Rerunning the pass on it, with the module the passes before it left
  // (merge-linears added q_k_merged), fails again.
  ASSERT_OK_AND_ASSIGN(runtime::GraphModule model,
                       MakeGraphModule(Root(), kGraph).Clone());
  PassPipeline before("before");
  before.AddPass<MergeLinears>();
  before.AddPass<ChangeTrueDivToMulByInverse>();
  ASSERT_THAT(before.Run(model), IsOkAndHolds(true));
  runtime::GraphModule rerun(model.module(), std::move(repro.graph));
  EXPECT_OK(CheckModuleReferences(rerun));
  EXPECT_THAT(FailsOnDivByZero().Run(rerun),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "division by zero at %div_1"));

  // A second failure does not overwrite the first.
  EXPECT_THAT(ListDir(dir), ElementsAre("fails-on-div-by-zero.ir"));
  EXPECT_THAT(pipeline.Apply(MakeGraphModule(Root(), kGraph)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("[reproducer: ", dir,
                                              "/fails-on-div-by-zero.2.ir]"))));
}

TEST(ReproducerTest, ChecksAfterAPassGetAReproducerToo) {
  const std::string dir = TempDir("repro_verify");
  ReproducerInstrumentation* repro = nullptr;
  PassPipeline pipeline;
  pipeline.AddPass<BreaksDiv>();
  repro = &pipeline.AddInstrumentation<ReproducerInstrumentation>(dir);
  runtime::GraphModule gm = MakeGraphModule(Root(), kGraph);
  EXPECT_THAT(pipeline.Apply(gm),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(StartsWith("failed after breaks-div: %div"),
                             HasSubstr("[reproducer: "))));
  ASSERT_EQ(repro->written().size(), 1u);
  ASSERT_OK_AND_ASSIGN(Reproducer r, ReadReproducer(repro->written()[0]));
  EXPECT_EQ(r.pass, "breaks-div");
  // The pass's input is the pipeline's (verified) input.
  runtime::GraphModule again(gm.module(), std::move(r.graph));
  EXPECT_OK(VerifyGraph(again));
  ASSERT_THAT(BreaksDiv().Run(again), IsOkAndHolds(true));
  EXPECT_THAT(
      VerifyGraph(again),
      StatusIs(absl::StatusCode::kFailedPrecondition, StartsWith("%div")));
}

TEST(ReproducerTest, UnwritableDirectoryIsReportedNotFatal) {
  const std::string file = TempDir("repro_file") + "/not_a_dir";
  ASSERT_OK(util::WriteFileAtomically(file, "not a directory"));
  PassPipelineOptions options;
  options.reproducer_dir = file;
  PassPipeline pipeline("p", options);
  pipeline.AddPass<FailsOnDivByZero>();
  EXPECT_THAT(
      pipeline.Apply(MakeGraphModule(Root(), kGraph)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("division by zero at %div_1 [no reproducer: "),
                     HasSubstr(file))));
}

TEST(ReproducerTest, NotAReproducer) {
  EXPECT_THAT(ParseReproducer("graph {\n  %output = output[output](1)\n}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a tracecut reproducer")));
}

}  // namespace
}  // namespace tracecut::transforms
