#include "pipelines/calibration_data.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {
namespace {

using ::tracecut::util::testing::Runfile;
using ::tracecut::util::testing::StatusIs;

std::string TestData(const std::string& name) {
  return Runfile(absl::StrCat("pipelines/testdata/", name));
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = absl::StrCat(testing::TempDir(), "/", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// What make_token_files.py writes, for comparison.
at::Tensor ExpectedIds() {
  absl::StatusOr<at::Tensor> t = LoadTokenFile(TestData("tokens_tensor.pt"));
  EXPECT_OK(t);
  return *t;
}

TEST(CalibrationDataTest, ReadsPythonTorchSaveTensor) {
  at::Tensor ids = ExpectedIds();
  EXPECT_EQ(ids.sizes(), at::IntArrayRef({6, 16}));
  EXPECT_EQ(ids.scalar_type(), at::kLong);
  EXPECT_TRUE(ids.ge(0).all().item<bool>());
  EXPECT_TRUE(ids.lt(256).all().item<bool>());
}

TEST(CalibrationDataTest, ReadsListOfDictsAndDictOfLists) {
  at::Tensor ids = ExpectedIds();
  for (const char* name :
       {"tokens_dicts.pt", "tokens_lists.pt", "tokens_single_key.pt"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<at::Tensor> t = LoadTokenFile(TestData(name));
    ASSERT_OK(t);
    EXPECT_TRUE(at::equal(*t, ids));
  }
}

TEST(CalibrationDataTest, UnreadablePicklesGetAHint) {
  absl::StatusOr<at::Tensor> t = LoadTokenFile(TestData("tokens_set.pt"));
  ASSERT_THAT(t, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(t.status().message(), "torch.save(ids, path)"))
      << t.status();
}

TEST(CalibrationDataTest, RejectsWrongDtypeAndShape) {
  absl::StatusOr<at::Tensor> f = LoadTokenFile(TestData("tokens_float.pt"));
  ASSERT_THAT(f, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(f.status().message(), "integer tensor"))
      << f.status();
  EXPECT_TRUE(absl::StrContains(f.status().message(), "float32[6, 16]"))
      << f.status();
  absl::StatusOr<at::Tensor> d = LoadTokenFile(TestData("tokens_3d.pt"));
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::StrContains(d.status().message(), "[N, seq]"))
      << d.status();
}

TEST(CalibrationDataTest, ReadsJsonLines) {
  std::string path = WriteTemp("ok.jsonl",
                               "[1, 2, 3]\n"
                               "\n"
                               "{\"input_ids\": [4, 5, 6]}\n");
  absl::StatusOr<at::Tensor> t = LoadTokenFile(path);
  ASSERT_OK(t);
  EXPECT_TRUE(
      at::equal(*t, at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3})));
}

TEST(CalibrationDataTest, JsonLinesErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* expected;
  } cases[] = {
      {"[1, 2, 3]\n[1, 2]\n",
       "sample 1 has 2 tokens, but sample 0 has 3 (a tensor [N, seq] needs "
       "one length)"},
      {"[1, 2, 3]\n[1, 2.5, 3]\n", ":2: token 1 is a number"},
      {"[1, 2, 3]\n{\"ids\": [1]}\n", "without \"input_ids\""},
      {"[1, 2, 3\n", ":1:"},
      {"\n\n", "no samples"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    std::string path = WriteTemp(absl::StrCat("bad", i++, ".jsonl"), c.text);
    absl::StatusOr<at::Tensor> t = LoadTokenFile(path);
    ASSERT_FALSE(t.ok());
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.expected))
        << t.status();
  }
}

TEST(CalibrationDataTest, MissingAndEmptyFiles) {
  absl::StatusOr<at::Tensor> t = LoadTokenFile("/nonexistent/data.pt");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  t = LoadTokenFile(WriteTemp("empty.pt", ""));
  EXPECT_TRUE(absl::StrContains(t.status().message(), "empty")) << t.status();
  t = LoadTokenFile(WriteTemp("junk.pt", std::string("PK\x03\x04junk", 8)));
  EXPECT_FALSE(t.ok());
  EXPECT_TRUE(absl::StrContains(t.status().message(), "torch.save"))
      << t.status();
}

