#include "quantization/int_codes.h"

#include <ATen/ATen.h>

#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantization/compressors.h"
#include "quantization/fake_quant.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "util/testing/status_matchers.h"

namespace tracecut::quantization {
namespace {

using util::testing::IsOk;

QuantizationArgs Args(int bits, bool symmetric, Strategy strategy,
                      int64_t group) {
  QuantizationArgs a;
  a.num_bits = bits;
  a.symmetric = symmetric;
  a.strategy = strategy;
  if (strategy == Strategy::kGroup) a.group_size = group;
  EXPECT_THAT(a.Resolve("weights"), IsOk());
  return a;
}

// A weight mostly on its grid (as GPTQ leaves it) with some values off it,
// round-half ties included (values exactly between two grid points).
at::Tensor OnTheGridMostly(const at::Tensor& w, const QParams& q,
                           const QuantizationArgs& args) {
  absl::StatusOr<at::Tensor> grid = FakeQuantize(w, q, args);
  EXPECT_THAT(grid, IsOk());
  at::Tensor off = at::rand(w.sizes()) < 0.05;
  return at::where(off, w, grid->to(w.scalar_type())).contiguous();
}

// Both kernels against the tensor path they replace, on every combination
// of weight, scale and dequantization-scale dtype, for group, channel and
// tensor strategies, symmetric and not, 2 to 8 bits: the same words and the
// same count.
TEST(IntCodes, SameBitsAsTheTensorPath) {
  at::manual_seed(0);
  const std::vector<c10::ScalarType> dtypes = {at::kFloat, at::kBFloat16,
                                               at::kHalf};
  struct Case {
    int bits;
    bool symmetric;
    Strategy strategy;
    int64_t group;
  };
  const std::vector<Case> cases = {
      {4, true, Strategy::kGroup, 32},
      {4, false, Strategy::kGroup, 64},
      {8, true, Strategy::kChannel, 0},
      {8, false, Strategy::kChannel, 0},
      {2, true, Strategy::kGroup, 16},
      {8, true, Strategy::kTensor, 0},
      {4, false, Strategy::kTensor, 0},
      {3, true, Strategy::kGroup, 32},
      // Groups of 4 fill half a 4-bit word: each word is built in two.
      {4, true, Strategy::kGroup, 4}};
  int compared = 0;
  for (const Case& c : cases) {
    const QuantizationArgs args =
        Args(c.bits, c.symmetric, c.strategy, c.group);
    for (c10::ScalarType wt : dtypes) {
      for (c10::ScalarType st : dtypes) {
        SCOPED_TRACE(absl::StrCat(args.ToString(), " weight ",
                                  c10::toString(wt), " scale ",
                                  c10::toString(st)));
        at::Tensor w0 = (at::randn({24, 128}) * 0.05).to(wt);
        absl::StatusOr<QParams> qp = WeightQParams(w0, args);
        ASSERT_THAT(qp, IsOk());
        QParams q = *qp;
        q.scale = q.scale.to(st);
        const at::Tensor w = OnTheGridMostly(w0, q, args);

        absl::StatusOr<std::optional<at::Tensor>> packed =
            PackedIntCodes(w, q, args);
        ASSERT_THAT(packed, IsOk());
        if (c.bits == 3) {
          EXPECT_FALSE(packed->has_value());  // Words would straddle.
        } else {
          ASSERT_TRUE(packed->has_value());
          absl::StatusOr<at::Tensor> codes = Quantize(w, q, args, at::kChar);
          ASSERT_THAT(codes, IsOk());
          absl::StatusOr<at::Tensor> want = PackToInt32(*codes, c.bits);
          ASSERT_THAT(want, IsOk());
          EXPECT_TRUE((*packed)->equal(want->contiguous()));
        }

        for (c10::ScalarType rt : dtypes) {
          SCOPED_TRACE(absl::StrCat("dequantized in ", c10::toString(rt)));
          const at::Tensor real = q.scale.to(rt);
          absl::StatusOr<std::optional<int64_t>> off =
              CountOffGrid(w, q, real, args);
          ASSERT_THAT(off, IsOk());
          ASSERT_TRUE(off->has_value());
          absl::StatusOr<at::Tensor> codes = Quantize(w, q, args);
          ASSERT_THAT(codes, IsOk());
          absl::StatusOr<at::Tensor> again =
              Dequantize(*codes, {real, q.zero_point, {}}, args);
          ASSERT_THAT(again, IsOk());
          const int64_t want = again->to(wt).ne(w).sum().item<int64_t>();
          EXPECT_EQ(**off, want);
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 9 * 27);
}

// Where the kernels do not apply they say so, and the caller's tensor path
// runs (and reports a NaN as it always did).
TEST(IntCodes, DeclinesWhatTheTensorPathHandles) {
  const QuantizationArgs args = Args(4, true, Strategy::kGroup, 32);
  const at::Tensor w = at::randn({8, 64});
  absl::StatusOr<QParams> q = WeightQParams(w, args);
  ASSERT_THAT(q, IsOk());
  auto declined = [&](const at::Tensor& x, const QParams& p,
                      const QuantizationArgs& a) {
    absl::StatusOr<std::optional<at::Tensor>> packed = PackedIntCodes(x, p, a);
    absl::StatusOr<std::optional<int64_t>> off = CountOffGrid(x, p, p.scale, a);
    return packed.ok() && !packed->has_value() && off.ok() && !off->has_value();
  };
  EXPECT_FALSE(declined(w, *q, args));
  at::Tensor nan = w.clone();
  nan[3][5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(declined(nan, *q, args));
  EXPECT_TRUE(declined(w.t().contiguous().t(), *q, args));  // Not contiguous.
  EXPECT_TRUE(declined(w.to(at::kDouble), *q, args));
  QParams zero = *q;
  zero.scale = zero.scale.clone();
  zero.scale[0][0] = 0;
  EXPECT_TRUE(declined(w, zero, args));
  QParams global = *q;
  global.global_scale = at::ones({1});
  EXPECT_TRUE(declined(w, global, args));
  QuantizationArgs fp8;
  fp8.type = QuantType::kFloat;
  fp8.strategy = Strategy::kChannel;
  ASSERT_THAT(fp8.Resolve("weights"), IsOk());
  absl::StatusOr<QParams> fq = WeightQParams(w, fp8);
  ASSERT_THAT(fq, IsOk());
  EXPECT_TRUE(declined(w, *fq, fp8));
}

}  // namespace
}  // namespace tracecut::quantization
