#include "checkpoint/safetensors.h"

#include <sys/stat.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/files.h"
#include "util/testing/runfiles.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::checkpoint {
namespace {

using ::testing::HasSubstr;

// The generated files' own directory: in the runfiles tree each file is a
// symbolic link to it, and a checkpoint's links may not lead outside.
std::string TestData(const std::string& name) {
  const std::filesystem::path real = std::filesystem::canonical(
      util::testing::Runfile("checkpoint/testdata/model.safetensors"));
  return (real.parent_path() / name).string();
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

// A downloaded checkpoint is untrusted: an index naming files outside the
// directory, or not regular files, fails at Open naming the entry, before
// any of them is opened.
TEST(CheckpointTest, IndexEntriesStayInsideTheDirectory) {
  namespace fs = std::filesystem;
  const fs::path base = util::testing::TempDir("hostile_index");
  const fs::path dir = base / "ckpt";
  fs::create_directories(dir / "subdir");
  fs::copy_file(TestData("model.safetensors"), base / "outside.safetensors",
                fs::copy_options::overwrite_existing);
  fs::copy_file(TestData("model.safetensors"), dir / "good.safetensors",
                fs::copy_options::overwrite_existing);
  ::mkfifo((dir / "fifo.safetensors").c_str(), 0600);
  fs::create_symlink(base / "outside.safetensors", dir / "link.safetensors");
  struct Case {
    std::string file, why;
  };
  const Case cases[] = {
      {"/etc/passwd", "an absolute path"},
      {(base / "outside.safetensors").string(), "an absolute path"},
      {"../outside.safetensors", "'..'"},
      {"link.safetensors", "outside"},
      {"fifo.safetensors", "a FIFO"},
      {"subdir", "a directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    ASSERT_OK(util::WriteFileAtomically(
        (dir / "model.safetensors.index.json").string(),
        "{\"weight_map\": {\"w\": \"good.safetensors\", \"b\": \"" + c.file +
            "\"}}"));
    absl::StatusOr<Checkpoint> ckpt = Checkpoint::Open(dir.string());
    EXPECT_THAT(
        ckpt.status(),
        util::testing::StatusIs(
            absl::StatusCode::kInvalidArgument,
            ::testing::AllOf(
                HasSubstr("model.safetensors.index.json: weight_map entry "
                          "'b' -> '" +
                          c.file + "'"),
                HasSubstr(c.why))));
  }
  ASSERT_OK(util::WriteFileAtomically(
      (dir / "model.safetensors.index.json").string(),
      R"({"weight_map": {"w": "good.safetensors", "b": "./good.safetensors"}})"));
  ASSERT_OK_AND_ASSIGN(Checkpoint ok, Checkpoint::Open(dir.string()));
  EXPECT_OK(ok.Get("b"));
}

TEST(CheckpointTest, SingleFileMustBeARegularFileInside) {
  namespace fs = std::filesystem;
  const fs::path dir = util::testing::TempDir("hostile_single");
  fs::create_symlink("/etc/passwd", dir / "model.safetensors");
  EXPECT_THAT(Checkpoint::Open(dir.string()).status(),
              util::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("outside")));
  fs::remove(dir / "model.safetensors");
  ::mkfifo((dir / "model.safetensors").c_str(), 0600);
  EXPECT_THAT(Checkpoint::Open(dir.string()).status(),
              util::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("a FIFO")));
}

// What the safetensors package refuses (overlapping ranges: o_proj reading
// q_proj's bytes; a name given twice) is refused here too.
TEST(SafetensorsFileTest, RefusesOverlapsAndDuplicates) {
  const std::string overlap =
      Image(R"({"q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
            R"( "o": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
            "12345678");
  EXPECT_THAT(SafetensorsFile::FromBytes(overlap, "o.safetensors").status(),
              util::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("overlap")));
  const std::string twice =
      Image(R"({"q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
            R"( "q": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
            "1234567812345678");
  EXPECT_THAT(SafetensorsFile::FromBytes(twice, "d.safetensors").status(),
              util::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("'q' twice")));
}

}  // namespace
}  // namespace tracecut::checkpoint