TEST(CalibrationDataTest, DirectoryIsAStatusNotAThrow) {
  // A filebuf reading a directory throws std::ios_base::failure.
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp");
  absl::StatusOr<at::Tensor> t = LoadTokenFile(dir);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(t.status().message(), "is a directory"))
      << t.status();
}

TEST(CalibrationDataTest, CheckTokensNamesTheOffendingId) {
  at::Tensor ids = at::zeros({3, 8}, at::kLong);
  ids[2][5] = 300;
  TokenLimits limits;
  limits.vocab_size = 256;
  absl::Status s = CheckTokens(ids, limits, "calib.jsonl");
  ASSERT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(
      absl::StrContains(s.message(),
                        "token id 300 at sample 2, position 5 is out of range "
                        "[0, 256)"))
      << s;
  ids[2][5] = -1;
  EXPECT_FALSE(CheckTokens(ids, limits, "x").ok());
  ids[2][5] = 255;
  EXPECT_OK(CheckTokens(ids, limits, "x"));
  limits.max_seq_len = 4;
  s = CheckTokens(ids, limits, "x");
  EXPECT_TRUE(absl::StrContains(s.message(), "max_position_embeddings 4")) << s;
  EXPECT_FALSE(CheckTokens(at::zeros({0, 4}, at::kLong), {}, "x").ok());
  EXPECT_FALSE(CheckTokens(at::zeros({2, 4}, at::kFloat), {}, "x").ok());
}

TEST(CalibrationDataTest, LengthsTheProgramIsNotValidForAreRefused) {
  TokenLimits limits;
  limits.seq_lens = {{1, 63}, {128, std::nullopt}};
  limits.program = "qwen/model.pt2";
  for (int64_t ok : {1, 63, 128, 4096}) {
    EXPECT_OK(CheckTokens(at::zeros({2, ok}, at::kLong), limits, "x")) << ok;
  }
  absl::Status s = CheckTokens(at::zeros({2, 64}, at::kLong), limits, "c.pt");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          ::testing::HasSubstr(
                              "calibration data 'c.pt': samples of 64 tokens, "
                              "but qwen/model.pt2 is valid for sequence "
                              "lengths 1-63, 128 and more only")));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("--seq-len=64"));
  // Valid at every multiple of 32 (a scan's chunk): the error lists a few.
  TokenLimits chunks;
  for (int64_t n = 32; n <= 8192; n += 32) chunks.seq_lens.push_back({n, n});
  EXPECT_OK(CheckTokens(at::zeros({1, 96}, at::kLong), chunks, "x"));
  s = CheckTokens(at::zeros({1, 100}, at::kLong), chunks, "x");
  EXPECT_THAT(s.message(),
              ::testing::HasSubstr("lengths 32, 64, 96, 128, 160, 192, 224, "
                                   "256, ... (256 ranges in all) only"));
  // Samples of different lengths: each is checked, the error names it.
  ModelInputs lm;
  lm.inputs = {{"input_ids", "int64", {2, 16}}};
  lm.limits = limits;
  absl::StatusOr<CalibrationData> d = LoadCalibrationData(
      WriteTemp("lens.jsonl", "[1, 2]\n[1, 2, 3]\n[11]\n"), lm, 1);
  ASSERT_OK(d);
  std::string long_sample = "[1";
  for (int i = 1; i < 100; ++i) absl::StrAppend(&long_sample, ", 1");
  d = LoadCalibrationData(
      WriteTemp("lens2.jsonl", "[1, 2]\n" + long_sample + "]\n"), lm, 1);
  EXPECT_THAT(d.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("samples of 100 tokens")));
  EXPECT_THAT(d.status().message(), ::testing::HasSubstr("(sample 1)"));
}

