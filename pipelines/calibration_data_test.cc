#include "pipelines/calibration_data.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tracecut::pipelines {
namespace {

std::string Runfile(const std::string& rel) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return rel;
  return absl::StrCat(srcdir, "/", workspace, "/", rel);
}

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
  EXPECT_TRUE(t.ok()) << t.status();
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
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(at::equal(*t, ids));
  }
}

TEST(CalibrationDataTest, UnreadablePicklesGetAHint) {
  absl::StatusOr<at::Tensor> t = LoadTokenFile(TestData("tokens_set.pt"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(t.status().message(), "torch.save(ids, path)"))
      << t.status();
}

TEST(CalibrationDataTest, RejectsWrongDtypeAndShape) {
  absl::StatusOr<at::Tensor> f = LoadTokenFile(TestData("tokens_float.pt"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
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
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(
      at::equal(*t, at::tensor({1, 2, 3, 4, 5, 6}, at::kLong).view({2, 3})));
}

TEST(CalibrationDataTest, JsonLinesErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* expected;
  } cases[] = {
      {"[1, 2, 3]\n[1, 2]\n", ":2: 2 tokens, but the first sample has 3"},
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
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(s.message(),
                        "token id 300 at sample 2, position 5 is out of range "
                        "[0, 256)"))
      << s;
  ids[2][5] = -1;
  EXPECT_FALSE(CheckTokens(ids, limits, "x").ok());
  ids[2][5] = 255;
  EXPECT_TRUE(CheckTokens(ids, limits, "x").ok());
  limits.max_seq_len = 4;
  s = CheckTokens(ids, limits, "x");
  EXPECT_TRUE(absl::StrContains(s.message(), "max_position_embeddings 4")) << s;
  EXPECT_FALSE(CheckTokens(at::zeros({0, 4}, at::kLong), {}, "x").ok());
  EXPECT_FALSE(CheckTokens(at::zeros({2, 4}, at::kFloat), {}, "x").ok());
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
  ASSERT_TRUE(data.ok()) << data.status();
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

}  // namespace
}  // namespace tracecut::pipelines
