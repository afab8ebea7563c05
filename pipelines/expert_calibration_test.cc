// Expert regions of the traced MoE fixture (tests/fixtures/moe_starved.pt:
// Mixtral-style blocks, 4 experts, top-2 routing, expert 3 never picked)
// and every expert run on all of its block's tokens. Calibrations that use
// them are pipelines/calibrate_guards_test.cc.

#include "pipelines/expert_calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/interpreter.h"
#include "tracer/testing/traced_fixture.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {
namespace {

using ::testing::HasSubstr;
using ::tracecut::tracer::testing::TracedFixture;
using ::tracecut::tracer::testing::TraceFixture;

std::string Expert(int layer, int e) {
  return absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.", e);
}

TEST(ExpertCalibrationTest, FindsEveryExpertInGraphOrder) {
  TracedFixture t = TraceFixture("tests/fixtures/moe_starved.pt");
  ASSERT_OK_AND_ASSIGN(std::vector<ExpertRegion> regions,
                       FindExpertRegions(t.gm.graph()));
  ASSERT_EQ(regions.size(), 8u);  // 2 layers x 4 experts.
  for (int layer = 0; layer < 2; ++layer) {
    for (int e = 0; e < 4; ++e) {
      const ExpertRegion& r = regions[layer * 4 + e];
      EXPECT_EQ(r.path, Expert(layer, e));
      EXPECT_FALSE(r.gather.empty()) << r.path;
      ASSERT_NE(r.graph, nullptr);
      ASSERT_EQ(r.graph->placeholders().size(), 1u) << r.path;
      EXPECT_EQ(r.graph->placeholders()[0]->target(), "tokens") << r.path;
    }
  }
}

TEST(ExpertCalibrationTest, AModuleThatIsNoTokenWiseExpertIsRefusedByName) {
  TracedFixture t = TraceFixture("tests/fixtures/moe_starved.pt");
  // The whole MoE block reads the hidden states without a row gather.
  absl::StatusOr<std::vector<ExpertRegion>> regions = FindExpertRegions(
      t.gm.graph(), "re:model\\.layers\\.0\\.block_sparse_moe");
  ASSERT_FALSE(regions.ok());
  EXPECT_THAT(regions.status().message(),
              HasSubstr("model.layers.0.block_sparse_moe"));
}

// The main run routes each token to two experts and none to expert 3;
// RunOnAllTokens then runs every expert, expert 3 included, on all the
// block's tokens, which the expert interpreters' hooks see.
TEST(ExpertCalibrationTest, RunsEveryExpertOnAllTokens) {
  TracedFixture t = TraceFixture("tests/fixtures/moe_starved.pt");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<AllExpertsRunner> runner,
                       AllExpertsRunner::Create(t.gm.graph(), t.gm.module()));
  ASSERT_FALSE(runner->empty());
  EXPECT_TRUE(runner->InExpert(Expert(0, 3) + ".w1"));
  EXPECT_FALSE(runner->InExpert("model.layers.0.block_sparse_moe.gate"));

  ASSERT_OK_AND_ASSIGN(runtime::Interpreter main,
                       runtime::Interpreter::Create(t.gm));
  std::map<std::string, int64_t> routed_rows, all_rows;
  main.AddModuleHook([&](const ir::Node& node, const torch::jit::Module&,
                         absl::Span<const c10::IValue> in,
                         const c10::IValue* out) {
    if (out == nullptr && absl::EndsWith(node.target(), ".w1")) {
      routed_rows[node.target()] += in[0].toTensor().size(0);
    }
  });
  for (runtime::Interpreter* e : runner->expert_interpreters()) {
    e->AddModuleHook([&](const ir::Node& node, const torch::jit::Module&,
                         absl::Span<const c10::IValue> in,
                         const c10::IValue* out) {
      if (out == nullptr && absl::EndsWith(node.target(), ".w1")) {
        all_rows[node.target()] += in[0].toTensor().size(0);
      }
    });
  }
  runner->AttachCapture(main);
  ASSERT_OK_AND_ASSIGN(c10::IValue logits, main.Run(t.inputs));
  ASSERT_OK(runner->RunOnAllTokens());

  const at::Tensor ids = t.inputs[0].toTensor();
  const int64_t tokens = ids.numel();
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(routed_rows[Expert(layer, 3) + ".w1"], 0);
    int64_t routed = 0;
    for (int e = 0; e < 4; ++e) {
      const std::string w1 = Expert(layer, e) + ".w1";
      EXPECT_EQ(all_rows[w1], tokens) << w1;
      routed += routed_rows[w1];
    }
    EXPECT_EQ(routed, 2 * tokens) << "layer " << layer;  // Top-2 routing.
  }
}

}  // namespace
}  // namespace tracecut::pipelines
