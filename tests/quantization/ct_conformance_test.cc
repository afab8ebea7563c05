// tracecut's quantization numerics against compressed-tensors' and
// llm-compressor's own, bit for bit (make_ct_reference.py computes theirs):
// scales, zero points, global scales, fake-quantized values and stored codes
// of every preset's weights on random tensors with edge cases (all-zero
// groups, a huge outlier, subnormals, bf16/fp16, exact rounding ties), with
// the minmax and mse observers, and dynamic / static activations; the
// format compressed-tensors infers for each scheme and the tensors its
// compressor stores (packed int32 / fp4, fp8, e8m0 scales); GPTQ's result
// for every weight type and strategy (llm-compressor's quantize_weight).
// Also: every
// preset's JSON equals compressed-tensors' model_dump, and a
// quantization_config round-trips.

#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantization/compressors.h"
#include "quantization/fake_quant.h"
#include "quantization/gptq_typed.h"
#include "quantization/observers.h"
#include "quantization/quant_args.h"
#include "util/json.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"

namespace tracecut::quantization {
namespace {

using util::testing::IsOk;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

util::Json LoadJson(const std::string& name) {
  const std::string path = util::testing::Runfile("tests/quantization/" + name);
  absl::StatusOr<util::Json> j = util::ParseJson(ReadFile(path), name);
  EXPECT_THAT(j, IsOk());
  return j.ok() ? *j : util::Json();
}

// Same dtype and shape, and every element's bits equal (so -0.0 != +0.0).
// Returns the number of differing elements (all of them on dtype/shape
// mismatch) and describes the first difference in `why`.
int64_t Mismatches(const at::Tensor& ours, const at::Tensor& theirs,
                   std::string* why) {
  if (ours.scalar_type() != theirs.scalar_type() ||
      !ours.sizes().equals(theirs.sizes())) {
    *why = absl::StrCat("ours ", c10::toString(ours.scalar_type()), " ",
                        c10::str(ours.sizes()), " vs theirs ",
                        c10::toString(theirs.scalar_type()), " ",
                        c10::str(theirs.sizes()));
    return theirs.numel();
  }
  const at::ScalarType bits_type = [&] {
    switch (ours.element_size()) {
      case 1:
        return at::kByte;
      case 2:
        return at::kShort;
      case 4:
        return at::kInt;
      default:
        return at::kLong;
    }
  }();
  at::Tensor a = ours.contiguous().view(bits_type).flatten();
  at::Tensor b = theirs.contiguous().view(bits_type).flatten();
  at::Tensor diff = a.ne(b);
  const int64_t n = diff.sum().item<int64_t>();
  if (n > 0) {
    const int64_t i = diff.nonzero()[0][0].item<int64_t>();
    *why = absl::StrCat("first at flat index ", i, ": ours ",
                        ours.flatten()[i].to(at::kDouble).item<double>(),
                        " theirs ",
                        theirs.flatten()[i].to(at::kDouble).item<double>());
  }
  return n;
}

class CtConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Matmuls and reductions split work by thread; the reference ran on one.
    at::set_num_threads(1);
    auto file = checkpoint::SafetensorsFile::Open(
        util::testing::Runfile("tests/quantization/ct_reference.safetensors"));
    ASSERT_THAT(file, IsOk());
    file_ = new std::shared_ptr<const checkpoint::SafetensorsFile>(*file);
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }

  static at::Tensor Get(const util::Json& key) {
    absl::StatusOr<at::Tensor> t = (*file_)->Get(key.get<std::string>());
    EXPECT_THAT(t, IsOk());
    return t.ok() ? *t : at::Tensor();
  }

  // Compares one output; records mismatches per output kind.
  void Check(const std::string& name, const std::string& what,
             const at::Tensor& ours, const util::Json& key) {
    if (key.is_null()) return;
    at::Tensor theirs = Get(key);
    std::string why;
    const int64_t n = Mismatches(ours, theirs, &why);
    total_[what] += theirs.numel();
    mismatched_[what] += n;
    EXPECT_EQ(n, 0) << name << " " << what << ": " << n << " of "
                    << theirs.numel() << " differ; " << why;
  }

