#ifndef TRACECUT_UTIL_TESTING_STATUS_MATCHERS_H_
#define TRACECUT_UTIL_TESTING_STATUS_MATCHERS_H_

// gMock matchers for absl::Status and absl::StatusOr (the system Abseil,
// 20220623, has no absl/status/status_matchers.h):
//
//   EXPECT_THAT(Parse(text), IsOk());
//   EXPECT_THAT(Parse(text), IsOkAndHolds(SizeIs(3)));
//   EXPECT_THAT(Parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
//                                    HasSubstr("line 3")));
//   ASSERT_OK_AND_ASSIGN(Graph g, Parse(text));
//
// On failure they print the status, so a test never needs `<< s`.

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tracecut::util::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

template <typename Inner>
class IsOkAndHoldsMatcher {
 public:
  explicit IsOkAndHoldsMatcher(Inner inner) : inner_(std::move(inner)) {}

  template <typename StatusOrT>
  operator ::testing::Matcher<StatusOrT>() const {  // NOLINT
    using T = typename std::decay_t<StatusOrT>::value_type;
    return ::testing::MakeMatcher(
        new Impl<StatusOrT>(::testing::SafeMatcherCast<const T&>(inner_)));
  }

 private:
  template <typename StatusOrT>
  class Impl : public ::testing::MatcherInterface<StatusOrT> {
   public:
    using T = typename std::decay_t<StatusOrT>::value_type;
    explicit Impl(::testing::Matcher<const T&> inner)
        : inner_(std::move(inner)) {}
    bool MatchAndExplain(
        StatusOrT actual,
        ::testing::MatchResultListener* listener) const override {
      if (!actual.ok()) {
        *listener << "which has status " << actual.status();
        return false;
      }
      return inner_.MatchAndExplain(*actual, listener);
    }
    void DescribeTo(std::ostream* os) const override {
      *os << "is OK and holds a value that ";
      inner_.DescribeTo(os);
    }
    void DescribeNegationTo(std::ostream* os) const override {
      *os << "is not OK or holds a value that ";
      inner_.DescribeNegationTo(os);
    }

   private:
    ::testing::Matcher<const T&> inner_;
  };

  Inner inner_;
};

}  // namespace internal

MATCHER(IsOk, "is OK") {
  const absl::Status& s = internal::GetStatus(arg);
  if (!s.ok()) *result_listener << "which is " << s;
  return s.ok();
}

MATCHER_P2(StatusIs, code, message_matcher,
           "has code " + ::testing::PrintToString(code) +
               " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher)) {
  const absl::Status& s = internal::GetStatus(arg);
  *result_listener << "which is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(
             message_matcher, std::string(s.message()), result_listener);
}

MATCHER_P(StatusIs, code, "has code " + ::testing::PrintToString(code)) {
  const absl::Status& s = internal::GetStatus(arg);
  *result_listener << "which is " << s;
  return s.code() == code;
}

template <typename Inner>
internal::IsOkAndHoldsMatcher<Inner> IsOkAndHolds(Inner inner) {
  return internal::IsOkAndHoldsMatcher<Inner>(std::move(inner));
}

}  // namespace tracecut::util::testing

#define TRACECUT_TESTING_CONCAT_INNER_(a, b) a##b
#define TRACECUT_TESTING_CONCAT_(a, b) TRACECUT_TESTING_CONCAT_INNER_(a, b)

// ASSERT_OK_AND_ASSIGN(auto v, MaybeV()): fails the test with the status.
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                           \
  auto TRACECUT_TESTING_CONCAT_(statusor_, __LINE__) = (expr);    \
  ASSERT_TRUE(TRACECUT_TESTING_CONCAT_(statusor_, __LINE__).ok()) \
      << TRACECUT_TESTING_CONCAT_(statusor_, __LINE__).status();  \
  lhs = std::move(TRACECUT_TESTING_CONCAT_(statusor_, __LINE__)).value()

#define EXPECT_OK(expr) EXPECT_THAT((expr), ::tracecut::util::testing::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::tracecut::util::testing::IsOk())

#endif  // TRACECUT_UTIL_TESTING_STATUS_MATCHERS_H_