TEST(CalibrationDataTest, SyntheticIsDeterministic) {
  absl::StatusOr<at::Tensor> a = SyntheticTokens(4, 16, 100, 9);
  absl::StatusOr<at::Tensor> b = SyntheticTokens(4, 16, 100, 9);
  absl::StatusOr<at::Tensor> c = SyntheticTokens(4, 16, 100, 10);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(at::equal(*a, *b));
  EXPECT_FALSE(at::equal(*a, *c));
  EXPECT_TRUE(a->lt(100).all().item<bool>());
  EXPECT_FALSE(SyntheticTokens(0, 16, 100, 0).ok());
}

TEST(CalibrationDataTest, BatchesMakeEveryKnownInput) {
  at::Tensor ids = at::arange(5 * 4, at::kLong).view({5, 4});
  absl::StatusOr<CalibrationData> data = MakeCalibrationData(
      ids, {"input_ids", "attention_mask", "token_type_ids", "position_ids"}, 2,
      "ids");
  ASSERT_OK(data);
  ASSERT_EQ(data->batches.size(), 3u);
  EXPECT_EQ(data->batches[2][0].toTensor().size(0), 1);  // 5 = 2 + 2 + 1.
  EXPECT_TRUE(at::equal(data->batches[1][0].toTensor(), ids.narrow(0, 2, 2)));
  EXPECT_TRUE(data->batches[0][1].toTensor().eq(1).all().item<bool>());
  EXPECT_TRUE(data->batches[0][2].toTensor().eq(0).all().item<bool>());
  EXPECT_TRUE(
      at::equal(data->batches[0][3].toTensor()[1], at::arange(4, at::kLong)));
  absl::StatusOr<CalibrationData> again =
      MakeCalibrationData(ids, {"input_ids"}, 2, "ids");
  absl::StatusOr<CalibrationData> other =
      MakeCalibrationData(ids, {"input_ids"}, 3, "ids");
  EXPECT_EQ(data->fingerprint, again->fingerprint);
  EXPECT_NE(again->fingerprint, other->fingerprint);

  absl::StatusOr<CalibrationData> bad =
      MakeCalibrationData(ids, {"pixel_values"}, 2, "ids");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "pixel_values"));
  EXPECT_FALSE(MakeCalibrationData(ids, {"input_ids"}, 0, "ids").ok());
}

// --- Data for any model: tensors by input name or position. ---

ModelInputs Images() {
  ModelInputs m;
  m.inputs = {{"pixel_values", "float32", {2, 3, 8, 8}}};
  return m;
}

// An encoder-decoder over audio features, like Whisper.
ModelInputs Pair() {
  ModelInputs m;
  m.inputs = {{"input_features", "float32", {2, 4, 10}},
              {"decoder_input_ids", "int64", {2, 6}}};
  m.limits.vocab_size = 50;
  return m;
}

std::string Saved(const std::string& name, const c10::IValue& value) {
  std::vector<char> bytes = torch::jit::pickle_save(value);
  return WriteTemp(name, std::string(bytes.begin(), bytes.end()));
}

c10::IValue Dict(std::vector<std::pair<std::string, at::Tensor>> items) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  for (auto& [k, v] : items) d.insert(c10::IValue(k), c10::IValue(v));
  return d;
}

absl::Status FeatureError(const ModelInputs& m,
                          std::vector<std::pair<std::string, c10::IValue>> v) {
  absl::StatusOr<CalibrationData> d = MakeFeatureData(v, m, 2, "calib.pt");
  return d.ok() ? absl::OkStatus() : d.status();
}

