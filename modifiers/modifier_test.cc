#include "modifiers/modifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "modifiers/testing/traced_llama.h"
#include "util/progress.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

TEST(ModuleSelectorTest, TargetsMinusIgnore) {
  ModuleSelector s;
  s.targets = {"Linear"};
  s.ignore = {"lm_head", "re:.*\\.gate$"};
  const char kLinear[] = "torch.nn.modules.linear.Linear";
  EXPECT_TRUE(s.Matches("model.layers.0.mlp.up_proj", kLinear));
  EXPECT_FALSE(s.Matches("lm_head", kLinear));
  EXPECT_FALSE(s.Matches("model.layers.0.mlp.gate", kLinear));
  EXPECT_FALSE(s.Matches("model.norm", "LlamaRMSNorm"));
}

TEST(ModuleSelectorTest, SelectNamesTheOwnerWhenNothingMatches) {
  runtime::GraphModule gm = testing::TraceLlamaFixture();
  util::Progress progress = util::Progress::Silent();
  CalibrationResults results;
  RunContext ctx(&gm, &results, 1, &progress);
  ModuleSelector s;
  s.targets = {"model.layers.0.mlp.*_proj"};
  ASSERT_OK_AND_ASSIGN(std::vector<const LeafModule*> leaves,
                       s.Select(ctx, "gptq"));
  std::vector<std::string> paths;
  for (const LeafModule* l : leaves) paths.push_back(l->path);
  EXPECT_THAT(paths, ElementsAre("model.layers.0.mlp.gate_proj",
                                 "model.layers.0.mlp.up_proj",
                                 "model.layers.0.mlp.down_proj"));
  s.targets = {"Conv2d"};
  EXPECT_THAT(s.Select(ctx, "gptq").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gptq")));
}

TEST(ModifierHelpersTest, NamesSurviveTheirState) {
  const std::set<std::string> names = {"b", "a.c"};
  ASSERT_OK_AND_ASSIGN(std::set<std::string> back,
                       NamesFromState(NamesToState(names), "awq"));
  EXPECT_EQ(back, names);
  ASSERT_OK_AND_ASSIGN(std::set<std::string> none,
                       NamesFromState(c10::IValue(), "awq"));
  EXPECT_TRUE(none.empty());
  EXPECT_THAT(NamesFromState(c10::IValue(int64_t{3}), "awq").status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("awq")));
}

TEST(ModifierHelpersTest, ShortTypeParentAndArchitecture) {
  EXPECT_EQ(ShortType("torch.nn.modules.linear.Linear"), "Linear");
  EXPECT_EQ(ParentModulePath("model.layers.0.mlp"), "model.layers.0");
  EXPECT_EQ(ParentModulePath("lm_head"), "");
  EXPECT_EQ(ModelArchitecture(testing::TraceLlamaFixture()),
            "LlamaForCausalLM");
}

}  // namespace
}  // namespace tracecut::modifiers
