#include "modifiers/fused_experts.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/text.h"
#include "runtime/graph_module.h"
#include "util/status_macros.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::testing::HasSubstr;
using util::testing::StatusIs;

constexpr int kExperts = 3, kHidden = 4, kInter = 2, kTokens = 6;

// Mixtral-style experts: gate_up_proj [experts, 2 x inter, hidden] (gate
// rows first), down_proj [experts, hidden, inter], every token weighted by
// its routing weight for each expert it is routed to. `act` is what the
// module applies; its act_fn is SiLU either way.
torch::jit::Module Experts(const std::string& act) {
  torch::manual_seed(0);
  torch::jit::Module act_fn("SiLUActivation");
  act_fn.define(R"(
def forward(self, x):
    return torch.silu(x)
)");
  torch::jit::Module m("MixtralExperts");
  m.register_parameter("gate_up_proj",
                       torch::randn({kExperts, 2 * kInter, kHidden}), false);
  m.register_parameter("down_proj", torch::randn({kExperts, kHidden, kInter}),
                       false);
  m.register_module("act_fn", act_fn);
  m.define(absl::StrCat(R"(
def forward(self, index, hidden, weights):
    out = torch.zeros_like(hidden)
    for e in range(self.gate_up_proj.size(0)):
        gate, up = torch.matmul(hidden, self.gate_up_proj[e].t()).chunk(2, -1)
        y = torch.matmul()",
                        act, R"((gate) * up, self.down_proj[e].t())
        w = (weights * (index == e).to(weights.dtype)).sum(1)
        out = out + y * w.unsqueeze(1)
    return out
)"));
  return m;
}

// What `tracecut export` records for them: the checkpoint's per-expert
// Linears (moe.experts.E.w1 / w3 / w2).
std::string ModelJson() {
  std::string gate_up, down;
  for (int e = 0; e < kExperts; ++e) {
    for (int half = 0; half < 2; ++half) {
      absl::StrAppend(&gate_up, gate_up.empty() ? "" : ",",
                      "{\"name\": \"moe.experts.", e, half ? ".w3" : ".w1",
                      ".weight\", \"offsets\": [", e, ", ", half * kInter,
                      ", 0], \"sizes\": [1, ", kInter, ", ", kHidden, "]}");
    }
    absl::StrAppend(&down, down.empty() ? "" : ",", "{\"name\": \"moe.experts.",
                    e, ".w2.weight\", \"offsets\": [", e,
                    ", 0, 0], \"sizes\": "
                    "[1, ",
                    kHidden, ", ", kInter, "]}");
  }
  return absl::StrCat(R"({"checkpoint_layout": {"experts.gate_up_proj": [)",
                      gate_up, R"(], "experts.down_proj": [)", down, "]}}");
}

struct Fixture {
  std::unique_ptr<runtime::GraphModule> gm;
  CalibrationResults results;
  std::unique_ptr<RunContext> ctx;
  torch::jit::Module experts;
  std::vector<c10::IValue> inputs;
  c10::IValue output;

  explicit Fixture(const std::string& act = "self.act_fn.forward") {
    torch::jit::Module root("Root");
    root.register_module("experts", Experts(act));
    auto graph = ir::ParseGraph(R"(
      graph {
        %i = placeholder[i]()
        %h = placeholder[h]()
        %w = placeholder[w]()
        %experts = call_module[experts](%i, %h, %w)
        %output = output[output](%experts)
      })");
    EXPECT_OK(graph.status());
    gm = std::make_unique<runtime::GraphModule>(root, std::move(*graph));
    gm->mutable_extra_files()["tracecut_model.json"] = ModelJson();
    ctx = std::make_unique<RunContext>(gm.get(), &results, 1, nullptr);
    experts = *gm->GetSubmodule("experts");
    // Expert 2 gets no token.
    torch::Tensor index =
        torch::tensor({0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0}, torch::kLong)
            .reshape({kTokens, 2});
    torch::Tensor weights = torch::rand({kTokens, 2});
    inputs = {index, torch::randn({kTokens, kHidden}), weights};
    output = experts.forward(inputs);
  }

  ModuleCall Call() const {
    ModuleCall call;
    call.path = "experts";
    call.type = "MixtralExperts";
    call.module = &experts;
    call.inputs = inputs;
    call.output = &output;
    return call;
  }

  // Each Linear's calibration input for one call, by checkpoint path.
  absl::StatusOr<std::map<std::string, torch::Tensor>> Inputs(
      FusedExperts& experts) const {
    std::map<std::string, torch::Tensor> got;
    RETURN_IF_ERROR(experts.ForEachInput(
        *ctx, Call(),
        [&](const std::string& path, const at::Tensor& x) -> absl::Status {
          got[path] = x;
          return absl::OkStatus();
        }));
    return got;
  }
};

TEST(FusedExpertsTest, FindsEachExpertsLinearsAsTheCheckpointStoresThem) {
  Fixture f;
  ModuleSelector all;
  ASSERT_OK_AND_ASSIGN(FusedExperts experts,
                       FusedExperts::Find(*f.ctx, all, "gptq"));
  EXPECT_TRUE(experts.IsExperts("experts"));
  EXPECT_EQ(experts.linears().size(), 3u * kExperts);
  const FusedLinear* w3 = experts.FindLinear("moe.experts.1.w3");
  ASSERT_NE(w3, nullptr);
  EXPECT_EQ(w3->tensor, "experts.gate_up_proj");
  EXPECT_EQ(w3->expert, 1);
  EXPECT_EQ(w3->shape, (std::vector<int64_t>{kInter, kHidden}));
  ASSERT_OK_AND_ASSIGN(torch::Tensor w,
                       experts.Weight(*f.ctx, "moe.experts.1.w3"));
  ASSERT_OK_AND_ASSIGN(torch::Tensor fused,
                       f.gm->GetTensor("experts.gate_up_proj"));
  EXPECT_TRUE(torch::equal(w, fused[1].narrow(0, kInter, kInter)));

  ModuleSelector no_down;
  no_down.ignore = {"re:.*\\.w2"};
  ASSERT_OK_AND_ASSIGN(experts, FusedExperts::Find(*f.ctx, no_down, "gptq"));
  EXPECT_EQ(experts.linears().size(), 2u * kExperts);
  EXPECT_EQ(experts.FindLinear("moe.experts.0.w2"), nullptr);
}

TEST(FusedExpertsTest, InputsAreTheTokensRoutedToEachExpert) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(FusedExperts experts,
                       FusedExperts::Find(*f.ctx, ModuleSelector(), "gptq"));
  ASSERT_OK_AND_ASSIGN(auto got, f.Inputs(experts));
  const torch::Tensor& index = f.inputs[0].toTensor();
  const torch::Tensor& hidden = f.inputs[1].toTensor();
  ASSERT_OK_AND_ASSIGN(torch::Tensor gate_up,
                       f.gm->GetTensor("experts.gate_up_proj"));
  for (int e = 0; e < 2; ++e) {
    torch::Tensor x =
        hidden.index_select(0, index.eq(e).any(1).nonzero().squeeze(1));
    const std::string p = absl::StrCat("moe.experts.", e);
    EXPECT_TRUE(torch::equal(got.at(p + ".w1"), x)) << e;
    EXPECT_TRUE(torch::equal(got.at(p + ".w3"), x)) << e;
    torch::Tensor h =
        torch::silu(x.matmul(gate_up[e].narrow(0, 0, kInter).t())) *
        x.matmul(gate_up[e].narrow(0, kInter, kInter).t());
    EXPECT_TRUE(torch::allclose(got.at(p + ".w2"), h)) << e;
  }
  // Expert 2 was routed no token: no input at all.
  EXPECT_EQ(got.count("moe.experts.2.w1"), 0u);
  EXPECT_EQ(got.size(), 6u);
}