TEST(FeatureDataTest, ImagesFromTorchSaveAndSafetensors) {
  absl::StatusOr<CalibrationData> pt =
      LoadCalibrationData(TestData("features_images.pt"), Images(), 2);
  ASSERT_OK(pt);
  EXPECT_EQ(pt->num_samples, 5);
  EXPECT_EQ(pt->seq_len, 0);
  EXPECT_FALSE(pt->tokens.defined());
  ASSERT_EQ(pt->batches.size(), 3u);  // 5 = 2 + 2 + 1.
  EXPECT_EQ(pt->batches[2][0].toTensor().sizes(),
            at::IntArrayRef({1, 3, 8, 8}));
  EXPECT_EQ(pt->descriptions,
            std::vector<std::string>{"pixel_values: float32[5, 3, 8, 8]"});
  absl::StatusOr<CalibrationData> st =
      LoadCalibrationData(TestData("features_images.safetensors"), Images(), 2);
  ASSERT_OK(st);
  EXPECT_TRUE(
      at::equal(pt->batches[1][0].toTensor(), st->batches[1][0].toTensor()));
  // The same data in another format is the same data for --resume.
  EXPECT_EQ(pt->fingerprint, st->fingerprint);
  absl::StatusOr<CalibrationData> other_batches =
      LoadCalibrationData(TestData("features_images.safetensors"), Images(), 3);
  ASSERT_OK(other_batches);
  EXPECT_NE(pt->fingerprint, other_batches->fingerprint);
}

TEST(FeatureDataTest, EncoderDecoderPairByNameAndPosition) {
  absl::StatusOr<CalibrationData> pt =
      LoadCalibrationData(TestData("features_pair.pt"), Pair(), 2);
  ASSERT_OK(pt);
  absl::StatusOr<CalibrationData> st =
      LoadCalibrationData(TestData("features_pair.safetensors"), Pair(), 2);
  ASSERT_OK(st);
  EXPECT_EQ(pt->fingerprint, st->fingerprint);
  EXPECT_EQ(pt->num_samples, 3);
  EXPECT_EQ(pt->seq_len, 6);
  ASSERT_EQ(pt->batches.size(), 2u);
  EXPECT_EQ(pt->input_names,
            (std::vector<std::string>{"input_features", "decoder_input_ids"}));
  at::Tensor features = pt->batches[0][0].toTensor();
  at::Tensor ids = pt->batches[0][1].toTensor();
  EXPECT_EQ(features.scalar_type(), at::kFloat);
  EXPECT_EQ(ids.scalar_type(), at::kLong);

  // By position: a tuple in the model's input order.
  std::string tuple =
      Saved("pair_tuple.pt",
            c10::ivalue::Tuple::create(
                {c10::IValue(features), c10::IValue(ids.to(at::kInt))}));
  absl::StatusOr<CalibrationData> t = LoadCalibrationData(tuple, Pair(), 2);
  ASSERT_OK(t);
  EXPECT_EQ(t->num_samples, 2);
  EXPECT_EQ(t->batches[0][1].toTensor().scalar_type(), at::kLong);

  // A lone tensor is the first input; the second is then missing.
  absl::StatusOr<CalibrationData> lone =
      LoadCalibrationData(Saved("lone.pt", features), Pair(), 2);
  ASSERT_FALSE(lone.ok());
  EXPECT_TRUE(
      absl::StrContains(lone.status().message(), "has no 'decoder_input_ids'"))
      << lone.status();
  EXPECT_TRUE(absl::StrContains(lone.status().message(), "lone.pt"));

  // Token ids out of the vocabulary name the input.
  ModelInputs small = Pair();
  small.limits.vocab_size = 10;
  absl::StatusOr<CalibrationData> oov =
      LoadCalibrationData(TestData("features_pair.pt"), small, 2);
  ASSERT_FALSE(oov.ok());
  EXPECT_TRUE(absl::StrContains(oov.status().message(), "out of range [0, 10)"))
      << oov.status();
  EXPECT_TRUE(absl::StrContains(oov.status().message(), "decoder_input_ids"));

  // JSON lines hold token ids only.
  absl::StatusOr<CalibrationData> json =
      LoadCalibrationData(WriteTemp("pair.jsonl", "[1, 2]\n"), Pair(), 2);
  ASSERT_FALSE(json.ok());
  EXPECT_TRUE(absl::StrContains(json.status().message(), "pair.jsonl"));
  EXPECT_TRUE(absl::StrContains(json.status().message(), "input_features"));
}

