#include "modifiers/recipe_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "modifiers/rtn_modifier.pb.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

TEST(RecipeCheckerTest, ErrorsNameTheFieldPath) {
  recipe::RtnModifier m;
  RecipeChecker c("r.textproto", m, nullptr, "modifiers[2].rtn", "");
  EXPECT_THAT(c.Error("targets", "is empty", 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "r.textproto: modifiers[2].rtn.targets[1]: is empty"));
  EXPECT_THAT(c.Nested("scheme", m.scheme()).Error("bits", "too many"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "r.textproto: modifiers[2].rtn.scheme.bits: too many"));
  // A name the message does not have is still an error, not a crash.
  EXPECT_THAT(c.Error("no_such_field", "bad"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no_such_field: bad")));
}

TEST(RecipeConfigTest, SchemeChecksAndWeightArgs) {
  recipe::RtnModifier m;
  RecipeChecker c("r", m, nullptr, "rtn", "");
  EXPECT_THAT(CheckScheme(c, false, m.scheme(), /*required=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("scheme: is required")));
  m.mutable_scheme()->set_bits(9);
  EXPECT_THAT(CheckScheme(c, true, m.scheme(), true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("must be in [2, 8], got 9")));
  m.mutable_scheme()->set_bits(4);
  m.mutable_scheme()->set_symmetric(false);
  m.mutable_scheme()->set_group_size(64);
  ASSERT_OK(CheckScheme(c, true, m.scheme(), true));
  ASSERT_OK_AND_ASSIGN(quantization::QuantizationArgs w,
                       WeightArgs(m.scheme(), {"Linear"}, "rtn"));
  EXPECT_EQ(w.num_bits, 4);
  EXPECT_FALSE(w.symmetric);
  EXPECT_EQ(w.strategy, quantization::Strategy::kGroup);
  EXPECT_EQ(w.group_size, 64);
  m.mutable_scheme()->set_preset("NOT_A_PRESET");
  EXPECT_FALSE(WeightArgs(m.scheme(), {"Linear"}, "rtn").ok());
}

}  // namespace
}  // namespace tracecut::modifiers
