#include "ir/names.h"

#include <string>

#include "gtest/gtest.h"

namespace tracecut::ir {
namespace {

TEST(NamesTest, Identifiers) {
  EXPECT_TRUE(IsIdentifier("x"));
  EXPECT_TRUE(IsIdentifier("_0"));
  EXPECT_TRUE(IsIdentifier("layers_0_weight"));
  EXPECT_FALSE(IsIdentifier(""));
  EXPECT_FALSE(IsIdentifier("0x"));
  EXPECT_FALSE(IsIdentifier("block1-0"));
  EXPECT_FALSE(IsIdentifier("a.b"));
  EXPECT_FALSE(IsIdentifier("\xc3\xa9"));
}

TEST(NamesTest, ModulePathSegmentsAreWhatPyTorchAccepts) {
  // nn.Module.add_module rejects only "" and names containing '.'.
  for (const std::string& ok :
       {std::string("fc"), std::string("0"), std::string("block1-0"),
        std::string("0abc"), std::string("a b"),
        std::string("\xc3\xa9t\xc3\xa9"), std::string("\"q\\"),
        std::string("x:y"), std::string("*"), std::string("tab\there"),
        std::string("nul\0byte", 8)}) {
    EXPECT_TRUE(IsModulePathSegment(ok)) << ok;
    EXPECT_TRUE(IsModulePath(ok)) << ok;
  }
  EXPECT_FALSE(IsModulePathSegment(""));
  EXPECT_FALSE(IsModulePathSegment("a.b"));
  EXPECT_FALSE(IsModulePathSegment("."));
}

TEST(NamesTest, ModulePaths) {
  EXPECT_TRUE(IsModulePath("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(IsModulePath("trunk_output.block1.block1-0.proj.0"));
  EXPECT_TRUE(IsModulePath("a b.\xd0\xb1\xd0\xbb\xd0\xbe\xd0\xba.0"));
  EXPECT_FALSE(IsModulePath(""));
  EXPECT_FALSE(IsModulePath("."));
  EXPECT_FALSE(IsModulePath(".a"));
  EXPECT_FALSE(IsModulePath("a."));
  EXPECT_FALSE(IsModulePath("a..b"));
  EXPECT_FALSE(IsModulePath("a...b"));
}

TEST(NamesTest, ScopePathsMayBeTheRoot) {
  EXPECT_TRUE(IsScopePath(""));
  EXPECT_TRUE(IsScopePath("block1-0"));
  EXPECT_FALSE(IsScopePath("a..b"));
  EXPECT_FALSE(IsScopePath("."));
}

TEST(NamesTest, SanitizeNameMakesIdentifiers) {
  EXPECT_EQ(SanitizeName("linear"), "linear");
  EXPECT_EQ(SanitizeName("layers.0.weight"), "layers_0_weight");
  EXPECT_EQ(SanitizeName("trunk_output.block1.block1-0.proj.0"),
            "trunk_output_block1_block1_0_proj_0");
  EXPECT_EQ(SanitizeName("0.weight"), "_0_weight");
  EXPECT_EQ(SanitizeName("3d"), "_3d");
  EXPECT_EQ(SanitizeName(""), "_");
  EXPECT_EQ(SanitizeName("a b"), "a_b");
  EXPECT_EQ(SanitizeName("\"q\\"), "_q_");
  // One '_' per character, not per UTF-8 byte: "é" is 2 bytes, "блок" 8,
  // "€" 3, "😀" 4.
  EXPECT_EQ(SanitizeName("\xc3\xa9t\xc3\xa9"), "_t_");
  EXPECT_EQ(SanitizeName("\xd0\xb1\xd0\xbb\xd0\xbe\xd0\xba.0"), "_____0");
  EXPECT_EQ(SanitizeName("\xe2\x82\xac"), "_");
  EXPECT_EQ(SanitizeName("x\xf0\x9f\x98\x80y"), "x_y");
  // A stray continuation byte is a character of its own.
  EXPECT_EQ(SanitizeName("a\x80\x80"), "a__");
  for (const std::string& hint :
       {std::string("block1-0"), std::string("9"), std::string(". ."),
        std::string("\xff\xfe"), std::string("nul\0", 4)}) {
    EXPECT_TRUE(IsIdentifier(SanitizeName(hint))) << hint;
  }
}

}  // namespace
}  // namespace tracecut::ir
