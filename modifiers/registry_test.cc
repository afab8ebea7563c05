#include "modifiers/registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "modifiers/awq_modifier.pb.h"
#include "modifiers/gptq_modifier.pb.h"
#include "modifiers/observer_modifier.pb.h"
#include "modifiers/rtn_modifier.pb.h"
#include "modifiers/smoothquant_modifier.pb.h"
#include "util/testing/status_matchers.h"

namespace tracecut::modifiers {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

TEST(RegistryTest, EveryBuiltInEntryIsRegistered) {
  EXPECT_THAT(
      RegisteredModifierMessages(),
      ElementsAre("tracecut.recipe.AwqModifier", "tracecut.recipe.GptqModifier",
                  "tracecut.recipe.ObserverModifier",
                  "tracecut.recipe.RtnModifier",
                  "tracecut.recipe.SmoothQuantModifier"));
}

TEST(RegistryTest, OnlyWeightQuantizersGiveAWeightScheme) {
  for (const google::protobuf::Descriptor* d :
       {recipe::GptqModifier::descriptor(),
        recipe::RtnModifier::descriptor()}) {
    const ModifierType* t = FindModifierType(d);
    ASSERT_NE(t, nullptr) << d->full_name();
    EXPECT_NE(t->weight_scheme, nullptr) << d->full_name();
  }
  for (const google::protobuf::Descriptor* d :
       {recipe::AwqModifier::descriptor(),
        recipe::SmoothQuantModifier::descriptor(),
        recipe::ObserverModifier::descriptor()}) {
    const ModifierType* t = FindModifierType(d);
    ASSERT_NE(t, nullptr) << d->full_name();
    EXPECT_EQ(t->weight_scheme, nullptr) << d->full_name();
  }
}

TEST(RegistryTest, UnregisteredMessageIsNotFound) {
  EXPECT_EQ(FindModifierType(recipe::QuantizationScheme::descriptor()),
            nullptr);
}

// AWQ without a scheme of its own takes the next weight quantizer's, found
// through the registry; without one it is refused.
TEST(RegistryTest, AwqBuildsWithTheNextQuantizersScheme) {
  recipe::AwqModifier awq;
  recipe::SmoothQuantModifier smooth;
  recipe::RtnModifier rtn;
  rtn.mutable_scheme()->set_preset("W4A16_ASYM");
  rtn.add_targets("Linear");
  const ModifierType* t = FindModifierType(awq.GetDescriptor());
  ASSERT_NE(t, nullptr);

  RecipeContext context;
  context.entries = {&awq, &smooth, &rtn};
  context.index = 0;
  RecipeChecker check("r.textproto", awq, nullptr, "modifiers[0].awq", "");
  EXPECT_OK(t->validate(awq, check, context));
  EXPECT_OK(t->build(awq, context).status());

  context.entries = {&awq, &smooth};
  EXPECT_THAT(t->validate(awq, check, context),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is not followed by a gptq or rtn modifier")));
  EXPECT_THAT(t->build(awq, context).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not followed by a gptq or rtn modifier")));
}

TEST(RegistryDeathTest, SecondRegistrationOfAMessageAborts) {
  ModifierType t;
  t.build = [](const google::protobuf::Message&, const RecipeContext&)
      -> absl::StatusOr<std::unique_ptr<Modifier>> { return nullptr; };
  EXPECT_DEATH(RegisterModifierType(recipe::RtnModifier::descriptor(), t),
               "tracecut.recipe.RtnModifier");
}

}  // namespace
}  // namespace tracecut::modifiers
