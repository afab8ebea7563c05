#include "runtime/compare.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tracecut::runtime {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::nan("");

c10::IValue Tuple(std::vector<c10::IValue> items) {
  return c10::ivalue::Tuple::create(std::move(items));
}

c10::IValue List(std::vector<at::Tensor> items) {
  c10::List<at::Tensor> list;
  for (at::Tensor& t : items) list.push_back(std::move(t));
  return list;
}

c10::IValue Dict(std::vector<std::pair<std::string, at::Tensor>> items) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (auto& [k, v] : items) dict.insert(k, v);
  return dict;
}

at::Tensor D(std::vector<double> values) {
  return at::tensor(values, at::kDouble);
}

CompareResult Compare(const c10::IValue& actual, const c10::IValue& expected,
                      CompareOptions options = {}) {
  absl::StatusOr<CompareResult> r = CompareValues(actual, expected, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CompareResult{};
}

TEST(CompareTest, DefaultsAreStatedOnce) {
  CompareOptions options;
  EXPECT_EQ(options.rtol, kDefaultRtol);
  EXPECT_EQ(options.atol, kDefaultAtol);
  EXPECT_EQ(kDefaultRtol, 1e-4);
  EXPECT_EQ(kDefaultAtol, 1e-5);
  CompareResult r = Compare(D({1}), D({1}));
  EXPECT_EQ(r.rtol, 1e-4);
  EXPECT_EQ(r.atol, 1e-5);
}

TEST(CompareTest, IdenticalValuesPassWithZeroError) {
  at::Tensor a = at::randn({4, 5});
  CompareResult r = Compare(a, a.clone());
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.elements, 20);
  EXPECT_EQ(r.violations, 0);
  EXPECT_EQ(r.max_abs_error, 0.0);
  EXPECT_EQ(r.max_rel_error, 0.0);
  EXPECT_FALSE(r.worst.has_value());
  EXPECT_EQ(r.ErrorSummary(), "max abs error 0, max rel error 0");
}

// What a BatchNorm fusion does to a float32 model whose outputs are ~60:
// a few ulps (6e-5) apart, 1e-6 relative. Relative tolerance accepts it, a
// pure absolute 1e-5 does not.
TEST(CompareTest, LargeMagnitudePassesRelativeButNotPureAbsolute) {
  at::Tensor expected = at::full({2, 8}, 60.0, at::kFloat) +
                        at::linspace(-3, 3, 16, at::kFloat).reshape({2, 8});
  at::Tensor actual = expected + 6e-5f;
  CompareResult r = Compare(actual, expected);
  EXPECT_TRUE(r.passed) << r.FailureSummary("output");
  EXPECT_NEAR(r.max_abs_error, 6e-5, 1e-5);
  EXPECT_LT(r.max_rel_error, 2e-6);

  CompareResult abs_only = Compare(actual, expected, {0.0, 1e-5});
  EXPECT_FALSE(abs_only.passed);
  EXPECT_EQ(abs_only.violations, 16);
  EXPECT_EQ(abs_only.elements, 16);
  ASSERT_TRUE(abs_only.worst.has_value());
  EXPECT_THAT(abs_only.FailureSummary("output"),
              HasSubstr("16 of 16 elements exceed atol 1e-05 + rtol 0*|ref|; "
                        "worst at output element "));
}

TEST(CompareTest, ElementRuleIsAtolPlusRtolTimesReference) {
  const CompareOptions options{0.1, 1.0};
  // Allowed: 1 + 0.1 * |b|.
  EXPECT_TRUE(Compare(D({11.9}), D({10}), options).passed);   // 1.9 <= 2
  EXPECT_FALSE(Compare(D({12.1}), D({10}), options).passed);  // 2.1 > 2
  EXPECT_TRUE(Compare(D({-8.1}), D({-10}), options).passed);  // 1.9 <= 2
  // |b| is the reference's magnitude, not the actual's.
  EXPECT_TRUE(Compare(D({0}), D({10}), {1.0, 0.0}).passed);   // 10 <= 10
  EXPECT_FALSE(Compare(D({10}), D({0}), {1.0, 0.0}).passed);  // 10 > 0
}

TEST(CompareTest, RelativeErrorOfZeroReferenceIsInfinite) {
  CompareResult r = Compare(D({0, 1e-7}), D({0, 0}));
  EXPECT_TRUE(r.passed);  // 1e-7 <= atol.
  EXPECT_DOUBLE_EQ(r.max_abs_error, 1e-7);
  EXPECT_EQ(r.max_rel_error, kInf);
  EXPECT_EQ(Compare(D({0}), D({0})).max_rel_error, 0.0);
  EXPECT_DOUBLE_EQ(Compare(D({2.5}), D({2})).max_rel_error, 0.25);
}

