// RunCheckpoint alone: what Write saves, Restore gives back bit for bit, and
// the checkpoints Restore refuses (pipeline_test and calibrate_test resume
// whole runs).

#include "pipelines/pipeline_checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "modifiers/modifier.h"
#include "pipelines/calibrate.h"
#include "pipelines/intermediates_cache.h"
#include "util/files.h"
#include "util/progress.h"
#include "util/testing/status_matchers.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::modifiers::Modifier;
using ::tracecut::modifiers::RunContext;
using ::tracecut::util::Progress;
namespace {

using ::testing::HasSubstr;
using ::tracecut::util::testing::StatusIs;

constexpr char kIdentity[] = "pipeline=sequential\ncaller=test\n";

std::string Runfile(const std::string& rel) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return rel;
  return absl::StrCat(srcdir, "/", workspace, "/", rel);
}

std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name);
  std::filesystem::remove_all(dir);
  return dir;
}

const LoadedForCalibration& Llama() {
  static const auto* loaded = [] {
    absl::StatusOr<LoadedForCalibration> l =
        LoadForCalibration(Runfile("tests/fixtures/llama.pt"));
    EXPECT_OK(l);
    return new LoadedForCalibration(std::move(*l));
  }();
  return *loaded;
}

// A modifier whose whole state is one number.
class Counter : public Modifier {
 public:
  std::string name() const override { return "counter"; }
  absl::StatusOr<c10::IValue> SaveState() const override { return count; }
  absl::Status RestoreState(const c10::IValue& state) override {
    count = state.toInt();
    return absl::OkStatus();
  }
  int64_t count = 0;
};

// A model, its results and a context over them.
struct Model {
  Model() : gm(*Llama().model.Clone()), ctx(&gm, &results, 2, &silent) {}
  runtime::GraphModule gm;
  CalibrationResults results;
  Progress silent = Progress::Silent();
  RunContext ctx;
};

std::string FirstParameter(const runtime::GraphModule& gm) {
  for (const auto& p : gm.module().named_parameters(/*recurse=*/true)) {
    return p.name;
  }
  return "";
}

TEST(RunCheckpointTest, NoCheckpointIsNotAnError) {
  Model run;
  RunCheckpoint checkpoint(FreshDir("none"), kIdentity);
  ASSERT_OK_AND_ASSIGN(
      std::optional<int> next,
      checkpoint.Restore(run.ctx, {}, 3,
                         [](int64_t, const std::string&, const c10::IValue&) {
                           return absl::OkStatus();
                         }));
  EXPECT_FALSE(next.has_value());
}