TEST(FusedExpertsTest, AllTokensGivesEveryExpertTheWholeBlock) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(FusedExperts experts,
                       FusedExperts::Find(*f.ctx, ModuleSelector(), "gptq",
                                          /*all_tokens=*/true));
  ASSERT_OK_AND_ASSIGN(auto got, f.Inputs(experts));
  const torch::Tensor& hidden = f.inputs[1].toTensor();
  EXPECT_EQ(got.size(), 3u * kExperts);  // Expert 2 too.
  for (int e = 0; e < kExperts; ++e) {
    EXPECT_TRUE(
        torch::equal(got.at(absl::StrCat("moe.experts.", e, ".w1")), hidden))
        << e;
  }
}

TEST(FusedExpertsTest, AModuleThatComputesSomethingElseIsAnError) {
  Fixture f("torch.relu");
  ASSERT_OK_AND_ASSIGN(FusedExperts experts,
                       FusedExperts::Find(*f.ctx, ModuleSelector(), "gptq"));
  EXPECT_THAT(experts.ForEachInput(*f.ctx, f.Call(),
                                   [](const std::string&, const at::Tensor&) {
                                     return absl::OkStatus();
                                   }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("fused experts experts: recomputing it per "
                                 "expert")));
}

TEST(FusedExpertsTest, StagedWeightsLandInTheirSlicesOnCommit) {
  Fixture f;
  ASSERT_OK_AND_ASSIGN(FusedExperts experts,
                       FusedExperts::Find(*f.ctx, ModuleSelector(), "gptq"));
  ASSERT_OK_AND_ASSIGN(torch::Tensor before,
                       f.gm->GetTensor("experts.down_proj"));
  before = before.clone();
  const torch::Tensor w = torch::full({kHidden, kInter}, 7.0);
  ASSERT_OK(experts.StageWeight(*f.ctx, "moe.experts.1.w2", w));
  ASSERT_OK_AND_ASSIGN(torch::Tensor staged,
                       f.gm->GetTensor("experts.down_proj"));
  EXPECT_TRUE(torch::equal(staged, before));  // Not before Commit.
  ASSERT_OK(experts.Commit(*f.ctx));
  ASSERT_OK_AND_ASSIGN(torch::Tensor after,
                       f.gm->GetTensor("experts.down_proj"));
  EXPECT_TRUE(torch::equal(after[1], w));
  EXPECT_TRUE(torch::equal(after[0], before[0]));
  EXPECT_TRUE(torch::equal(after[2], before[2]));
}

}  // namespace
}  // namespace tracecut::modifiers