TEST(CompareTest, NanAndInfinity) {
  // NaN on both sides and equal infinities are equal.
  CompareResult same =
      Compare(D({kNan, kInf, -kInf, 1}), D({kNan, kInf, -kInf, 1}));
  EXPECT_TRUE(same.passed);
  EXPECT_EQ(same.max_abs_error, 0.0);
  EXPECT_EQ(same.max_rel_error, 0.0);

  for (const auto& [a, b] :
       std::vector<std::pair<double, double>>{{kNan, 1},
                                              {1, kNan},
                                              {kInf, 1},
                                              {1, kInf},
                                              {kInf, -kInf},
                                              {kNan, kInf}}) {
    CompareResult r = Compare(D({0, a}), D({0, b}));
    EXPECT_FALSE(r.passed) << a << " vs " << b;
    EXPECT_EQ(r.violations, 1);
    EXPECT_EQ(r.max_abs_error, kInf);
    EXPECT_EQ(r.max_rel_error, kInf);
    ASSERT_TRUE(r.worst.has_value());
    EXPECT_EQ(r.worst->flat_index, 1);
    EXPECT_EQ(r.worst->abs_error, kInf);
  }
  // A one-sided NaN is worse than any finite violation, even a later one.
  CompareResult r = Compare(D({1e9, kNan, 5e9}), D({0, 0, 0}));
  EXPECT_EQ(r.violations, 3);
  ASSERT_TRUE(r.worst.has_value());
  EXPECT_EQ(r.worst->flat_index, 1);
  EXPECT_TRUE(std::isnan(r.worst->actual));
  EXPECT_THAT(r.FailureSummary("output"),
              HasSubstr("worst at output element 1: nan vs 0 (abs inf, rel "
                        "inf)"));
}

TEST(CompareTest, WorstIsTheLargestExcessFirstOnTies) {
  // Excess over 1e-5 + 1e-4 * |b|: 0.5 - 0.0001 for b=1, 5 - 0.1 for b=1000,
  // 1 - 1e-5 for b=0.
  CompareResult r = Compare(D({1.5, 1005, 1, 1005}), D({1, 1000, 0, 1000}));
  EXPECT_EQ(r.violations, 4);
  ASSERT_TRUE(r.worst.has_value());
  EXPECT_EQ(r.worst->flat_index, 1);
  EXPECT_EQ(r.worst->actual, 1005);
  EXPECT_EQ(r.worst->expected, 1000);
  EXPECT_DOUBLE_EQ(r.worst->abs_error, 5);
  EXPECT_DOUBLE_EQ(r.worst->rel_error, 0.005);
  EXPECT_DOUBLE_EQ(r.max_abs_error, 5);
  EXPECT_EQ(r.max_rel_error, kInf);  // 1 vs 0.
}

TEST(CompareTest, WorstNamesPathFlatAndMultiIndex) {
  at::Tensor expected = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor actual = expected.clone();
  actual[1][2] = 5.5;
  CompareResult r = Compare(Tuple({at::zeros({1}), actual}),
                            Tuple({at::zeros({1}), expected}));
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.elements, 7);
  ASSERT_TRUE(r.worst.has_value());
  EXPECT_EQ(r.worst->path, "[1]");
  EXPECT_EQ(r.worst->flat_index, 5);
  EXPECT_EQ(r.worst->index, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.worst->ToString(),
            "[1] element 5 [1, 2]: 5.5 vs 5 (abs 0.5, rel 0.1)");
  EXPECT_EQ(r.FailureSummary("output"),
            "1 of 7 elements exceed atol 1e-05 + rtol 0.0001*|ref|; worst at "
            "output [1] element 5 [1, 2]: 5.5 vs 5 (abs 0.5, rel 0.1); max "
            "abs error 0.5, max rel error 0.1");
}

TEST(CompareTest, NonContiguousTensorsUseLogicalIndices) {
  at::Tensor expected =
      at::arange(12, at::kDouble).reshape({3, 4}).t();  // [4, 3]
  at::Tensor actual = expected.clone();
  actual[2][1] += 1;  // Flat (row-major over [4, 3]) 7.
  CompareResult r = Compare(actual, expected);
  ASSERT_TRUE(r.worst.has_value());
  EXPECT_EQ(r.worst->flat_index, 7);
  EXPECT_EQ(r.worst->index, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(r.worst->expected, expected[2][1].item<double>());
}

TEST(CompareTest, LargeTensorsAcrossChunks) {
  at::Tensor expected = at::ones({3, 200000}, at::kFloat);
  at::Tensor actual = expected.clone();
  actual[2][199999] = 2;  // Flat 599999, in the last chunk.
  actual[0][5] = 1.5;
  CompareResult r = Compare(actual, expected);
  EXPECT_EQ(r.elements, 600000);
  EXPECT_EQ(r.violations, 2);
  ASSERT_TRUE(r.worst.has_value());
  EXPECT_EQ(r.worst->flat_index, 599999);
  EXPECT_EQ(r.worst->index, (std::vector<int64_t>{2, 199999}));
  EXPECT_DOUBLE_EQ(r.max_abs_error, 1.0);
}

TEST(CompareTest, EmptyTensors) {
  CompareResult r = Compare(at::zeros({0, 3}), at::zeros({0, 3}));
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.elements, 0);
  EXPECT_EQ(r.max_abs_error, 0.0);
  auto shape = CompareValues(at::zeros({0, 3}), at::zeros({0, 4}));
  ASSERT_FALSE(shape.ok());
  EXPECT_THAT(shape.status().message(), HasSubstr("shape [0, 3] vs [0, 4]"));
}