  void Report() {
    for (const auto& [what, total] : total_) {
      std::cout << what << ": " << mismatched_[what] << " / " << total
                << (what == "gptq off grid"
                        ? " GPTQ values re-quantize to a neighbour\n"
                        : " elements differ from compressed-tensors\n");
    }
  }

  static std::shared_ptr<const checkpoint::SafetensorsFile>* file_;
  std::map<std::string, int64_t> total_, mismatched_;  // By output kind.
};

std::shared_ptr<const checkpoint::SafetensorsFile>* CtConformance::file_ =
    nullptr;

TEST_F(CtConformance, EveryCaseBitExact) {
  const util::Json cases = LoadJson("ct_cases.json");
  ASSERT_TRUE(cases.is_array());
  ASSERT_GT(cases.size(), 100u);
  for (const util::Json& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    absl::StatusOr<QuantizationArgs> args =
        QuantizationArgs::FromJson(c["args"], name);
    ASSERT_THAT(args, IsOk());
    // compressed-tensors' dump of the args is what we write back.
    EXPECT_EQ(args->ToJson(), c["args"]);
    const std::string kind = c["kind"].get<std::string>();
    if (kind == "weight") {
      at::Tensor w = Get(c["input"]);
      absl::StatusOr<QParams> q = WeightQParams(w, *args);
      ASSERT_THAT(q, IsOk());
      Check(name, "scale", q->scale, c["scale"]);
      Check(name, "zero_point", q->zero_point, c["zero_point"]);
      if (!c["global_scale"].is_null()) {
        Check(name, "global_scale", q->global_scale, c["global_scale"]);
      }
      // Fake-quantize and quantize with compressed-tensors' own parameters,
      // so a parameter difference does not hide (or cause) one here.
      QParams theirs{
          Get(c["scale"]), Get(c["zero_point"]),
          c["global_scale"].is_null() ? at::Tensor() : Get(c["global_scale"])};
      absl::StatusOr<at::Tensor> fake = FakeQuantize(w, theirs, *args);
      ASSERT_THAT(fake, IsOk());
      Check(name, "fake_quantize", *fake, c["fake"]);
      std::optional<c10::ScalarType> dtype;
      if (!args->is_fp4()) dtype = args->storage_dtype();
      absl::StatusOr<at::Tensor> codes = Quantize(w, theirs, *args, dtype);
      ASSERT_THAT(codes, IsOk());
      Check(name, "quantize", *codes, c["codes"]);
      // The format compressed-tensors infers, and what its compressor
      // stores.
      absl::StatusOr<QuantizationScheme> scheme =
          QuantizationScheme::FromJson(c["scheme"], name);
      ASSERT_THAT(scheme, IsOk());
      const CompressionFormat format = InferFormat(*scheme);
      EXPECT_EQ(FormatName(format), c["format"].get<std::string>());
      absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> stored =
          CompressWeight(w, theirs, *scheme, format);
      ASSERT_THAT(stored, IsOk());
      std::set<std::string> names;
      for (const auto& [key, tensor] : *stored) {
        names.insert(key);
        ASSERT_TRUE(c["compressed"].contains(key)) << key;
        Check(name, absl::StrCat("compressed ", key), tensor,
              c["compressed"][key]);
      }
      EXPECT_EQ(names.size(), c["compressed"].size());
    } else if (kind == "gptq") {
      at::Tensor w = Get(c["input"]);
      absl::StatusOr<QParams> q = WeightQParams(w, *args);
      ASSERT_THAT(q, IsOk());
      absl::StatusOr<TypedGptqResult> r =
          TypedGptq(w, Get(c["hessian"]), *q, *args, TypedGptqOptions{});
      ASSERT_THAT(r, IsOk());
      Check(name, "gptq", r->weight, c["result"]);
      const double loss = c["loss"].get<double>();
      EXPECT_NEAR(r->loss, loss, 1e-6 * loss) << name;
      EXPECT_EQ(r->fell_back_to_rtn, c["fallback"].get<bool>()) << name;
      // GPTQ's result lies on the scheme's grid, except where a bf16 int8
      // value re-quantizes to its neighbour (llm-compressor's result too;
      // its compressor stores the re-quantized code).
      absl::StatusOr<at::Tensor> again = FakeQuantize(r->weight, *q, *args);
      ASSERT_THAT(again, IsOk());
      const int64_t off = again->to(r->weight.scalar_type())
                              .ne(r->weight)
                              .sum()
                              .item<int64_t>();  // By value: -0 == +0.
      total_["gptq off grid"] += r->weight.numel();
      mismatched_["gptq off grid"] += off;
      EXPECT_LE(off, r->weight.numel() / 100) << name;
    } else if (kind == "dynamic_act") {
      at::Tensor x = Get(c["input"][0]);
      at::Tensor gs =
          c["global_scale"].is_null() ? at::Tensor() : Get(c["global_scale"]);
      absl::StatusOr<QParams> q = DynamicQParams(x, *args, gs);
      ASSERT_THAT(q, IsOk());
      Check(name, "act_scale", q->scale, c["scale"]);
      Check(name, "act_zero_point", q->zero_point, c["zero_point"]);
      absl::StatusOr<at::Tensor> fake = FakeQuantize(x, *q, *args);
      ASSERT_THAT(fake, IsOk());
      Check(name, "act_fake_quantize", *fake, c["fake"]);
    } else {
      ASSERT_EQ(kind, "static_act");
      absl::StatusOr<ActivationObserver> observer =
          ActivationObserver::Create(*args);
      ASSERT_THAT(observer, IsOk());
      at::Tensor first;
      for (const util::Json& key : c["input"]) {
        at::Tensor x = Get(key);
        if (!first.defined()) first = x;
        ASSERT_THAT(observer->Observe(x), IsOk());
      }
      absl::StatusOr<QParams> q = observer->Finish(first.scalar_type());
      ASSERT_THAT(q, IsOk());
      if (!c["global_scale"].is_null()) {
        Check(name, "act_global_scale", q->global_scale, c["global_scale"]);
      }
      if (!c["scale"].is_null()) {
        Check(name, "act_scale", q->scale, c["scale"]);
        Check(name, "act_zero_point", q->zero_point, c["zero_point"]);
        absl::StatusOr<at::Tensor> fake = FakeQuantize(first, *q, *args);
        ASSERT_THAT(fake, IsOk());
        Check(name, "act_fake_quantize", *fake, c["fake"]);
      }
    }
  }
  Report();
}

