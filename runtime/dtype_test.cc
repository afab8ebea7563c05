#include "runtime/dtype.h"

#include <string>

#include "gtest/gtest.h"

namespace tracecut::runtime {
namespace {

TEST(DTypeTest, InputNamesAreCanonicalAndRoundTrip) {
  ASSERT_EQ(InputDTypeNames().size(), 12u);
  EXPECT_EQ(InputDTypeNames().front(), "float32");
  EXPECT_EQ(InputDTypeNames().back(), "complex128");
  for (absl::string_view name : InputDTypeNames()) {
    EXPECT_TRUE(IsInputDType(name)) << name;
    absl::StatusOr<c10::ScalarType> t = ParseDType(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(DTypeName(*t), name);
  }
}

TEST(DTypeTest, AliasesParseButAreNotInputNames) {
  EXPECT_EQ(*ParseDType("torch.bfloat16"), c10::ScalarType::BFloat16);
  EXPECT_EQ(*ParseDType("long"), c10::ScalarType::Long);
  EXPECT_FALSE(IsInputDType("long"));
  EXPECT_FALSE(IsInputDType("torch.float32"));
  EXPECT_FALSE(IsInputDType("qint8"));
  EXPECT_EQ(DTypeName(c10::ScalarType::QInt8), "qint8");
  EXPECT_FALSE(ParseDType("float8").ok());
}

}  // namespace
}  // namespace tracecut::runtime
