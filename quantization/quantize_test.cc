#include "quantization/quantize.h"

#include <ATen/ATen.h>

#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "util/testing/status_matchers.h"

namespace tracecut::quantization {
namespace {

at::Tensor Rows(std::vector<std::vector<float>> rows) {
  std::vector<at::Tensor> ts;
  for (const auto& r : rows) ts.push_back(at::tensor(r, at::kFloat));
  return at::stack(ts);
}

QuantScheme Scheme(int bits, bool symmetric, int64_t group_size = -1,
                   bool per_tensor = false) {
  QuantScheme s;
  s.bits = bits;
  s.symmetric = symmetric;
  s.group_size = group_size;
  s.per_tensor = per_tensor;
  return s;
}

TEST(QuantSchemeTest, RangesAndNames) {
  EXPECT_EQ(Scheme(4, true).qmin(), -8);
  EXPECT_EQ(Scheme(4, true).qmax(), 7);
  EXPECT_EQ(Scheme(8, true).qmin(), -128);
  EXPECT_EQ(Scheme(8, true).qmax(), 127);
  EXPECT_EQ(Scheme(2, true).qmin(), -2);
  EXPECT_EQ(Scheme(4, true, 128).ToString(), "int4 sym g128");
  EXPECT_EQ(Scheme(8, false).ToString(), "int8 asym per-channel");
  EXPECT_EQ(Scheme(8, true, -1, true).ToString(), "int8 sym per-tensor");
}

TEST(QuantSchemeTest, ParseReadsWhatToStringWrites) {
  for (const QuantScheme& scheme :
       {Scheme(4, true, 128), Scheme(8, false), Scheme(8, true, -1, true),
        Scheme(3, false, 64), Scheme(2, true)}) {
    absl::StatusOr<QuantScheme> parsed = QuantScheme::Parse(scheme.ToString());
    ASSERT_TRUE(parsed.ok()) << scheme.ToString() << ": " << parsed.status();
    EXPECT_EQ(parsed->ToString(), scheme.ToString());
    EXPECT_EQ(parsed->bits, scheme.bits);
    EXPECT_EQ(parsed->symmetric, scheme.symmetric);
    EXPECT_EQ(parsed->group_size, scheme.group_size);
    EXPECT_EQ(parsed->per_tensor, scheme.per_tensor);
  }
  for (const char* bad :
       {"", "int4", "int4 sym", "int9 sym g128", "int4 both g128",
        "int4 sym g0", "int4 sym gx", "uint4 sym g128", "int4 sym g128 extra",
        "int04 sym g128"}) {
    EXPECT_EQ(QuantScheme::Parse(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(QuantSchemeTest, ValidateRejectsBadFields) {
  EXPECT_OK(Scheme(2, true).Validate());
  EXPECT_OK(Scheme(8, false, 64).Validate());
  for (const QuantScheme& bad :
       {Scheme(1, true), Scheme(9, true), Scheme(4, true, 0),
        Scheme(4, true, -2), Scheme(4, true, 128, /*per_tensor=*/true)}) {
    absl::Status s = bad.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.ToString();
  }
  EXPECT_NE(Scheme(9, true).Validate().message().find("bits"),
            std::string::npos);
  EXPECT_NE(Scheme(4, true, 0).Validate().message().find("group_size"),
            std::string::npos);
}

// Worked by hand: int4 symmetric per-channel. Row 0: max|w| = 1.75, scale =
// 1.75 / 7 = 0.25; w / scale = 3, -7, 1.5, 2.5 -> round half to even -> 3,
// -7, 2, 2. Row 1 is all zeros: scale guarded to 1, codes 0.
TEST(QuantizeTest, SymmetricInt4PerChannelByHand) {
  at::Tensor w = Rows({{0.75f, -1.75f, 0.375f, 0.625f}, {0, 0, 0, 0}});
  QuantScheme scheme = Scheme(4, true);
  absl::StatusOr<QuantParams> p = ComputeQuantParams(w, scheme);
  ASSERT_OK(p);
  EXPECT_TRUE(at::equal(p->scale, Rows({{0.25f}, {1.0f}})));
  EXPECT_EQ(p->zero_point.scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(p->zero_point, at::zeros({2, 1}, at::kInt)));

  absl::StatusOr<at::Tensor> q = Quantize(w, *p, scheme);
  ASSERT_OK(q);
  EXPECT_EQ(q->scalar_type(), at::kChar);
  EXPECT_TRUE(at::equal(
      *q, at::tensor({3, -7, 2, 2, 0, 0, 0, 0}, at::kChar).reshape({2, 4})));

  absl::StatusOr<at::Tensor> fq = FakeQuantize(w, *p, scheme);
  ASSERT_OK(fq);
  EXPECT_TRUE(
      at::equal(*fq, Rows({{0.75f, -1.75f, 0.5f, 0.5f}, {0, 0, 0, 0}})));

  absl::StatusOr<at::Tensor> dq = Dequantize(*q, *p, scheme, at::kFloat);
  ASSERT_OK(dq);
  EXPECT_TRUE(at::equal(*dq, *fq));
}

// int4 asymmetric: qmin = -8, 15 steps. Row 0: lo = 0 (range includes 0),
// hi = 3.75, scale = 0.25, zero point = round(-8 - 0) = -8, codes
// [2, 15, 4, 8] - 8. Row 1: lo = -1, hi = 2.75, scale = 0.25, zero point =
// round(-8 + 4) = -4; 0.1 / 0.25 = 0.4 rounds to 0.
TEST(QuantizeTest, AsymmetricInt4ByHand) {
  at::Tensor w = Rows({{0.5f, 3.75f, 1.0f, 2.0f}, {-1.0f, 2.75f, 0.1f, 0.0f}});
  QuantScheme scheme = Scheme(4, false);
  absl::StatusOr<QuantParams> p = ComputeQuantParams(w, scheme);
  ASSERT_OK(p);
  EXPECT_TRUE(at::equal(p->scale, Rows({{0.25f}, {0.25f}})));
  EXPECT_TRUE(
      at::equal(p->zero_point, at::tensor({-8, -4}, at::kInt).reshape({2, 1})));
  absl::StatusOr<at::Tensor> q = Quantize(w, *p, scheme);
  ASSERT_OK(q);
  EXPECT_TRUE(at::equal(
      *q,
      at::tensor({-6, 7, -4, 0, -8, 7, -4, -4}, at::kChar).reshape({2, 4})));
  absl::StatusOr<at::Tensor> fq = FakeQuantize(w, *p, scheme);
  ASSERT_OK(fq);
  EXPECT_TRUE(at::equal(
      *fq, Rows({{0.5f, 3.75f, 1.0f, 2.0f}, {-1.0f, 2.75f, 0.0f, 0.0f}})));
}

// int8 symmetric, groups of 2 over 5 columns: 3 groups, the last partial.
TEST(QuantizeTest, GroupsIncludingPartialLastGroup) {
  at::Tensor w = Rows({{1.984375f, -0.5f, 0.25f, 0.0078125f, -3.0f}});
  QuantScheme scheme = Scheme(8, true, /*group_size=*/2);
  EXPECT_EQ(NumGroups(scheme, 5), 3);
  absl::StatusOr<QuantParams> p = ComputeQuantParams(w, scheme);
  ASSERT_OK(p);
  ASSERT_EQ(p->scale.sizes(), (std::vector<int64_t>{1, 3}));
  EXPECT_FLOAT_EQ(p->scale[0][0].item<float>(), 1.0f / 64);
  EXPECT_FLOAT_EQ(p->scale[0][1].item<float>(), 0.25f / 127);
  EXPECT_FLOAT_EQ(p->scale[0][2].item<float>(), 3.0f / 127);
  absl::StatusOr<at::Tensor> q = Quantize(w, *p, scheme);
  ASSERT_OK(q);
  // 1/128 / (0.25/127) = 3.97 -> 4.
  EXPECT_TRUE(at::equal(
      *q, at::tensor({127, -32, 127, 4, -127}, at::kChar).reshape({1, 5})));
}

TEST(QuantizeTest, PerTensorHasOneScale) {
  at::Tensor w = Rows({{1.0f, -2.0f}, {0.5f, 4.0f}});
  QuantScheme scheme = Scheme(8, true, -1, /*per_tensor=*/true);
  absl::StatusOr<QuantParams> p = ComputeQuantParams(w, scheme);
  ASSERT_OK(p);
  ASSERT_EQ(p->scale.sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_FLOAT_EQ(p->scale.item<float>(), 4.0f / 127);
  absl::StatusOr<at::Tensor> q = Quantize(w, *p, scheme);
  ASSERT_OK(q);
  EXPECT_TRUE(
      at::equal(*q, at::tensor({32, -64, 16, 127}, at::kChar).reshape({2, 2})));
}

TEST(QuantizeTest, CodesAreClampedToTheRange) {
  QuantScheme scheme = Scheme(4, true);
  QuantParams p{Rows({{0.25f}}), at::zeros({1, 1}, at::kInt)};
  absl::StatusOr<at::Tensor> q = Quantize(Rows({{10.0f, -10.0f}}), p, scheme);
  ASSERT_OK(q);
  EXPECT_TRUE(at::equal(*q, at::tensor({7, -8}, at::kChar).reshape({1, 2})));
}

TEST(QuantizeTest, RtnKeepsHalfAndBfloat16) {
  at::Tensor w32 = at::randn({16, 64}, at::TensorOptions().dtype(at::kFloat));
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16, at::kDouble}) {
    at::Tensor w = w32.to(dtype);
    absl::StatusOr<RtnResult> r = QuantizeRtn(w, Scheme(4, true, 32));
    ASSERT_OK(r);
    EXPECT_EQ(r->weight.scalar_type(), dtype);
    EXPECT_EQ(r->params.scale.scalar_type(), at::kFloat);
    // The arithmetic is fp32; only the result is cast back.
    absl::StatusOr<at::Tensor> fp32 =
        FakeQuantize(w.to(at::kFloat), r->params, Scheme(4, true, 32));
    ASSERT_OK(fp32);
    EXPECT_TRUE(at::equal(r->weight, fp32->to(dtype)));
  }
}

TEST(QuantizeTest, QuantizeThenDequantizeIsFakeQuantize) {
  at::manual_seed(3);
  at::Tensor w = at::randn({8, 40});
  for (const QuantScheme& scheme :
       {Scheme(4, true, 16), Scheme(3, false, 16), Scheme(8, false),
        Scheme(2, true, -1, true)}) {
    absl::StatusOr<QuantParams> p = ComputeQuantParams(w, scheme);
    ASSERT_OK(p);
    absl::StatusOr<at::Tensor> q = Quantize(w, *p, scheme);
    ASSERT_OK(q);
    EXPECT_GE(q->min().item<int>(), scheme.qmin()) << scheme.ToString();
    EXPECT_LE(q->max().item<int>(), scheme.qmax()) << scheme.ToString();
    absl::StatusOr<at::Tensor> dq = Dequantize(*q, *p, scheme, at::kFloat);
    ASSERT_OK(dq);
    absl::StatusOr<at::Tensor> fq = FakeQuantize(w, *p, scheme);
    ASSERT_OK(fq);
    EXPECT_TRUE(at::equal(*dq, *fq)) << scheme.ToString();
  }
}

TEST(QuantizeTest, BadInputsAreStatusesNotExceptions) {
  QuantScheme scheme = Scheme(4, true);
  EXPECT_EQ(ComputeQuantParams(at::randn({4}), scheme).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ComputeQuantParams(at::ones({2, 2}, at::kInt), scheme).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeQuantParams(at::randn({0, 4}), scheme).status().code(),
            absl::StatusCode::kInvalidArgument);
  at::Tensor nan = at::randn({2, 2});
  nan[0][1] = std::numeric_limits<float>::quiet_NaN();
  absl::Status s = ComputeQuantParams(nan, scheme).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("NaN"), std::string::npos) << s;
  EXPECT_EQ(
      ComputeQuantParams(at::randn({2, 2}), Scheme(12, true)).status().code(),
      absl::StatusCode::kInvalidArgument);

  // Parameters of the wrong shape.
  QuantParams wrong{at::ones({3, 1}), at::zeros({3, 1}, at::kInt)};
  s = FakeQuantize(at::randn({2, 4}), wrong, scheme).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[2, 1]"), std::string::npos) << s;
  EXPECT_EQ(
      Dequantize(at::randn({2, 4}), wrong, scheme, at::kFloat).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tracecut::quantization