TEST(FeatureDataTest, ChecksEachInputAgainstTheModel) {
  const at::Tensor images = at::randn({4, 3, 8, 8});
  struct Case {
    const char* what;
    std::vector<std::pair<std::string, c10::IValue>> values;
    const char* expected;
  };
  at::Tensor nan = images.clone();
  nan[2][1][0][0] = std::numeric_limits<float>::quiet_NaN();
  const Case cases[] = {
      {"ints for floats",
       {{"pixel_values", at::zeros({4, 3, 8, 8}, at::kLong)}},
       "input 'pixel_values' must be a floating-point tensor like the "
       "model's example input float32[2, 3, 8, 8], got int64[4, 3, 8, 8]"},
      {"rank", {{"pixel_values", at::randn({4, 3})}}, "must have rank 4"},
      {"NaN",
       {{"pixel_values", nan}},
       "NaN or Inf values (1, the first in "
       "sample 2)"},
      {"unknown name",
       {{"pixel_values", images}, {"labels", at::zeros({4}, at::kLong)}},
       "has 'labels', which is not an input of the model (pixel_values: "
       "float32[2, 3, 8, 8])"},
      {"no samples",
       {{"pixel_values", at::randn({0, 3, 8, 8})}},
       "holds no samples"},
      {"not a tensor",
       {{"pixel_values", c10::IValue("cat.png")}},
       "expected a tensor"},
      {"missing", {}, "has no 'pixel_values', which the model takes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::Status s = FeatureError(Images(), c.values);
    ASSERT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_TRUE(absl::StrContains(s.message(), "calibration data 'calib.pt'"))
        << s;
    EXPECT_TRUE(absl::StrContains(s.message(), c.expected)) << s;
  }
  absl::Status s = FeatureError(
      Pair(), {{"input_features", at::randn({3, 4, 10})},
               {"decoder_input_ids", at::zeros({2, 6}, at::kLong)}});
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "input 'decoder_input_ids' has 2 samples, but "
                                "'input_features' has 3"))
      << s;

  // One sample without its sample dimension; float64 becomes float32; a
  // list of per-sample tensors is stacked.
  absl::StatusOr<CalibrationData> one =
      MakeFeatureData({{"pixel_values", at::randn({3, 8, 8}, at::kDouble)}},
                      Images(), 2, "one.pt");
  ASSERT_OK(one);
  EXPECT_EQ(one->num_samples, 1);
  EXPECT_EQ(one->batches[0][0].toTensor().scalar_type(), at::kFloat);
  c10::List<at::Tensor> list({images[0], images[1], images[2]});
  absl::StatusOr<CalibrationData> stacked =
      MakeFeatureData({{"pixel_values", list}}, Images(), 2, "list.pt");
  ASSERT_OK(stacked);
  EXPECT_EQ(stacked->num_samples, 3);
  EXPECT_TRUE(at::equal(stacked->batches[1][0].toTensor()[0], images[2]));
}

