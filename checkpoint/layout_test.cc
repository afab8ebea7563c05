#include "checkpoint/layout.h"

#include <torch/torch.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/files.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::checkpoint {
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::IsOk;
using ::tracecut::util::testing::StatusIs;

// Mixtral's layout for one layer of two experts (what `tracecut export`
// writes from transformers' conversion mapping): gate_up_proj is the
// experts' w1 and w3 stacked, then concatenated along dimension 1.
constexpr char kModelJson[] = R"({
  "model_class": "MixtralForCausalLM",
  "checkpoint_layout": {
    "mlp.experts.gate_up_proj": [
      {"name": "moe.experts.0.w1.weight", "offsets": [0, 0, 0], "sizes": [1, 3, 4]},
      {"name": "moe.experts.1.w1.weight", "offsets": [1, 0, 0], "sizes": [1, 3, 4]},
      {"name": "moe.experts.0.w3.weight", "offsets": [0, 3, 0], "sizes": [1, 3, 4]},
      {"name": "moe.experts.1.w3.weight", "offsets": [1, 3, 0], "sizes": [1, 3, 4]}],
    "mlp.gate.weight": [
      {"name": "moe.gate.weight", "offsets": [0, 0], "sizes": [2, 4]}]
  }
})";

class LayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(0);
    for (const char* w : {"w1", "w3"}) {
      for (int e = 0; e < 2; ++e) {
        tensors_.emplace_back(
            absl::StrCat("moe.experts.", e, ".", w, ".weight"),
            torch::randn({3, 4}).to(torch::kBFloat16));
      }
    }
    tensors_.emplace_back("moe.gate.weight",
                          torch::randn({2, 4}).to(torch::kBFloat16));
    Write(tensors_);
  }

  void Write(const std::vector<std::pair<std::string, torch::Tensor>>& t) {
    ASSERT_OK_AND_ASSIGN(std::string bytes, SerializeSafetensors(t));
    ASSERT_THAT(util::WriteFileAtomically(dir_ + "/model.safetensors", bytes),
                IsOk());
  }

  const torch::Tensor& Stored(int i) const { return tensors_[i].second; }

  const std::string dir_ = util::testing::TempDir(
      ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::vector<std::pair<std::string, torch::Tensor>> tensors_;
};

TEST_F(LayoutTest, ReadsStackedAndConcatenatedExpertsAsTransformersDoes) {
  ASSERT_OK_AND_ASSIGN(Layout layout,
                       Layout::FromModelJson(kModelJson, "m.pt2"));
  ASSERT_OK_AND_ASSIGN(Checkpoint ckpt, Checkpoint::Open(dir_));
  const std::vector<Piece>* pieces = layout.Find("mlp.experts.gate_up_proj");
  ASSERT_NE(pieces, nullptr);
  ASSERT_OK_AND_ASSIGN(torch::Tensor t,
                       ReadPieces(ckpt, "mlp.experts.gate_up_proj", *pieces));
  // transformers: MergeModulelist(dim=0) per pattern, then Concatenate(1).
  const torch::Tensor expected =
      torch::cat({torch::stack({Stored(0), Stored(1)}),
                  torch::stack({Stored(2), Stored(3)})},
                 1);
  EXPECT_EQ(t.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(t, expected));
  ASSERT_OK_AND_ASSIGN(
      torch::Tensor gate,
      ReadPieces(ckpt, "mlp.gate.weight", *layout.Find("mlp.gate.weight")));
  EXPECT_TRUE(torch::equal(gate, Stored(4)));
  EXPECT_EQ(layout.Find("lm_head.weight"), nullptr);
  ASSERT_NE(layout.FirstSplit(), nullptr);
  EXPECT_EQ(layout.FirstSplit()->first, "mlp.experts.gate_up_proj");
}