TEST(CompareTest, IntegerAndBoolTensors) {
  at::Tensor ids = at::tensor({1000000, 7, -3}, at::kLong);
  EXPECT_TRUE(Compare(ids, ids.clone(), {0, 0}).passed);
  at::Tensor off = at::tensor({1000001, 7, -3}, at::kLong);
  // 1 <= 1e-5 + 1e-4 * 1e6.
  EXPECT_TRUE(Compare(off, ids).passed);
  CompareResult exact = Compare(off, ids, {0, 0});
  EXPECT_FALSE(exact.passed);
  ASSERT_TRUE(exact.worst.has_value());
  EXPECT_EQ(exact.worst->ToString(),
            "element 0: 1000001 vs 1000000 (abs 1, rel 1e-06)");
  CompareResult mask =
      Compare(at::tensor({1, 0}).to(at::kBool), at::ones({2}, at::kBool));
  EXPECT_FALSE(mask.passed);
  ASSERT_TRUE(mask.worst.has_value());
  EXPECT_EQ(mask.worst->flat_index, 1);
  // int32 against int64 and float: values, not dtypes, are compared.
  EXPECT_TRUE(
      Compare(at::tensor({1, 2}, at::kInt), at::tensor({1.0, 2.0})).passed);
}

TEST(CompareTest, Bfloat16Inputs) {
  at::Tensor reference = at::linspace(-60, 60, 64, at::kFloat);
  at::Tensor bf16 = reference.to(at::kBFloat16);
  // bf16 against itself: exact.
  CompareResult same = Compare(bf16, bf16.clone(), {0, 0});
  EXPECT_TRUE(same.passed);
  // bf16 rounding of ~60 is up to 0.125 (2^-8 relative): over 1e-4.
  CompareResult rounded = Compare(bf16, reference);
  EXPECT_FALSE(rounded.passed);
  EXPECT_GT(rounded.max_abs_error, 1e-2);
  EXPECT_LE(rounded.max_rel_error, std::ldexp(1.0, -8));
  EXPECT_TRUE(Compare(bf16, reference, {std::ldexp(1.0, -8), 0}).passed);
  // bf16 on both sides, one ulp (0.25) apart in [32, 64).
  at::Tensor high = at::linspace(32, 60, 16, at::kFloat).to(at::kBFloat16);
  at::Tensor next = (high.to(at::kFloat) + 0.25f).to(at::kBFloat16);
  CompareResult ulp = Compare(next, high, {1e-2, 0});
  EXPECT_TRUE(ulp.passed) << ulp.FailureSummary("output");
  EXPECT_GT(ulp.max_abs_error, 0.0);
}