TEST(FeatureDataTest, TokenModelsReadTokenFilesAsBefore) {
  ModelInputs lm;
  lm.inputs = {{"input_ids", "int64", {2, 16}},
               {"attention_mask", "int64", {2, 16}}};
  lm.limits.vocab_size = 256;
  const at::Tensor ids = ExpectedIds();
  absl::StatusOr<CalibrationData> before =
      MakeCalibrationData(ids, {"input_ids", "attention_mask"}, 4, "x");
  ASSERT_OK(before);
  for (const char* name : {"tokens_tensor.pt", "tokens_dicts.pt"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<CalibrationData> d =
        LoadCalibrationData(TestData(name), lm, 4);
    ASSERT_OK(d);
    EXPECT_EQ(d->fingerprint, before->fingerprint);
    EXPECT_TRUE(d->descriptions.empty());
  }
  // A dict by name: the mask given is used.
  at::Tensor mask = at::ones_like(ids);
  mask[0][15] = 0;
  absl::StatusOr<CalibrationData> dict = LoadCalibrationData(
      Saved("dict.pt", Dict({{"input_ids", ids}, {"attention_mask", mask}})),
      lm, 4);
  ASSERT_OK(dict);
  EXPECT_TRUE(at::equal(dict->batches[0][1].toTensor(), mask.narrow(0, 0, 4)));
  EXPECT_NE(dict->fingerprint, before->fingerprint);

  // A model traced without attention_mask accepts a mask of ones (and
  // tokenizer-style lists of ids), not one that masks anything.
  ModelInputs ids_only;
  ids_only.inputs = {{"input_ids", "int64", {2, 16}}};
  ids_only.limits.vocab_size = 256;
  absl::StatusOr<CalibrationData> lists =
      LoadCalibrationData(TestData("tokens_lists.pt"), ids_only, 4);
  ASSERT_OK(lists);
  EXPECT_TRUE(at::equal(lists->batches[0][0].toTensor(), ids.narrow(0, 0, 4)));
  absl::StatusOr<CalibrationData> masked = LoadCalibrationData(
      Saved("masked.pt", Dict({{"input_ids", ids}, {"attention_mask", mask}})),
      ids_only, 4);
  ASSERT_FALSE(masked.ok());
  EXPECT_TRUE(absl::StrContains(masked.status().message(),
                                "has 'attention_mask', which is not an input "
                                "of the model (input_ids: int64[2, 16]); the "
                                "model was traced without it"))
      << masked.status();

  // A mask of ones for other samples than the tokens' is refused, not
  // dropped silently: the user's data is not what they think.
  for (const at::Tensor& ones :
       {at::ones({ids.size(0) + 1, ids.size(1)}, at::kLong),
        at::ones({ids.size(0), ids.size(1) - 1}, at::kLong)}) {
    absl::StatusOr<CalibrationData> mismatched = LoadCalibrationData(
        Saved("ones.pt", Dict({{"attention_mask", ones}, {"input_ids", ids}})),
        ids_only, 4);
    ASSERT_FALSE(mismatched.ok());
    EXPECT_TRUE(absl::StrContains(
        mismatched.status().message(),
        absl::StrCat("input 'attention_mask' has shape [", ones.size(0), ", ",
                     ones.size(1), "], but 'input_ids' has [", ids.size(0),
                     ", ", ids.size(1), "]")))
        << mismatched.status();
  }
  absl::StatusOr<CalibrationData> matching = LoadCalibrationData(
      Saved("ones.pt",
            Dict({{"attention_mask", at::ones_like(ids)}, {"input_ids", ids}})),
      ids_only, 4);
  ASSERT_OK(matching);
  EXPECT_TRUE(
      at::equal(matching->batches[0][0].toTensor(), ids.narrow(0, 0, 4)));
}

CalibrationData FiveSamplesInBatchesOfTwo() {
  CalibrationData data;
  data.input_names = {"input_ids"};
  data.source = "test";
  data.tokens = at::arange(10, at::kLong).view({5, 2});
  data.num_samples = 5;
  data.seq_len = 2;
  for (int64_t start = 0; start < 5; start += 2) {
    data.batches.push_back(
        {data.tokens.narrow(0, start, std::min<int64_t>(2, 5 - start))});
  }
  return data;
}

TEST(CalibrationDataTest, ShardGivesSampleIToRankIModWorld) {
  CalibrationData data = FiveSamplesInBatchesOfTwo();
  ASSERT_OK_AND_ASSIGN(CalibrationData r0, ShardCalibrationData(data, 0, 2));
  ASSERT_OK_AND_ASSIGN(CalibrationData r1, ShardCalibrationData(data, 1, 2));
  EXPECT_EQ(r0.num_samples, 3);
  EXPECT_EQ(r1.num_samples, 2);
  ASSERT_EQ(r0.batches.size(), 2u);  // Samples 0, 2 | 4.
  EXPECT_TRUE(at::equal(r0.batches[0][0].toTensor(),
                        data.tokens.index_select(0, at::tensor({0, 2}))));
  EXPECT_TRUE(
      at::equal(r0.batches[1][0].toTensor(), data.tokens.narrow(0, 4, 1)));
  ASSERT_EQ(r1.batches.size(), 1u);  // Samples 1, 3.
  EXPECT_TRUE(at::equal(r1.batches[0][0].toTensor(),
                        data.tokens.index_select(0, at::tensor({1, 3}))));
  EXPECT_THAT(ShardCalibrationData(data, 5, 6).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("5 samples: too few for 6 ranks")));
}

