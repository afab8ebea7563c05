#include "transforms/registry.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::transforms {
namespace {

TEST(RegistryTest, EveryNameMakesItsPass) {
  const std::vector<std::string> names = RegisteredPassNames();
  EXPECT_EQ(names.size(), 11u);
  for (const std::string& name : names) {
    auto pass = MakePass(name);
    ASSERT_OK(pass);
    if (absl::EndsWith(name, "-inexact")) {
      EXPECT_EQ((*pass)->name(), "change-truediv-to-mul-by-inverse");
      EXPECT_FALSE((*pass)->preserves_computation());
    } else {
      EXPECT_EQ((*pass)->name(), name);
    }
  }
}

TEST(RegistryTest, Pipelines) {
  auto p = MakePassPipeline("merge-linears, fuse-batchnorm2d-in-conv2d");
  ASSERT_OK(p);
  ASSERT_EQ((*p)->passes().size(), 2u);
  EXPECT_EQ((*p)->passes()[1]->name(), "fuse-batchnorm2d-in-conv2d");
  EXPECT_TRUE((*p)->is_reversible());
  auto bad = MakePassPipeline("merge-linears,nope");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "merge-linears"));
  EXPECT_FALSE(MakePassPipeline("merge-linears,,").ok());
}

}  // namespace
}  // namespace tracecut::transforms