TEST(RunCheckpointTest, RestoreGivesBackWhatWriteSaved) {
  const std::string dir = FreshDir("round_trip");
  const std::string param = FirstParameter(Llama().model);
  ASSERT_FALSE(param.empty());
  at::Tensor changed;
  at::Tensor cached = at::randn({2, 3});
  {
    Model run;
    ASSERT_OK_AND_ASSIGN(at::Tensor w, run.gm.GetTensor(param));
    changed = w.detach().clone() + 1;
    ASSERT_OK(run.ctx.UpdateTensor(param, changed));
    run.results.Module("model.layers.0.mlp.up_proj").weight_method = "rtn";
    ASSERT_OK_AND_ASSIGN(IntermediatesCache cache,
                         IntermediatesCache::Create({}));
    ASSERT_OK(cache.Put(1, "hidden", cached));
    Counter counter;
    counter.count = 7;
    std::vector<Modifier*> modifiers = {&counter};
    RunCheckpoint checkpoint(dir, kIdentity);
    ASSERT_OK(checkpoint.CreateDir());
    ASSERT_OK(checkpoint.Write(1, run.ctx, modifiers, cache));
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/weights-00000.pt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/state.pt"));

  Model run;
  Counter counter;
  std::vector<Modifier*> modifiers = {&counter};
  std::map<std::pair<int64_t, std::string>, c10::IValue> put;
  RunCheckpoint checkpoint(dir, kIdentity);
  ASSERT_OK_AND_ASSIGN(
      std::optional<int> next,
      checkpoint.Restore(
          run.ctx, modifiers, 3,
          [&](int64_t b, const std::string& name, const c10::IValue& v) {
            put[{b, name}] = v;
            return absl::OkStatus();
          }));
  EXPECT_EQ(next, 1);
  ASSERT_OK_AND_ASSIGN(at::Tensor w, run.gm.GetTensor(param));
  EXPECT_TRUE(at::equal(w, changed));
  EXPECT_EQ(counter.count, 7);
  ASSERT_NE(run.results.FindModule("model.layers.0.mlp.up_proj"), nullptr);
  EXPECT_EQ(run.results.FindModule("model.layers.0.mlp.up_proj")->weight_method,
            "rtn");
  ASSERT_EQ(put.size(), 1u);
  EXPECT_TRUE(at::equal(put.at({1, "hidden"}).toTensor(), cached));
}

// A rank of a data-parallel run keeps its last two states and restores the
// one the ranks agree on.
TEST(RunCheckpointTest, KeepPreviousKeepsTheLastTwoStates) {
  const std::string dir = FreshDir("keep_previous");
  Model run;
  ASSERT_OK_AND_ASSIGN(IntermediatesCache cache,
                       IntermediatesCache::Create({}));
  Counter counter;
  std::vector<Modifier*> modifiers = {&counter};
  RunCheckpoint checkpoint(dir, kIdentity, /*keep_previous=*/true);
  ASSERT_OK(checkpoint.CreateDir());
  EXPECT_TRUE(checkpoint.Kept().empty());
  for (int next = 1; next <= 3; ++next) {
    counter.count = 10 * next;
    ASSERT_OK(checkpoint.Write(next, run.ctx, modifiers, cache));
  }
  EXPECT_EQ(checkpoint.Kept(), (std::vector<int>{2, 3}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/state.pt"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/state.pt.00001"));

  auto ignore = [](int64_t, const std::string&, const c10::IValue&) {
    return absl::OkStatus();
  };
  Model again;
  Counter restored;
  std::vector<Modifier*> restored_modifiers = {&restored};
  RunCheckpoint reader(dir, kIdentity, /*keep_previous=*/true);
  ASSERT_OK_AND_ASSIGN(
      std::optional<int> next,
      reader.Restore(again.ctx, restored_modifiers, 5, ignore, /*at=*/2));
  EXPECT_EQ(next, 2);
  EXPECT_EQ(restored.count, 20);  // The earlier state, not the newest.
  EXPECT_THAT(reader.Restore(again.ctx, restored_modifiers, 5, ignore),
              StatusIs(absl::StatusCode::kInternal));
  // Continuing after subgraph 2: the state after 3 is of the run that died.
  ASSERT_OK(reader.DiscardAfter(2));
  EXPECT_EQ(reader.Kept(), (std::vector<int>{2}));
}

TEST(RunCheckpointTest, RefusesAnotherRunAndDamagedFiles) {
  const std::string dir = FreshDir("refused");
  {
    Model run;
    ASSERT_OK_AND_ASSIGN(IntermediatesCache cache,
                         IntermediatesCache::Create({}));
    RunCheckpoint checkpoint(dir, kIdentity);
    ASSERT_OK(checkpoint.CreateDir());
    ASSERT_OK(checkpoint.Write(1, run.ctx, {}, cache));
  }
  auto ignore = [](int64_t, const std::string&, const c10::IValue&) {
    return absl::OkStatus();
  };
  Model run;
  RunCheckpoint other(dir, "pipeline=basic\ncaller=test\n");
  EXPECT_THAT(other.Restore(run.ctx, {}, 3, ignore),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("made by a different run (it has "
                                 "'pipeline=sequential', this run "
                                 "'pipeline=basic')")));

  ASSERT_OK(util::WriteFileAtomically(dir + "/state.pt", "not a pickle"));
  RunCheckpoint same(dir, kIdentity);
  EXPECT_THAT(same.Restore(run.ctx, {}, 3, ignore),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is damaged")));
}

}  // namespace
}  // namespace tracecut::pipelines
