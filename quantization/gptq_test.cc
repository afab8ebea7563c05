#include "quantization/gptq.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "quantization/quantize.h"
#include "util/testing/status_matchers.h"

namespace tracecut::quantization {
namespace {

constexpr int64_t kIn = 256;
constexpr int64_t kOut = 96;
constexpr int64_t kTokens = 2048;

QuantScheme Scheme(int bits, bool symmetric, int64_t group_size = -1) {
  QuantScheme s;
  s.bits = bits;
  s.symmetric = symmetric;
  s.group_size = group_size;
  return s;
}

GptqOptions Options(const QuantScheme& scheme, bool act_order = false) {
  GptqOptions o;
  o.scheme = scheme;
  o.act_order = act_order;
  return o;
}

// Correlated calibration inputs X = Z * A, with A a random mixing matrix
// and per-feature magnitudes spread over ~2 orders (as LLM activations are).
struct Layer {
  at::Tensor x;  // [kTokens, kIn]
  at::Tensor w;  // [kOut, kIn]
  at::Tensor h;  // From HessianAccumulator.
};

Layer MakeLayer(uint64_t seed) {
  at::manual_seed(seed);
  Layer l;
  at::Tensor z = at::randn({kTokens, kIn});
  at::Tensor mix =
      at::randn({kIn, kIn}) / std::sqrt(double{kIn}) + 0.5 * at::eye(kIn);
  at::Tensor magnitude = at::exp(at::randn({1, kIn}));
  l.x = at::matmul(z, mix) * magnitude;
  l.w = at::randn({kOut, kIn}) * 0.02;
  HessianAccumulator acc(kIn);
  // As a pipeline sees it: batches of [batch, seq, in].
  for (int64_t b = 0; b < kTokens; b += 512) {
    absl::Status s = acc.Add(l.x.narrow(0, b, 512).reshape({4, 128, kIn}));
    EXPECT_OK(s);
  }
  l.h = acc.hessian();
  return l;
}

// ||X W^T - X Q^T||^2.
double OutputError(const at::Tensor& x, const at::Tensor& w,
                   const at::Tensor& q) {
  at::Tensor diff = (w.to(at::kDouble) - q.to(at::kDouble));
  return at::matmul(x.to(at::kDouble), diff.t()).square().sum().item<double>();
}

double RtnError(const Layer& l, const QuantScheme& scheme) {
  absl::StatusOr<RtnResult> rtn = QuantizeRtn(l.w, scheme);
  EXPECT_OK(rtn);
  return OutputError(l.x, l.w, rtn->weight);
}

GptqResult MustGptq(const at::Tensor& w, const at::Tensor& h,
                    const GptqOptions& options) {
  absl::StatusOr<GptqResult> r = GptqQuantize(w, h, options);
  EXPECT_OK(r);
  if (!r.ok()) return GptqResult();
  EXPECT_FALSE(r->fell_back_to_rtn) << r->warning;
  return *std::move(r);
}

TEST(HessianAccumulatorTest, RunningAverageOverSamples) {
  at::manual_seed(1);
  at::Tensor a = at::randn({2, 5, 8});  // 2 samples, 10 tokens.
  at::Tensor b = at::randn({3, 8});     // 1 sample, 3 tokens.
  HessianAccumulator acc(8);
  EXPECT_TRUE(at::equal(acc.hessian(), at::zeros({8, 8})));
  ASSERT_OK(acc.Add(a));
  ASSERT_OK(acc.Add(b.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_EQ(acc.num_samples(), 3);
  EXPECT_EQ(acc.num_tokens(), 13);
  at::Tensor all =
      at::cat({a.reshape({10, 8}), b.to(at::kBFloat16).to(at::kFloat)});
  at::Tensor want = 2.0 / 3.0 * at::matmul(all.t(), all);
  EXPECT_EQ(acc.hessian().scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(acc.hessian(), want, 1e-5, 1e-5));
}

// Note [Symmetric accumulation]: 1300 columns are two blocks of 650 (not
// a multiple of the tile), 4100 are eight. The updated blocks get the
// whole-matrix update's operations (compared with it at 1e-6: the same
// bits where the GEMM's summation order agrees), the lower blocks are
// their mirror images exactly, and reading the Hessian twice, or between
// Adds, changes nothing. Summing accumulators (data-parallel) alike.
TEST(HessianAccumulatorTest, SymmetricBlocksGiveTheWholeUpdate) {
  at::manual_seed(3);
  for (int64_t columns : {int64_t{1300}, int64_t{4100}}) {
    for (bool summing : {false, true}) {
      SCOPED_TRACE(columns);
      HessianAccumulator acc = summing ? HessianAccumulator::Summing(columns)
                                       : HessianAccumulator(columns);
      at::Tensor want = at::zeros({columns, columns});
      int64_t n = 0;
      for (int step = 0; step < 3; ++step) {
        at::Tensor x = at::randn({2, 64, columns});
        ASSERT_OK(acc.Add(x));
        at::Tensor flat = x.reshape({-1, columns});
        n += 2;
        if (summing) {
          want.addmm_(flat.t(), flat);
        } else {  // The whole-matrix update (gptq.cc before the blocks).
          flat = flat * std::sqrt(2.0 / static_cast<double>(n));
          want.mul_(static_cast<double>(n - 2) / static_cast<double>(n));
          want.addmm_(flat.t(), flat);
        }
        if (step == 1) {
          ASSERT_TRUE(at::equal(acc.hessian(), acc.hessian().t()));
        }
      }
      const at::Tensor& h = acc.hessian();
      EXPECT_TRUE(at::equal(h, h.t()));
      EXPECT_TRUE(at::allclose(h, want, 1e-6, 1e-6))
          << (h - want).abs().max().item<float>();
      EXPECT_TRUE(at::equal(acc.hessian(), h));
      HessianAccumulator copy = acc.Clone();
      EXPECT_TRUE(at::equal(copy.hessian(), h));
    }
  }
}

// tr(x H x^T) from the blocks on and above the diagonal: the whole
// product's value (fp64 reference) for one, two and eight blocks, a weight
// error whose Hessian has a dead column, and bad shapes refused.
TEST(SymmetricQuadraticFormTest, IsTheWholeProduct) {
  at::manual_seed(4);
  for (int64_t n : {int64_t{96}, int64_t{1300}, int64_t{4100}}) {
    SCOPED_TRACE(n);
    at::Tensor in = at::randn({256, n});
    in.select(1, 7).zero_();
    const at::Tensor h = in.t().mm(in) * (2.0 / 256);
    const at::Tensor x = at::randn({40, n}) * 0.01;
    const at::Tensor xd = x.to(at::kDouble);
    const double want = (xd.mm(h.to(at::kDouble)) * xd).sum().item<double>();
    absl::StatusOr<double> got = SymmetricQuadraticForm(x, h);
    ASSERT_OK(got.status());
    EXPECT_NEAR(*got, want, 1e-5 * want);
    absl::StatusOr<double> bf16 =
        SymmetricQuadraticForm(x.to(at::kBFloat16), h);
    ASSERT_OK(bf16.status());
    EXPECT_NEAR(*bf16, want, 1e-2 * want);
  }
  EXPECT_EQ(SymmetricQuadraticForm(at::randn({4, 8}), at::randn({7, 7}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SymmetricQuadraticForm(at::randn({8}), at::randn({8, 8})).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(HessianAccumulatorTest, HalfInputsAccumulateInFp32) {
  at::manual_seed(2);
  at::Tensor x = at::randn({64, 16}).to(at::kHalf);
  HessianAccumulator acc(16);
  ASSERT_OK(acc.Add(x));
  at::Tensor xf = x.to(at::kFloat);
  EXPECT_EQ(acc.hessian().scalar_type(), at::kFloat);
  EXPECT_TRUE(
      at::allclose(acc.hessian(), 2.0 * at::matmul(xf.t(), xf), 1e-5, 1e-4));
}

TEST(HessianAccumulatorTest, RejectsBadInputs) {
  HessianAccumulator acc(8);
  EXPECT_EQ(acc.Add(at::randn({4, 7})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Add(at::ones({4, 8}, at::kInt)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Add(at::Tensor()).code(), absl::StatusCode::kInvalidArgument);
  at::Tensor nan = at::randn({4, 8});
  nan[1][2] = std::numeric_limits<float>::quiet_NaN();
  absl::Status s = acc.Add(nan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("NaN"), std::string::npos) << s;
  // Nothing was counted, and empty inputs are a no-op.
  EXPECT_OK(acc.Add(at::randn({0, 8})));
  EXPECT_EQ(acc.num_samples(), 0);
  EXPECT_EQ(acc.num_tokens(), 0);
}

struct Case {
  const char* name;
  QuantScheme scheme;
};

class GptqVsRtnTest : public ::testing::TestWithParam<Case> {};

// The point of GPTQ: lower layer-output error than round-to-nearest.
TEST_P(GptqVsRtnTest, LowerOutputErrorThanRtn) {
  const QuantScheme& scheme = GetParam().scheme;
  Layer l = MakeLayer(/*seed=*/11);
  const double rtn = RtnError(l, scheme);
  for (bool act_order : {false, true}) {
    GptqResult r = MustGptq(l.w, l.h, Options(scheme, act_order));
    const double gptq = OutputError(l.x, l.w, r.weight);
    std::printf("%-16s act_order=%d  rtn %.6g  gptq %.6g  ratio %.3f\n",
                scheme.ToString().c_str(), act_order, rtn, gptq, gptq / rtn);
    EXPECT_LT(gptq, rtn) << scheme.ToString() << " act_order=" << act_order;
    // Every weight lies on the grid of the parameters returned with it.
    absl::StatusOr<at::Tensor> again = GptqRequantize(r, scheme);
    ASSERT_OK(again);
    EXPECT_TRUE(at::equal(*again, r.weight)) << scheme.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, GptqVsRtnTest,
    ::testing::Values(Case{"int4_channel", Scheme(4, true)},
                      Case{"int4_g128", Scheme(4, true, 128)},
                      Case{"int4_asym_g64", Scheme(4, false, 64)},
                      Case{"int8_channel", Scheme(8, true)},
                      Case{"int3_g32", Scheme(3, true, 32)}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The reported loss is the damped quadratic form of the weight change:
// with Hinv = U^T U (upper Cholesky), W - Q = Err U and U H U^T = I, so
// sum err^2 / 2 = tr((W - Q) H_damped (W - Q)^T) / 2. Checks the error
// propagation end to end, with any blocking.
TEST(GptqTest, LossIsTheDampedQuadraticForm) {
  Layer l = MakeLayer(/*seed=*/5);
  at::Tensor hd = l.h.clone();
  hd.diagonal().add_(0.01 * l.h.diagonal().mean().item<double>());
  for (int64_t block_size : {128, 7, 256}) {
    for (bool act_order : {false, true}) {
      GptqOptions o = Options(Scheme(4, true, 64), act_order);
      o.block_size = block_size;
      GptqResult r = MustGptq(l.w, l.h, o);
      at::Tensor d = (l.w - r.weight).to(at::kDouble);
      const double form =
          0.5 * at::matmul(at::matmul(d, hd.to(at::kDouble)), d.t())
                    .trace()
                    .item<double>();
      EXPECT_NEAR(r.loss, form, 2e-3 * form)
          << "block_size=" << block_size << " act_order=" << act_order;
    }
  }
}

// Lazy block updates reorganize the same arithmetic: the block size changes
// results only through fp32 rounding.
TEST(GptqTest, BlockSizeDoesNotChangeTheResult) {
  Layer l = MakeLayer(/*seed=*/6);
  GptqOptions o = Options(Scheme(4, true));
  o.block_size = 128;
  GptqResult a = MustGptq(l.w, l.h, o);
  o.block_size = 1;
  GptqResult b = MustGptq(l.w, l.h, o);
  o.block_size = 1000;
  GptqResult c = MustGptq(l.w, l.h, o);
  for (const GptqResult* other : {&b, &c}) {
    const double differ =
        (a.weight != other->weight).sum().item<double>() / a.weight.numel();
    EXPECT_LT(differ, 1e-3);
    EXPECT_NEAR(a.loss, other->loss, 1e-3 * a.loss);
  }
}

// A known property: with H = I there is nothing to compensate (Hinv is
// diagonal), so GPTQ is round-to-nearest, groups included.
TEST(GptqTest, IdentityHessianIsRtn) {
  at::manual_seed(7);
  at::Tensor w = at::randn({32, 96});
  for (const QuantScheme& scheme : {Scheme(4, true), Scheme(4, true, 32),
                                    Scheme(3, false, 16), Scheme(8, true)}) {
    for (bool act_order : {false, true}) {
      GptqResult r = MustGptq(w, at::eye(96), Options(scheme, act_order));
      absl::StatusOr<RtnResult> rtn = QuantizeRtn(w, scheme);
      ASSERT_OK(rtn);
      EXPECT_TRUE(at::allclose(r.weight, rtn->weight, 0, 1e-7))
          << scheme.ToString();
      EXPECT_TRUE(at::allclose(r.scale, rtn->params.scale, 0, 1e-9));
      EXPECT_TRUE(at::equal(r.zero_point, rtn->params.zero_point));
    }
  }
}

TEST(GptqTest, ActOrderGroupIndexIsConsistent) {
  Layer l = MakeLayer(/*seed=*/8);
  QuantScheme scheme = Scheme(4, true, 32);
  GptqResult r = MustGptq(l.w, l.h, Options(scheme, /*act_order=*/true));
  ASSERT_TRUE(r.g_idx.defined());
  EXPECT_EQ(r.g_idx.scalar_type(), at::kInt);
  ASSERT_EQ(r.g_idx.numel(), kIn);
  // Every group has exactly group_size columns ...
  EXPECT_TRUE(at::equal(at::bincount(r.g_idx.to(at::kLong)),
                        at::full({kIn / 32}, 32, at::kLong)));
  // ... and group 0 holds the columns with the largest H_ii.
  at::Tensor first = at::argsort(l.h.diagonal(), /*stable=*/true, 0,
                                 /*descending=*/true)
                         .narrow(0, 0, 32);
  EXPECT_TRUE((r.g_idx.index_select(0, first) == 0).all().item<bool>());
  // Without act_order there is no g_idx (it would be the identity).
  EXPECT_FALSE(MustGptq(l.w, l.h, Options(scheme)).g_idx.defined());
  EXPECT_FALSE(
      MustGptq(l.w, l.h, Options(Scheme(4, true), true)).g_idx.defined());
}

// Note [GPTQ in tracecut] 8: with static groups the parameters are RTN's
// (min-max of each original group before any update), there is no g_idx,
// and the result still beats RTN, with or without act order.
TEST(GptqTest, StaticGroupsUseTheOriginalGroups) {
  Layer l = MakeLayer(/*seed=*/8);
  for (const QuantScheme& scheme :
       {Scheme(4, true, 32), Scheme(4, false, 64)}) {
    absl::StatusOr<RtnResult> rtn = QuantizeRtn(l.w, scheme);
    ASSERT_OK(rtn);
    for (bool act_order : {false, true}) {
      GptqOptions o = Options(scheme, act_order);
      o.static_groups = true;
      GptqResult r = MustGptq(l.w, l.h, o);
      EXPECT_FALSE(r.g_idx.defined());
      EXPECT_TRUE(at::allclose(r.scale, rtn->params.scale, 0, 1e-9))
          << scheme.ToString();
      EXPECT_TRUE(at::equal(r.zero_point, rtn->params.zero_point));
      absl::StatusOr<at::Tensor> again = GptqRequantize(r, scheme);
      ASSERT_OK(again);
      EXPECT_TRUE(at::equal(*again, r.weight)) << scheme.ToString();
      EXPECT_LT(OutputError(l.x, l.w, r.weight), RtnError(l, scheme))
          << scheme.ToString() << " act_order=" << act_order;
    }
  }
}

TEST(GptqTest, NotPositiveDefiniteFallsBackToRtn) {
  at::manual_seed(9);
  at::Tensor w = at::randn({16, 64});
  QuantScheme scheme = Scheme(4, true, 16);
  absl::StatusOr<RtnResult> rtn = QuantizeRtn(w, scheme);
  ASSERT_OK(rtn);

  // Negative definite: damping (1% of a negative mean) cannot fix it.
  absl::StatusOr<GptqResult> r = GptqQuantize(w, -at::eye(64), Options(scheme));
  ASSERT_OK(r);
  EXPECT_TRUE(r->fell_back_to_rtn);
  EXPECT_NE(r->warning.find("not positive definite"), std::string::npos)
      << r->warning;
  EXPECT_TRUE(at::equal(r->weight, rtn->weight));

  // Indefinite with a positive mean diagonal.
  at::Tensor indefinite = at::eye(64);
  indefinite[0][1] = 5;
  indefinite[1][0] = 5;
  r = GptqQuantize(w, indefinite, Options(scheme));
  ASSERT_OK(r);
  EXPECT_TRUE(r->fell_back_to_rtn);
  EXPECT_TRUE(at::equal(r->weight, rtn->weight));

  // NaN.
  at::Tensor nan = at::eye(64);
  nan[3][4] = std::numeric_limits<float>::quiet_NaN();
  r = GptqQuantize(w, nan, Options(scheme, /*act_order=*/true));
  ASSERT_OK(r);
  EXPECT_TRUE(r->fell_back_to_rtn);
  EXPECT_NE(r->warning.find("NaN"), std::string::npos) << r->warning;
  EXPECT_TRUE(at::equal(r->weight, rtn->weight));
  EXPECT_TRUE(r->g_idx.defined());
}

TEST(GptqTest, DeadColumnsAreZeroed) {
  Layer l = MakeLayer(/*seed=*/10);
  for (int64_t c : {3, 100, 255}) l.x.select(1, c).zero_();
  HessianAccumulator acc(kIn);
  ASSERT_OK(acc.Add(l.x));
  for (bool act_order : {false, true}) {
    GptqResult r =
        MustGptq(l.w, acc.hessian(), Options(Scheme(4, true, 128), act_order));
    EXPECT_EQ(r.num_dead_columns, 3);
    for (int64_t c : {3, 100, 255}) {
      EXPECT_TRUE((r.weight.select(1, c) == 0).all().item<bool>()) << c;
    }
    EXPECT_TRUE(at::isfinite(r.weight).all().item<bool>());
    EXPECT_LT(OutputError(l.x, l.w, r.weight),
              RtnError(l, Scheme(4, true, 128)));
  }
}

TEST(GptqTest, Deterministic) {
  Layer l = MakeLayer(/*seed=*/12);
  for (bool act_order : {false, true}) {
    GptqOptions o = Options(Scheme(4, false, 64), act_order);
    GptqResult a = MustGptq(l.w, l.h, o);
    GptqResult b = MustGptq(l.w.clone(), l.h.clone(), o);
    EXPECT_TRUE(at::equal(a.weight, b.weight));
    EXPECT_TRUE(at::equal(a.scale, b.scale));
    EXPECT_TRUE(at::equal(a.zero_point, b.zero_point));
    EXPECT_EQ(a.loss, b.loss);
    if (act_order) {
      EXPECT_TRUE(at::equal(a.g_idx, b.g_idx));
    }
  }
}

TEST(GptqTest, HalfPrecisionWeightsKeepTheirDtype) {
  Layer l = MakeLayer(/*seed=*/13);
  QuantScheme scheme = Scheme(4, true, 128);
  for (at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    at::Tensor w = l.w.to(dtype);
    GptqResult r = MustGptq(w, l.h, Options(scheme));
    EXPECT_EQ(r.weight.scalar_type(), dtype);
    EXPECT_EQ(r.scale.scalar_type(), at::kFloat);
    absl::StatusOr<RtnResult> rtn = QuantizeRtn(w, scheme);
    ASSERT_OK(rtn);
    EXPECT_LT(OutputError(l.x, w, r.weight), OutputError(l.x, w, rtn->weight));
  }
}

TEST(GptqTest, BadArgumentsAreInvalidArgument) {
  at::Tensor w = at::randn({4, 8});
  GptqOptions o = Options(Scheme(4, true));
  EXPECT_EQ(GptqQuantize(w, at::eye(7), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GptqQuantize(w, at::Tensor(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GptqQuantize(at::randn({8}), at::eye(8), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.block_size = 0;
  EXPECT_EQ(GptqQuantize(w, at::eye(8), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Options(Scheme(4, true));
  o.dampening_frac = -1;
  EXPECT_EQ(GptqQuantize(w, at::eye(8), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Options(Scheme(11, true));
  EXPECT_EQ(GptqQuantize(w, at::eye(8), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tracecut::quantization