// A language model's inputs, as traced.
ModelInputs Lm() {
  ModelInputs lm;
  lm.inputs = {{"input_ids", "int64", {2, 16}},
               {"attention_mask", "int64", {2, 16}},
               {"position_ids", "int64", {2, 16}}};
  lm.limits.vocab_size = 256;
  lm.limits.max_seq_len = 64;
  return lm;
}

c10::IValue IntLists(const std::vector<std::vector<int64_t>>& rows) {
  c10::impl::GenericList list(c10::ListType::ofInts());
  for (const auto& r : rows) list.push_back(c10::IValue(r));
  return list;
}

TEST(CalibrationDataTest, SamplesOfDifferentLengthsAreNeverPadded) {
  // Lengths 3, 3, 2, 3, 3, 3 in batches of at most 2 of one length.
  const std::string path =
      WriteTemp("ragged.jsonl",
                "[1, 2, 3]\n[4, 5, 6]\n[7, 8]\n{\"input_ids\": [9, 10, 11]}\n"
                "[12, 13, 14]\n[15, 16, 17]\n");
  ASSERT_OK_AND_ASSIGN(CalibrationData d, LoadCalibrationData(path, Lm(), 2));
  EXPECT_EQ(d.num_samples, 6);
  EXPECT_EQ(d.seq_len, 3);
  EXPECT_EQ(d.min_seq_len, 2);
  EXPECT_EQ(SeqLenText(d), "2-3");
  ASSERT_EQ(d.batches.size(), 4u);
  const std::vector<std::vector<int64_t>> want = {
      {1, 2, 3, 4, 5, 6}, {7, 8}, {9, 10, 11, 12, 13, 14}, {15, 16, 17}};
  const std::vector<int64_t> rows = {2, 1, 2, 1};
  for (size_t b = 0; b < want.size(); ++b) {
    SCOPED_TRACE(b);
    const at::Tensor ids = d.batches[b][0].toTensor();
    const int64_t len = static_cast<int64_t>(want[b].size()) / rows[b];
    EXPECT_TRUE(
        at::equal(ids, at::tensor(want[b], at::kLong).view({rows[b], len})));
    EXPECT_TRUE(at::equal(d.batches[b][1].toTensor(), at::ones_like(ids)));
    EXPECT_TRUE(
        at::equal(d.batches[b][2].toTensor()[0], at::arange(len, at::kLong)));
  }
  // The same samples as a torch.save'd list of int lists, and as a
  // tokenizer's unpadded output (a dict with an attention_mask of ones).
  const std::vector<std::vector<int64_t>> samples = {
      {1, 2, 3}, {4, 5, 6}, {7, 8}, {9, 10, 11}, {12, 13, 14}, {15, 16, 17}};
  std::vector<std::vector<int64_t>> ones;
  for (const auto& r : samples) ones.emplace_back(r.size(), 1);
  c10::impl::GenericDict dict(c10::StringType::get(),
                              c10::ListType::create(c10::ListType::ofInts()));
  dict.insert(c10::IValue("input_ids"), IntLists(samples));
  dict.insert(c10::IValue("attention_mask"), IntLists(ones));
  for (const std::string& file : {Saved("ragged_lists.pt", IntLists(samples)),
                                  Saved("ragged_dict.pt", c10::IValue(dict))}) {
    SCOPED_TRACE(file);
    ASSERT_OK_AND_ASSIGN(CalibrationData same,
                         LoadCalibrationData(file, Lm(), 2));
    EXPECT_EQ(same.fingerprint, d.fingerprint);
    ASSERT_EQ(same.batches.size(), 4u);
    EXPECT_TRUE(
        at::equal(same.batches[2][0].toTensor(), d.batches[2][0].toTensor()));
  }
  // Other data, other fingerprint; batch size 1: one batch per sample.
  ASSERT_OK_AND_ASSIGN(CalibrationData one, LoadCalibrationData(path, Lm(), 1));
  EXPECT_EQ(one.batches.size(), 6u);
  EXPECT_NE(one.fingerprint, d.fingerprint);
  ASSERT_OK_AND_ASSIGN(
      CalibrationData other,
      LoadCalibrationData(WriteTemp("other.jsonl", "[1, 2, 3]\n[4, 5]\n"), Lm(),
                          2));
  EXPECT_NE(other.fingerprint, d.fingerprint);
}

