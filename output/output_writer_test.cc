#include "output/output_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/script.h>

#include <fstream>
#include <string>
#include <vector>

#include "tracer/testing/traced_fixture.h"
#include "util/testing/status_matchers.h"
#include "util/testing/temp_dir.h"

namespace tracecut::output {
namespace {

using ::testing::HasSubstr;
using ::tracecut::tracer::testing::TracedFixture;
using ::tracecut::tracer::testing::TraceFixture;
using ::tracecut::util::testing::StatusIs;
using ::tracecut::util::testing::TempDir;

at::Tensor Logits(torch::jit::Module m, std::vector<c10::IValue> inputs) {
  c10::IValue out = m.forward(inputs);
  return out.isTuple() ? out.toTupleRef().elements()[0].toTensor()
                       : out.toTensor();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

TEST(OutputWriterTest, TorchScriptComputesWhatTheModelComputes) {
  TracedFixture t = TraceFixture("tests/fixtures/llama.pt");
  const std::string path = TempDir("output_ts") + "/model.pt";
  ASSERT_OK(TorchScriptOutput(path)->Write(t.gm, {}));
  torch::jit::Module saved = torch::jit::load(path);
  EXPECT_TRUE(at::equal(Logits(saved, t.inputs), Logits(t.module, t.inputs)));
}

// The compressed-tensors writer is WriteCompressedTensors: a model nothing
// quantized is refused and nothing is written (calibrations that quantize
// are checked end to end, e.g. //tests/hf:compressed_tensors_test).
TEST(OutputWriterTest, CompressedTensorsOfAnUnquantizedModelWritesNothing) {
  TracedFixture t = TraceFixture("tests/fixtures/llama.pt");
  CompressedOutputOptions o;
  o.output_dir = TempDir("output_ct") + "/out";
  EXPECT_THAT(CompressedTensorsOutput(o)->Write(t.gm, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no module was quantized")));
  EXPECT_FALSE(Exists(o.output_dir));
}

TEST(OutputWriterTest, OutputOverSomethingElseIsRefusedAndLeftAlone) {
  TracedFixture t = TraceFixture("tests/fixtures/llama.pt");
  CompressedOutputOptions o;
  o.output_dir = TempDir("output_refused") + "/notes.txt";
  std::ofstream(o.output_dir) << "mine";
  EXPECT_THAT(
      CompressedTensorsOutput(o)->Write(t.gm, {}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("notes.txt")));
  std::ifstream in(o.output_dir);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "mine");
}

}  // namespace
}  // namespace tracecut::output
