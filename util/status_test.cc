#include "util/status.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/status_macros.h"
#include "util/testing/status_matchers.h"

namespace tracecut::util {
namespace {

using ::testing::Eq;
using ::testing::HasSubstr;
using ::tracecut::util::testing::IsOk;
using ::tracecut::util::testing::IsOkAndHolds;
using ::tracecut::util::testing::StatusIs;

TEST(AnnotateTest, PrefixesMessageAndKeepsCodeAndPayloads) {
  absl::Status s = absl::ResourceExhaustedError("out of memory");
  s.SetPayload("tracecut/torch-message", absl::Cord("the whole story"));
  absl::Status out = Annotate(s, "subgraph 3");
  EXPECT_THAT(out, StatusIs(absl::StatusCode::kResourceExhausted,
                            Eq("subgraph 3: out of memory")));
  ASSERT_TRUE(out.GetPayload("tracecut/torch-message").has_value());
  EXPECT_EQ(std::string(*out.GetPayload("tracecut/torch-message")),
            "the whole story");
}

TEST(AnnotateTest, OkAndEmptyPrefixAreUnchanged) {
  EXPECT_THAT(Annotate(absl::OkStatus(), "context"), IsOk());
  absl::Status s = absl::NotFoundError("gone");
  EXPECT_EQ(Annotate(s, ""), s);
}

TEST(AnnotateTest, StatusOr) {
  absl::StatusOr<int> ok = 3;
  EXPECT_THAT(Annotate(ok, "x"), IsOkAndHolds(3));
  absl::StatusOr<int> bad = absl::InvalidArgumentError("bad");
  EXPECT_THAT(Annotate(bad, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, Eq("x: bad")));
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  EXPECT_THAT(Quarter(8), IsOkAndHolds(2));
  EXPECT_THAT(Quarter(6),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("odd")));
  EXPECT_THAT(CheckEven(4), IsOk());
  EXPECT_THAT(CheckEven(3), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(StatusMatchersTest, MatchersCanFail) {
  // The matchers must reject what they should, or every test using them is
  // vacuous.
  EXPECT_THAT(absl::InternalError("x"), ::testing::Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<int>(4), ::testing::Not(IsOkAndHolds(5)));
  EXPECT_THAT(absl::StatusOr<int>(absl::InternalError("x")),
              ::testing::Not(IsOkAndHolds(::testing::_)));
  EXPECT_THAT(absl::InternalError("x"),
              ::testing::Not(StatusIs(absl::StatusCode::kNotFound)));
  EXPECT_THAT(
      absl::InternalError("abc"),
      ::testing::Not(StatusIs(absl::StatusCode::kInternal, HasSubstr("zzz"))));
}

}  // namespace
}  // namespace tracecut::util