TEST(CalibrationDataTest, RaggedSamplesAreCheckedOneByOne) {
  struct Case {
    const char* text;
    const char* expected;
  } cases[] = {
      {"[1, 2, 3]\n[4, 5]\n[6, 300, 7, 8]\n",
       "token id 300 at sample 2, position 1 is out of range [0, 256)"},
      {"[1, 2, 3]\n[]\n", "token ids must be a non-empty integer tensor"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<CalibrationData> d =
        LoadCalibrationData(WriteTemp("bad_ragged.jsonl", c.text), Lm(), 2);
    ASSERT_FALSE(d.ok());
    EXPECT_TRUE(absl::StrContains(d.status().message(), c.expected))
        << d.status();
    EXPECT_TRUE(absl::StrContains(d.status().message(), "bad_ragged.jsonl"))
        << d.status();
  }
  std::string long_line = "[1]\n[";
  for (int i = 0; i < 65; ++i) absl::StrAppend(&long_line, i ? ", " : "", 1);
  absl::StatusOr<CalibrationData> d =
      LoadCalibrationData(WriteTemp("long.jsonl", long_line + "]\n"), Lm(), 2);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::StrContains(d.status().message(),
                                "sequence length 65 exceeds the model's "
                                "max_position_embeddings 64 (sample 1)"))
      << d.status();
  // A mask that masks anything is padding, which tracecut does not do.
  c10::impl::GenericDict dict(c10::StringType::get(),
                              c10::ListType::create(c10::ListType::ofInts()));
  dict.insert(c10::IValue("input_ids"), IntLists({{1, 2, 3}, {4, 5}}));
  dict.insert(c10::IValue("attention_mask"), IntLists({{1, 1, 1}, {1, 0}}));
  d = LoadCalibrationData(Saved("masked_ragged.pt", c10::IValue(dict)), Lm(),
                          2);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(absl::StrContains(d.status().message(),
                                "must be ones of each "
                                "sample's length"))
      << d.status();
}

TEST(CalibrationDataTest, ShardKeepsSamplesOfDifferentLengthsApart) {
  ASSERT_OK_AND_ASSIGN(
      CalibrationData d,
      LoadCalibrationData(WriteTemp("shard.jsonl",
                                    "[1, 2]\n[3, 4]\n[5, 6, 7]\n[8, 9]\n"
                                    "[10, 11, 12]\n"),
                          Lm(), 4));
  ASSERT_EQ(d.batches.size(), 4u);  // 2 | 3 | 2 | 3 tokens.
  // Rank 0: samples 0, 2, 4 (2, 3, 3 tokens); rank 1: 1, 3 (2, 2).
  ASSERT_OK_AND_ASSIGN(CalibrationData r0, ShardCalibrationData(d, 0, 2));
  ASSERT_OK_AND_ASSIGN(CalibrationData r1, ShardCalibrationData(d, 1, 2));
  ASSERT_EQ(r0.batches.size(), 2u);
  EXPECT_TRUE(at::equal(r0.batches[0][0].toTensor(),
                        at::tensor({1, 2}, at::kLong).view({1, 2})));
  EXPECT_TRUE(
      at::equal(r0.batches[1][0].toTensor(),
                at::tensor({5, 6, 7, 10, 11, 12}, at::kLong).view({2, 3})));
  ASSERT_EQ(r1.batches.size(), 1u);
  EXPECT_TRUE(at::equal(r1.batches[0][0].toTensor(),
                        at::tensor({3, 4, 8, 9}, at::kLong).view({2, 2})));
}

}  // namespace
}  // namespace tracecut::pipelines
