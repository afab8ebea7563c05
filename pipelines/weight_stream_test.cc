#include "pipelines/weight_stream.h"

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ir/graph.h"
#include "partition/subgraph.h"
#include "tracer/export/pt2_archive.h"
#include "util/files.h"
#include "util/status_macros.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::pipelines {

using ::tracecut::modifiers::CalibrationResults;
using ::tracecut::output::CompressedOutputOptions;
using ::tracecut::output::CompressedTensorsWriter;
namespace {

using ::testing::HasSubstr;
using tracer::exported::DeferredTensor;
using tracer::exported::IsStandIn;
using tracer::exported::StandIn;
using util::testing::StatusIs;

// A model whose `a.weight` only subgraph 0 reads and whose `b.weight` both
// subgraphs read, with both left in a checkpoint.
struct Fixture {
  std::string dir;
  torch::Tensor a = torch::arange(12, torch::kFloat).reshape({3, 4});
  torch::Tensor b = torch::arange(6, torch::kFloat).reshape({2, 3}) * 0.5;
  std::unique_ptr<runtime::GraphModule> gm;
  std::vector<partition::Subgraph> subgraphs;
  std::map<std::string, DeferredTensor> deferred;

  // `tied`: module `c` holds `a.weight`'s tensor as its own `tied_a` (as
  // the importer gives lm_head embed_tokens' weight), and subgraph 1 calls
  // `c`.
  explicit Fixture(const std::string& name, bool nan_in_b = false,
                   bool tied = false) {
    dir = util::testing::TempDir(name);
    torch::Tensor stored_b = b.to(torch::kBFloat16);
    if (nan_in_b) stored_b[1][2] = std::nan("");
    auto bytes = checkpoint::SerializeSafetensors(
        {{"a.weight", a}, {"b.weight", stored_b}});
    EXPECT_OK(bytes.status());
    EXPECT_OK(util::WriteFileAtomically(dir + "/model.safetensors", *bytes));
    EXPECT_OK(util::WriteFileAtomically(dir + "/config.json", "{}"));

    torch::jit::Module root("Root");
    for (const char* m : {"a", "b"}) {
      torch::jit::Module sub(m);
      const torch::Tensor& t = std::string(m) == "a" ? a : b;
      sub.register_parameter("weight", StandIn(torch::kFloat, t.sizes().vec()),
                             false);
      root.register_module(m, sub);
    }
    if (tied) {
      torch::jit::Module c("c");
      c.register_parameter(
          "tied_a", root.attr("a").toModule().attr("weight").toTensor(), false);
      root.register_module("c", c);
    }
    gm = std::make_unique<runtime::GraphModule>(root,
                                                std::make_unique<ir::Graph>());
    deferred["a.weight"] = {"a.weight", torch::kFloat, torch::kFloat};
    // Stored as bf16, traced in fp32: converted when read.
    deferred["b.weight"] = {"b.weight", torch::kFloat, torch::kBFloat16};
    for (int i = 0; i < 2; ++i) {
      partition::Subgraph s;
      s.index = i;
      s.graph = std::make_unique<ir::Graph>();
      if (i == 0) {
        EXPECT_OK(s.graph->GetAttr("a.weight").status());
      }
      EXPECT_OK(s.graph->CallModule("b", {}).status());
      if (i == 1 && tied) EXPECT_OK(s.graph->CallModule("c", {}).status());
      subgraphs.push_back(std::move(s));
    }
  }
  std::vector<const partition::Subgraph*> plan() const {
    return {&subgraphs[0], &subgraphs[1]};
  }
  absl::StatusOr<std::unique_ptr<CompressedTensorsWriter>> Writer() const {
    CompressedOutputOptions o;
    o.output_dir = dir + "/out";
    o.source_dir = dir;
    return CompressedTensorsWriter::Create(o, {}, dir + "/work");
  }
  // A writer and a stream over the model, planned for its two subgraphs.
  struct Run {
    std::unique_ptr<CompressedTensorsWriter> writer;
    std::unique_ptr<WeightStream> stream;
  };
  absl::StatusOr<Run> Planned() const {
    Run run;
    ASSIGN_OR_RETURN(run.writer, Writer());
    ASSIGN_OR_RETURN(
        run.stream, WeightStream::Create(*gm, deferred, dir, run.writer.get()));
    RETURN_IF_ERROR(run.stream->Plan(plan()));
    return run;
  }
};

TEST(WeightStreamTest, LoadsWhenFirstReadAndReleasesAfterLastRead) {
  Fixture f("stream_load");
  ASSERT_OK_AND_ASSIGN(Fixture::Run run, f.Planned());
  std::unique_ptr<WeightStream>& stream = run.stream;
  ASSERT_OK(stream->Resume(0));
  ASSERT_OK(stream->Load(0));
  ASSERT_OK_AND_ASSIGN(torch::Tensor a, f.gm->GetTensor("a.weight"));
  ASSERT_OK_AND_ASSIGN(torch::Tensor b, f.gm->GetTensor("b.weight"));
  EXPECT_TRUE(torch::equal(a, f.a));
  EXPECT_EQ(b.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(b, f.b));  // bf16 holds these exactly.

  CalibrationResults results;
  ASSERT_OK(stream->Done(0, results));
  ASSERT_OK_AND_ASSIGN(a, f.gm->GetTensor("a.weight"));
  ASSERT_OK_AND_ASSIGN(b, f.gm->GetTensor("b.weight"));
  EXPECT_TRUE(IsStandIn(a));  // Released: nothing later reads it.
  EXPECT_TRUE(torch::isnan(a).all().item<bool>());
  EXPECT_FALSE(IsStandIn(b));  // Subgraph 1 still reads it.
  EXPECT_EQ(stream->peak_loaded_bytes(), (12 + 6) * 4);

  ASSERT_OK(stream->Load(1));
  ASSERT_OK(stream->Done(1, results));
  ASSERT_OK_AND_ASSIGN(b, f.gm->GetTensor("b.weight"));
  EXPECT_TRUE(IsStandIn(b));

  // Each part holds what its subgraph finished, in the stored dtype.
  ASSERT_OK_AND_ASSIGN(auto part0, checkpoint::SafetensorsFile::Open(
                                       f.dir + "/work/part-00000.safetensors"));
  ASSERT_OK_AND_ASSIGN(auto part1, checkpoint::SafetensorsFile::Open(
                                       f.dir + "/work/part-00001.safetensors"));
  EXPECT_EQ(part0->names(), std::vector<std::string>{"a.weight"});
  EXPECT_EQ(part1->names(), std::vector<std::string>{"b.weight"});
  ASSERT_OK_AND_ASSIGN(torch::Tensor stored, part1->Get("b.weight"));
  EXPECT_EQ(stored.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(stored.to(torch::kFloat), f.b));
}

// A tensor another module holds as its own attribute (tied weights) is
// loaded, kept and released with the deferred path: the model stays tied and
// never computes with a stand-in.
TEST(WeightStreamTest, TiedAttributeFollowsItsTensor) {
  Fixture f("stream_tied", /*nan_in_b=*/false, /*tied=*/true);
  ASSERT_OK_AND_ASSIGN(Fixture::Run run, f.Planned());
  std::unique_ptr<WeightStream>& stream = run.stream;
  ASSERT_OK(stream->Resume(0));
  ASSERT_OK(stream->Load(0));
  ASSERT_OK_AND_ASSIGN(torch::Tensor tied, f.gm->GetTensor("c.tied_a"));
  ASSERT_OK_AND_ASSIGN(torch::Tensor a, f.gm->GetTensor("a.weight"));
  EXPECT_TRUE(torch::equal(tied, f.a));
  EXPECT_TRUE(tied.is_same(a));
  CalibrationResults results;
  ASSERT_OK(stream->Done(0, results));
  // Subgraph 1 reads it through `c`: still loaded.
  ASSERT_OK_AND_ASSIGN(tied, f.gm->GetTensor("c.tied_a"));
  EXPECT_TRUE(torch::equal(tied, f.a));
  ASSERT_OK(stream->Load(1));
  ASSERT_OK(stream->Done(1, results));
  ASSERT_OK_AND_ASSIGN(tied, f.gm->GetTensor("c.tied_a"));
  ASSERT_OK_AND_ASSIGN(a, f.gm->GetTensor("a.weight"));
  EXPECT_TRUE(IsStandIn(tied));
  EXPECT_TRUE(IsStandIn(a));
  // Written once, under its own name, with the subgraph that read it last.
  ASSERT_OK_AND_ASSIGN(auto part1, checkpoint::SafetensorsFile::Open(
                                       f.dir + "/work/part-00001.safetensors"));
  EXPECT_THAT(part1->names(), testing::Contains("a.weight"));
  EXPECT_THAT(part1->names(), testing::Not(testing::Contains("c.tied_a")));
}

TEST(WeightStreamTest, ResumeReadsWhatSpansTheRestartAgain) {
  Fixture f("stream_resume");
  ASSERT_OK_AND_ASSIGN(Fixture::Run run, f.Planned());
  std::unique_ptr<WeightStream>& stream = run.stream;
  // As after a checkpoint restore at subgraph 1 that changed nothing.
  ASSERT_OK(stream->Resume(1));
  ASSERT_OK_AND_ASSIGN(torch::Tensor a, f.gm->GetTensor("a.weight"));
  ASSERT_OK_AND_ASSIGN(torch::Tensor b, f.gm->GetTensor("b.weight"));
  EXPECT_TRUE(IsStandIn(a));  // Finished before the restart.
  EXPECT_TRUE(torch::equal(b, f.b));
}

TEST(WeightStreamTest, NonFiniteCheckpointTensorNamesFileAndTensor) {
  Fixture f("stream_nan", /*nan_in_b=*/true);
  ASSERT_OK_AND_ASSIGN(Fixture::Run run, f.Planned());
  std::unique_ptr<WeightStream>& stream = run.stream;
  absl::Status s = stream->Load(0);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("model.safetensors: tensor b.weight")));
  EXPECT_THAT(s.message(), HasSubstr("NaN at [1, 2]"));
}

TEST(WeightStreamTest, RefusesAModelThatHoldsItsWeights) {
  Fixture f("stream_refuse");
  ASSERT_OK(f.gm->SetTensor("a.weight", f.a));
  ASSERT_OK_AND_ASSIGN(auto writer, f.Writer());
  EXPECT_THAT(
      WeightStream::Create(*f.gm, f.deferred, f.dir, writer.get()).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'a.weight'")));
}

}  // namespace
}  // namespace tracecut::pipelines
