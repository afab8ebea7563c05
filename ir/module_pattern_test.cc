#include "ir/module_pattern.h"

#include <string>

#include "gtest/gtest.h"

namespace tracecut::ir {
namespace {

bool PathMatch(absl::string_view pattern, absl::string_view path) {
  return ModulePattern(pattern).MatchesPath(path);
}

TEST(ModulePatternTest, Kinds) {
  EXPECT_EQ(ModulePattern("model.layers.0").kind(),
            ModulePattern::Kind::kExact);
  EXPECT_EQ(ModulePattern("model.layers.*").kind(), ModulePattern::Kind::kGlob);
  EXPECT_EQ(ModulePattern("layer?").kind(), ModulePattern::Kind::kGlob);
  EXPECT_EQ(ModulePattern("re:.*").kind(), ModulePattern::Kind::kRegex);
  EXPECT_EQ(ModulePattern("re:.*").text(), "re:.*");
  EXPECT_TRUE(ModulePattern("re:.*").valid());
  EXPECT_EQ(ModulePattern("re:.*").error(), "");
  EXPECT_TRUE(ModulePattern("a*").valid());
}

TEST(ModulePatternTest, PathGlobSegmentsAndDoubleStar) {
  EXPECT_TRUE(PathMatch("model.layers.*.mlp", "model.layers.3.mlp"));
  EXPECT_TRUE(PathMatch("model.layers.*.mlp", "model.layers.12.mlp"));
  EXPECT_FALSE(PathMatch("model.layers.*.mlp", "model.layers.3.mlp.up"));
  EXPECT_FALSE(PathMatch("model.layers.*.mlp", "model.layers.3.x.mlp"));
  EXPECT_FALSE(PathMatch("model.*", "model.layers.3"));
  EXPECT_TRUE(PathMatch("model.**", "model.layers.3"));
  EXPECT_TRUE(PathMatch("**.mlp", "model.layers.3.mlp"));
  EXPECT_TRUE(PathMatch("model.layers.1?.mlp", "model.layers.12.mlp"));
  EXPECT_FALSE(PathMatch("model.layers.1?.mlp", "model.layers.1.mlp"));
  EXPECT_TRUE(PathMatch("*_proj", "q_proj"));
  EXPECT_TRUE(PathMatch("exact", "exact"));
  EXPECT_FALSE(PathMatch("exact", "exact.child"));
  EXPECT_TRUE(PathMatch("*", ""));
  EXPECT_FALSE(PathMatch("a.*", "a"));
  // Runs of more than two stars are '**'.
  EXPECT_TRUE(PathMatch("model.***", "model.layers.3"));
  EXPECT_TRUE(PathMatch("a.***.b", "a.x.y.b"));
}

TEST(ModulePatternTest, PathSegmentsArePyTorchNames) {
  // torchvision's RegNet: trunk_output.block1.block1-0.proj.0.
  const char kPath[] = "trunk_output.block1.block1-0";
  EXPECT_TRUE(PathMatch("trunk_output.block1.block1-0", kPath));
  EXPECT_TRUE(PathMatch("trunk_output.*.block1-*", kPath));
  EXPECT_TRUE(PathMatch("trunk_output.block?.block?-?", kPath));
  EXPECT_TRUE(PathMatch("**.block1-0", kPath));
  EXPECT_FALSE(PathMatch("*.block1-0", kPath));
  EXPECT_FALSE(PathMatch("trunk_output.block1.block1", kPath));
  EXPECT_TRUE(PathMatch("0.*", "0.1"));
  EXPECT_TRUE(PathMatch("my block.*", "my block.sub module"));
  EXPECT_TRUE(PathMatch("bl*ck",
                        "bl\xc3\xb6"
                        "ck"));
  EXPECT_TRUE(PathMatch("bl??ck",
                        "bl\xc3\xb6"
                        "ck"));  // '?' is one byte.
  // A name holding glob characters matches itself.
  EXPECT_TRUE(PathMatch("a*b.c?d", "a*b.c?d"));
}

TEST(ModulePatternTest, TypesShortOrQualified) {
  const std::string t = "transformers.models.llama.modeling_llama.LlamaMLP";
  EXPECT_TRUE(ModulePattern("LlamaMLP").MatchesType(t));
  EXPECT_TRUE(ModulePattern(t).MatchesType(t));
  EXPECT_FALSE(ModulePattern("MLP").MatchesType(t));
  EXPECT_FALSE(ModulePattern("modeling_llama.LlamaMLP").MatchesType(t));
  EXPECT_FALSE(ModulePattern(t).MatchesType("other.LlamaMLP"));
  // A path pattern is no type pattern, and the other way round.
  EXPECT_FALSE(ModulePattern("model.layers.0.mlp").MatchesType(t));
  EXPECT_FALSE(ModulePattern("LlamaMLP").MatchesPath("model.layers.0.mlp"));
  // An unknown type matches nothing, not even '*'.
  EXPECT_FALSE(ModulePattern("*").MatchesType(""));
  EXPECT_FALSE(ModulePattern("re:.*").MatchesType(""));
}

TEST(ModulePatternTest, TypeGlobStarSpansPackages) {
  const std::string t = "transformers.models.llama.modeling_llama.LlamaRMSNorm";
  EXPECT_TRUE(ModulePattern("*RMSNorm").MatchesType(t));
  EXPECT_TRUE(ModulePattern("Llama*").MatchesType(t));
  EXPECT_TRUE(ModulePattern("transformers.*RMSNorm").MatchesType(t));
  EXPECT_TRUE(ModulePattern("transformers.**").MatchesType(t));
  EXPECT_FALSE(ModulePattern("torch.*").MatchesType(t));
  // '?' never matches the '.' between packages.
  EXPECT_FALSE(ModulePattern("transformers?models*").MatchesType(t));
  // On the path the same star stays within a segment.
  EXPECT_FALSE(ModulePattern("model.*").MatchesPath("model.layers.0"));
}

TEST(ModulePatternTest, RegexFullMatch) {
  EXPECT_TRUE(ModulePattern("re:.*mlp").MatchesPath("model.layers.0.mlp"));
  EXPECT_FALSE(ModulePattern("re:mlp").MatchesPath("model.layers.0.mlp"));
  EXPECT_TRUE(ModulePattern("re:.*\\.block1-[0-9]+")
                  .MatchesPath("trunk_output.block1.block1-0"));
  const std::string t = "transformers.models.llama.modeling_llama.LlamaMLP";
  EXPECT_TRUE(ModulePattern("re:Llama(MLP|Attention)").MatchesType(t));
  EXPECT_TRUE(ModulePattern("re:transformers\\..*").MatchesType(t));
}

TEST(ModulePatternTest, InvalidRegexMatchesNothingAndSaysWhy) {
  ModulePattern p("re:(");
  EXPECT_EQ(p.kind(), ModulePattern::Kind::kRegex);
  EXPECT_FALSE(p.valid());
  EXPECT_NE(p.error(), "");
  EXPECT_FALSE(p.Matches("model", "x.Model"));
  EXPECT_FALSE(p.Matches("(", "("));
}

TEST(ModulePatternTest, MatchesPathOrType) {
  const std::string t = "transformers.models.llama.modeling_llama.LlamaMLP";
  EXPECT_TRUE(ModulePattern("LlamaMLP").Matches("model.layers.0.mlp", t));
  EXPECT_TRUE(
      ModulePattern("model.layers.0.mlp").Matches("model.layers.0.mlp", t));
  EXPECT_TRUE(ModulePattern("model.layers.?").Matches("model.layers.7", ""));
  EXPECT_FALSE(ModulePattern("model.layers.?").Matches("model.layers.17", ""));
  EXPECT_FALSE(ModulePattern("MLP").Matches("model.layers.0.mlp", t));
}

}  // namespace
}  // namespace tracecut::ir