TEST(CtPresets, EveryPresetIsCompressedTensorsOwn) {
  const util::Json presets = LoadJson("presets.json");
  std::vector<std::string> order;
  for (const util::Json& n : presets["order"])
    order.push_back(n.get<std::string>());
  EXPECT_EQ(PresetNames(), order);
  for (const std::string& name : order) {
    SCOPED_TRACE(name);
    absl::StatusOr<QuantizationScheme> ours = PresetScheme(name, {"Linear"});
    ASSERT_THAT(ours, IsOk());
    EXPECT_EQ(ours->ToJson(), presets["presets"][name]);
    absl::StatusOr<QuantizationScheme> parsed =
        QuantizationScheme::FromJson(presets["presets"][name], name);
    ASSERT_THAT(parsed, IsOk());
    EXPECT_TRUE(*parsed == *ours);
  }
}

TEST(CtPresets, QuantizationConfigRoundTrips) {
  const util::Json config = LoadJson("presets.json")["config"];
  absl::StatusOr<QuantizationConfig> parsed =
      QuantizationConfig::FromJson(config, "quantization_config");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->ToJson(), config);
  ASSERT_EQ(parsed->config_groups.size(), 2u);
  EXPECT_EQ(parsed->config_groups[1].second.weights->actorder,
            ActOrder::kStatic);
  EXPECT_EQ(parsed->ignore,
            (std::vector<std::string>{"lm_head", "re:.*router"}));
}

}  // namespace
}  // namespace tracecut::quantization
