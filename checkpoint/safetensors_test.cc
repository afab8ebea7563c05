#include "checkpoint/safetensors.h"

#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"

namespace tracecut::checkpoint {
namespace {

using ::testing::HasSubstr;

std::string TestData(const std::string& name) {
  return util::testing::Runfile("checkpoint/testdata/" + name);
}

// A safetensors image from a header and data, for the malformed cases.
std::string Image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 255);
  return out + header + data;
}

TEST(SafetensorsFileTest, ReadsWhatTheSafetensorsPackageWrote) {
  auto f = SafetensorsFile::Open(TestData("model.safetensors"));
  ASSERT_OK(f);
  EXPECT_THAT((*f)->names(), ::testing::ElementsAre("b", "ids", "w"));
  auto w = (*f)->Get("w");
  ASSERT_OK(w);
  EXPECT_TRUE(
      torch::equal(*w, torch::arange(6, torch::kFloat32).reshape({2, 3})));
  auto b = (*f)->Get("b");
  ASSERT_OK(b);
  EXPECT_EQ(b->scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(
      torch::equal(b->to(torch::kFloat32), torch::tensor({0.5f, -1.0f, 2.0f})));
  auto ids = (*f)->Get("ids");
  ASSERT_OK(ids);
  EXPECT_EQ(ids->scalar_type(), torch::kInt64);
  EXPECT_EQ(ids->sum().item<int64_t>(), 10);
  auto missing = (*f)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'nope'"));
}

TEST(CheckpointTest, ReadsShardsThroughTheIndex) {
  auto c = Checkpoint::Open(TestData("sharded"));
  ASSERT_OK(c);
  EXPECT_TRUE(c->Has("a"));
  auto b = c->Get("b");
  ASSERT_OK(b);
  EXPECT_TRUE(torch::equal(*b, torch::full({3}, 7.0)));
  EXPECT_THAT(c->Get("c").status().message(), HasSubstr("no tensor 'c'"));
}

TEST(CheckpointTest, SingleFileDirectory) {
  auto c = Checkpoint::Open(TestData(""));
  ASSERT_OK(c);
  EXPECT_TRUE(c->Has("w"));
  EXPECT_TRUE(Checkpoint::HasWeights(TestData("")));
  EXPECT_FALSE(Checkpoint::HasWeights("/nonexistent"));
  EXPECT_EQ(Checkpoint::Open("/nonexistent").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, EachLieIsAnErrorNamingTheTensor) {
  struct Case {
    std::string image;
    std::string message;
  };
  const std::string ok_entry =
      R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  const Case cases[] = {
      {"abc", "no header length"},
      {Image(ok_entry, "").substr(0, 20), "truncated"},
      {Image("not json", ""), "not JSON"},
      {Image(ok_entry, "1234"), "truncated"},
      {Image(R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
             "12345678"),
       "need 12"},
      {Image(R"({"t": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})",
             "12345678"),
       "unknown dtype"},
      {Image(R"({"t": {"dtype": "F32", "shape": [2]}})", "12345678"),
       "tensor 't'"},
  };
  for (const Case& c : cases) {
    auto f = SafetensorsFile::FromBytes(c.image, "x.safetensors");
    ASSERT_FALSE(f.ok()) << c.message;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(f.status().message(), HasSubstr("x.safetensors"));
    EXPECT_THAT(f.status().message(), HasSubstr(c.message));
  }
  auto good = SafetensorsFile::FromBytes(Image(ok_entry, "12345678"), "y");
  EXPECT_OK(good);
}

}  // namespace
}  // namespace tracecut::checkpoint