TEST_F(LayoutTest, PiecesGiveTheCheckpointTensorsBack) {
  ASSERT_OK_AND_ASSIGN(Layout layout,
                       Layout::FromModelJson(kModelJson, "m.pt2"));
  const torch::Tensor fused = torch::cat({torch::stack({Stored(0), Stored(1)}),
                                          torch::stack({Stored(2), Stored(3)})},
                                         1);
  for (int i = 0; i < 4; ++i) {
    const auto* owner = layout.Owner(tensors_[i].first);
    ASSERT_NE(owner, nullptr) << tensors_[i].first;
    EXPECT_EQ(owner->first, "mlp.experts.gate_up_proj");
    ASSERT_OK_AND_ASSIGN(torch::Tensor piece,
                         PieceOf(fused, owner->second, {3, 4}));
    EXPECT_TRUE(piece.is_contiguous());
    EXPECT_TRUE(torch::equal(piece, Stored(i))) << tensors_[i].first;
  }
  EXPECT_EQ(layout.Owner("lm_head.weight"), nullptr);
}

TEST_F(LayoutTest, NoLayoutIsEmpty) {
  ASSERT_OK_AND_ASSIGN(Layout layout,
                       Layout::FromModelJson(R"({"model_class": "X"})", "m"));
  EXPECT_TRUE(layout.empty());
  EXPECT_EQ(layout.FirstSplit(), nullptr);
}

TEST_F(LayoutTest, PiecesThatDoNotTileAreRefused) {
  // The second expert's w3 is missing: a gap.
  EXPECT_THAT(Layout::FromModelJson(R"({"checkpoint_layout": {"t": [
      {"name": "a", "offsets": [0, 0], "sizes": [1, 4]},
      {"name": "b", "offsets": [2, 0], "sizes": [1, 4]}]}})",
                                    "m.pt2"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("m.pt2: checkpoint_layout of 't'")));
  EXPECT_THAT(Layout::FromModelJson(R"({"checkpoint_layout": {"t": [
      {"name": "a", "offsets": [0], "sizes": [1, 4]}]}})",
                                    "m.pt2"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 offsets and 2 sizes")));
  EXPECT_THAT(
      Layout::FromModelJson(R"({"checkpoint_layout": {"t": 3}})", "m.pt2"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("m.pt2: checkpoint_layout")));
}

TEST_F(LayoutTest, ACheckpointThatDisagreesIsNamed) {
  ASSERT_OK_AND_ASSIGN(Layout layout,
                       Layout::FromModelJson(kModelJson, "m.pt2"));
  const std::vector<Piece>& pieces = *layout.Find("mlp.experts.gate_up_proj");
  // One expert's w3 of another shape, then missing.
  tensors_[3].second = torch::zeros({4, 3}, torch::kBFloat16);
  Write(tensors_);
  ASSERT_OK_AND_ASSIGN(Checkpoint ckpt, Checkpoint::Open(dir_));
  EXPECT_THAT(ReadPieces(ckpt, "mlp.experts.gate_up_proj", pieces),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor 'moe.experts.1.w3.weight' has shape "
                                 "[4, 3], but as a piece of "
                                 "'mlp.experts.gate_up_proj' it fills "
                                 "[1, 3, 4]")));
  tensors_[3].second = torch::zeros({3, 4}, torch::kFloat32);
  Write(tensors_);
  ASSERT_OK_AND_ASSIGN(ckpt, Checkpoint::Open(dir_));
  EXPECT_THAT(ReadPieces(ckpt, "mlp.experts.gate_up_proj", pieces),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("is Float, the other pieces")));
  tensors_.erase(tensors_.begin() + 3);
  Write(tensors_);
  ASSERT_OK_AND_ASSIGN(ckpt, Checkpoint::Open(dir_));
  EXPECT_THAT(ReadPieces(ckpt, "mlp.experts.gate_up_proj", pieces),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no tensor 'moe.experts.1.w3.weight'")));
}

}  // namespace
}  // namespace tracecut::checkpoint
