#include "quantization/gptq_typed.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantization/fake_quant.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "util/testing/status_matchers.h"

// Bit-exactness against llm-compressor's GPTQ is
// //tests/quantization:ct_conformance_test.

namespace tracecut::quantization {
namespace {

using ::testing::HasSubstr;
using util::testing::IsOk;
using util::testing::StatusIs;

QuantizationArgs Weights(const char* preset) {
  absl::StatusOr<QuantizationScheme> s = PresetScheme(preset, {"Linear"});
  EXPECT_THAT(s, IsOk());
  QuantizationArgs a = *s->weights;
  if (a.group_size == 128) a.group_size = 32;
  return a;
}

// tr((W - Q) H (W - Q)^T): the output error GPTQ minimizes.
double OutputError(const at::Tensor& w, const at::Tensor& q,
                   const at::Tensor& h) {
  at::Tensor d = (w - q).to(at::kDouble);
  return (d.mm(h.to(at::kDouble)) * d).sum().item<double>();
}

TEST(TypedGptq, BeatsRoundToNearestOnCorrelatedInputsAndStaysOnTheGrid) {
  at::manual_seed(0);
  for (const char* preset :
       {"W4A16", "W4A16_ASYM", "FP8_DYNAMIC", "NVFP4A16", "MXFP4A16"}) {
    SCOPED_TRACE(preset);
    const QuantizationArgs args = Weights(preset);
    at::Tensor w = at::randn({32, 64}) * 0.05;
    at::Tensor x =
        at::randn({256, 64}).mm(at::randn({64, 64}) * 0.3 + at::eye(64));
    at::Tensor h = x.t().mm(x) * (2.0 / 256);
    absl::StatusOr<QParams> q = WeightQParams(w, args);
    ASSERT_THAT(q, IsOk());
    absl::StatusOr<TypedGptqResult> r = TypedGptq(w, h, *q, args, {});
    ASSERT_THAT(r, IsOk());
    EXPECT_FALSE(r->fell_back_to_rtn);
    absl::StatusOr<at::Tensor> rtn = FakeQuantize(w, *q, args);
    ASSERT_THAT(rtn, IsOk());
    EXPECT_LT(OutputError(w, r->weight, h), OutputError(w, *rtn, h));
    absl::StatusOr<at::Tensor> again = FakeQuantize(r->weight, *q, args);
    ASSERT_THAT(again, IsOk());
    EXPECT_TRUE(again->equal(r->weight));
  }
}

TEST(TypedGptq, WithoutCorrelationItIsRoundToNearest) {
  at::manual_seed(1);
  const QuantizationArgs args = Weights("W4A16");
  at::Tensor w = at::randn({16, 64});
  absl::StatusOr<QParams> q = WeightQParams(w, args);
  ASSERT_THAT(q, IsOk());
  absl::StatusOr<TypedGptqResult> r =
      TypedGptq(w, at::eye(64) * 3, *q, args, {});
  ASSERT_THAT(r, IsOk());
  absl::StatusOr<at::Tensor> rtn = FakeQuantize(w, *q, args);
  ASSERT_THAT(rtn, IsOk());
  EXPECT_TRUE(r->weight.equal(*rtn));
}

TEST(TypedGptq, AnIndefiniteHessianFallsBackAndBadShapesAreRefused) {
  const QuantizationArgs args = Weights("FP8_DYNAMIC");
  at::Tensor w = at::randn({4, 8});
  absl::StatusOr<QParams> q = WeightQParams(w, args);
  ASSERT_THAT(q, IsOk());
  absl::StatusOr<TypedGptqResult> r = TypedGptq(w, -at::eye(8), *q, args, {});
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->fell_back_to_rtn);
  EXPECT_THAT(r->warning, HasSubstr("not positive definite"));
  EXPECT_FALSE(r->row_output_errors.defined());
  EXPECT_THAT(TypedGptq(w, at::eye(7), *q, args, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("Hessian [in, in]")));
}

// Note [Factor without ATen's wrappers]: the factor is the bits of ATen's
// linalg_cholesky(cholesky_inverse(linalg_cholesky(H')), upper) on the
// damped Hessian, for sizes that are not multiples of the tiles, with a
// dead column; an indefinite Hessian falls back to round-to-nearest.
TEST(FactorizeHessian, SameBitsAsAtensCalls) {
  at::manual_seed(5);
  for (int64_t n : {int64_t{1}, int64_t{70}, int64_t{300}, int64_t{1000}}) {
    for (ActOrder order : {ActOrder::kNone, ActOrder::kWeight}) {
      SCOPED_TRACE(
          absl::StrCat(n, order == ActOrder::kNone ? "" : " act order"));
      at::Tensor x = at::randn({2 * n + 8, n});
      if (n > 1) x.select(1, n / 2).zero_();
      // Not exactly symmetric (mm's rounding): the factor reads the lower
      // triangle, as ATen's does.
      const at::Tensor h = x.t().mm(x) * (2.0 / x.size(0));
      absl::StatusOr<HessianFactor> f = FactorizeHessian(h, order, 0.01);
      ASSERT_THAT(f, IsOk());
      ASSERT_FALSE(f->fell_back_to_rtn);
      at::Tensor damped = h.clone();
      if (order != ActOrder::kNone) {  // apply_activation_ordering's gathers.
        const at::Tensor perm = at::argsort(at::diag(h).unsqueeze(0), -1,
                                            /*descending=*/true);
        ASSERT_TRUE(f->perm.defined());
        EXPECT_TRUE(at::equal(f->perm, perm));
        damped = at::gather(damped.unsqueeze(0), -1,
                            perm.unsqueeze(-2).expand({-1, n, -1}));
        damped =
            at::gather(damped, -2, perm.unsqueeze(-1).expand({-1, -1, n}))[0]
                .clone();
      }
      at::Tensor diag = at::diagonal(damped);
      diag.masked_fill_(diag == 0, 1.0);
      diag.add_(at::mean(at::diag(damped)) * 0.01);
      const at::Tensor want = at::linalg_cholesky(
          at::cholesky_inverse(at::linalg_cholesky(damped)), /*upper=*/true);
      EXPECT_TRUE(at::equal(f->hinv[0], want));
    }
  }
  absl::StatusOr<HessianFactor> f =
      FactorizeHessian(-at::eye(100), ActOrder::kNone, 0.01);
  ASSERT_THAT(f, IsOk());
  EXPECT_TRUE(f->fell_back_to_rtn);
  EXPECT_TRUE(at::equal(f->hinv[0], at::eye(100)));
}

// Note [Output error from the errors]: the per-row errors add up to the
// product tr((W - Q) H (W - Q)^T) GPTQ minimizes, also with a dead column,
// act order, and a singular Hessian (fewer tokens than columns, where the
// damping term is largest against the error).
TEST(TypedGptq, OutputErrorFromItsOwnErrorsIsTheProduct) {
  at::manual_seed(3);
  for (const char* preset :
       {"W4A16", "W4A16_ASYM", "FP8_DYNAMIC", "NVFP4A16"}) {
    for (int64_t tokens : {400, 48}) {
      for (bool act_order : {false, true}) {
        SCOPED_TRACE(absl::StrCat(preset, " tokens ", tokens,
                                  act_order ? " act order" : ""));
        QuantizationArgs args = Weights(preset);
        if (act_order) args.actorder = ActOrder::kWeight;
        at::Tensor w = at::randn({24, 64}) * 0.05;
        at::Tensor x =
            at::randn({tokens, 64}).mm(at::randn({64, 64}) * 0.4 + at::eye(64));
        x.select(1, 9).zero_();
        at::Tensor h = x.t().mm(x) * (2.0 / tokens);
        absl::StatusOr<QParams> q = WeightQParams(w, args);
        ASSERT_THAT(q, IsOk());
        absl::StatusOr<TypedGptqResult> r = TypedGptq(w, h, *q, args, {});
        ASSERT_THAT(r, IsOk());
        ASSERT_TRUE(r->row_output_errors.defined());
        const double want = OutputError(w, r->weight, h);
        const double got = r->row_output_errors.sum().item<double>();
        EXPECT_GT(want, 0);
        EXPECT_NEAR(got, want, 1e-5 * want);
      }
    }
  }
}

// The integer schemes' row kernel against the tensor loop it replaces: the
// same bits for every weight, loss and row loss, with scales in fp32, bf16
// and fp16, asymmetric zero points, act order, dead columns, a block size
// that does not divide the columns, and stacked rows (53: groups of 16
// rows and rows after them, with any thread count).
TEST(TypedGptq, RowKernelGivesTheTensorLoopsBits) {
  at::manual_seed(2);
  for (const char* preset : {"W4A16", "W4A16_ASYM", "W8A16", "W8A8"}) {
    for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (bool act_order : {false, true}) {
        SCOPED_TRACE(absl::StrCat(preset, " ", c10::toString(dtype),
                                  act_order ? " act order" : ""));
        QuantizationArgs args = Weights(preset);
        if (act_order) args.actorder = ActOrder::kWeight;
        at::Tensor w = (at::randn({53, 96}) * 0.05).to(dtype);
        at::Tensor x =
            at::randn({300, 96}).mm(at::randn({96, 96}) * 0.4 + at::eye(96));
        x.select(1, 5).zero_();  // A dead column.
        at::Tensor h = x.t().mm(x) * (2.0 / 300);
        absl::StatusOr<QParams> q = WeightQParams(w, args);
        ASSERT_THAT(q, IsOk());
        TypedGptqOptions rows, tensors;
        rows.block_size = tensors.block_size = 40;
        tensors.row_kernel = false;
        absl::StatusOr<TypedGptqResult> a = TypedGptq(w, h, *q, args, rows);
        absl::StatusOr<TypedGptqResult> b = TypedGptq(w, h, *q, args, tensors);
        ASSERT_THAT(a, IsOk());
        ASSERT_THAT(b, IsOk());
        EXPECT_TRUE(a->weight.equal(b->weight));
        EXPECT_TRUE(a->row_losses.equal(b->row_losses));
        EXPECT_EQ(a->loss, b->loss);
        // Not vacuous: GPTQ moved weights off round-to-nearest.
        absl::StatusOr<at::Tensor> rtn = FakeQuantize(w, *q, args);
        ASSERT_THAT(rtn, IsOk());
        EXPECT_FALSE(a->weight.equal(*rtn));
      }
    }
  }
}

}  // namespace
}  // namespace tracecut::quantization