TEST(CompareTest, StructuresCompareElementwise) {
  at::Tensor a = D({1, 2});
  at::Tensor b = D({1, 2.5});
  // Tuples, lists (and a tuple against a list), nesting.
  CompareResult r = Compare(Tuple({a, List({a, a}), c10::IValue(3)}),
                            Tuple({a, List({a, b}), c10::IValue(3)}));
  EXPECT_EQ(r.elements, 7);
  EXPECT_EQ(r.violations, 1);
  ASSERT_TRUE(r.worst.has_value());
  EXPECT_EQ(r.worst->path, "[1][1]");
  EXPECT_TRUE(Compare(List({a, b}), Tuple({a, b})).passed);

  // Dicts by key, whatever their insertion order; paths name the key.
  CompareResult d = Compare(Dict({{"logits", a}, {"mask", a}}),
                            Dict({{"mask", a}, {"logits", b}}));
  ASSERT_TRUE(d.worst.has_value());
  EXPECT_EQ(d.worst->path, "['logits']");
  EXPECT_EQ(d.worst->Location(), "['logits'] element 1");

  // Scalars: numerically, one element each.
  EXPECT_TRUE(Compare(c10::IValue(3), c10::IValue(3.0)).passed);
  EXPECT_TRUE(Compare(c10::IValue(true), c10::IValue(1)).passed);
  CompareResult scalar = Compare(Tuple({c10::IValue(int64_t{5})}),
                                 Tuple({c10::IValue(int64_t{3})}));
  EXPECT_FALSE(scalar.passed);
  ASSERT_TRUE(scalar.worst.has_value());
  EXPECT_EQ(scalar.worst->flat_index, -1);
  EXPECT_EQ(scalar.FailureSummary("output"),
            "1 of 1 elements exceed atol 1e-05 + rtol 0.0001*|ref|; worst at "
            "output [0]: 5 vs 3 (abs 2, rel 0.667); max abs error 2, max rel "
            "error 0.667");
  CompareResult top = Compare(c10::IValue(5.0), c10::IValue(3.0));
  EXPECT_THAT(top.FailureSummary("output"),
              HasSubstr("worst at output: 5 vs 3"));
  const int64_t big = (int64_t{1} << 60) + 1;
  EXPECT_TRUE(Compare(c10::IValue(big), c10::IValue(big), {0, 0}).passed);

  // None, strings, devices: equal or an error.
  EXPECT_TRUE(Compare(c10::IValue(), c10::IValue()).passed);
  EXPECT_TRUE(Compare(c10::IValue("x"), c10::IValue("x")).passed);
  EXPECT_TRUE(
      Compare(c10::IValue(c10::Device("cpu")), c10::IValue(c10::Device("cpu")))
          .passed);
}

TEST(CompareTest, StructureMismatchesNameThePath) {
  auto message = [](const c10::IValue& a, const c10::IValue& b) {
    absl::StatusOr<CompareResult> r = CompareValues(a, b);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    return std::string(r.status().message());
  };
  EXPECT_THAT(message(Tuple({at::zeros({1}), at::zeros({2, 3})}),
                      Tuple({at::zeros({1}), at::zeros({2, 4})})),
              HasSubstr("[1]: shape [2, 3] vs [2, 4]"));
  EXPECT_THAT(message(at::zeros({2}), at::zeros({3})),
              HasSubstr("value: shape [2] vs [3]"));
  EXPECT_THAT(
      message(Tuple({at::zeros({1})}), Tuple({at::zeros({1}), c10::IValue()})),
      HasSubstr("value: 1 elements vs 2"));
  EXPECT_THAT(
      message(Dict({{"a", at::zeros({1})}}), Dict({{"b", at::zeros({1})}})),
      HasSubstr("value: keys {['a']} vs {['b']}"));
  EXPECT_THAT(message(Tuple({at::zeros({1}), c10::IValue("s")}),
                      Tuple({at::zeros({1}), at::zeros({1})})),
              HasSubstr("[1]: cannot compare String with Tensor"));
  EXPECT_THAT(message(c10::IValue("a"), c10::IValue("b")),
              HasSubstr("string 'a' vs 'b'"));
  EXPECT_THAT(message(c10::IValue(), c10::IValue(1)),
              HasSubstr("cannot compare None with Int"));
  EXPECT_THAT(message(at::Tensor(), at::zeros({1})),
              HasSubstr("an undefined tensor vs a tensor"));
  EXPECT_THAT(message(at::zeros({2}, at::kComplexFloat), at::zeros({2})),
              HasSubstr("complex tensors"));
  EXPECT_TRUE(Compare(at::Tensor(), at::Tensor()).passed);
}

TEST(CompareTest, ComparatorGathersValuesUnderTheirPaths) {
  Comparator c;
  ASSERT_TRUE(c.Add(D({1, 2}), D({1, 2}), "%a").ok());
  ASSERT_TRUE(c.Add(Tuple({D({3})}), Tuple({D({4})}), "%b").ok());
  ASSERT_TRUE(c.Add(D({10}), D({0}), "%c").ok());
  const CompareResult& r = c.result();
  EXPECT_EQ(r.elements, 4);
  EXPECT_EQ(r.violations, 2);
  ASSERT_TRUE(r.worst.has_value());
  EXPECT_EQ(r.worst->Location(), "%c element 0");
  auto bad = c.Add(D({1}), D({1, 2}), "%d");
  EXPECT_THAT(bad.message(), HasSubstr("%d: shape [1] vs [2]"));
}

TEST(CompareTest, RejectsBadTolerances) {
  for (const CompareOptions& options :
       std::vector<CompareOptions>{{-1, 0}, {0, -1e-9}, {kNan, 0}, {0, kInf}}) {
    EXPECT_EQ(ValidateCompareOptions(options).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(CompareValues(D({1}), D({1}), options).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(ValidateCompareOptions({-1, 0}).message(),
              HasSubstr("rtol must be a finite number >= 0, not -1"));
  EXPECT_TRUE(ValidateCompareOptions({0, 0}).ok());
}

}  // namespace
}  // namespace tracecut::runtime
