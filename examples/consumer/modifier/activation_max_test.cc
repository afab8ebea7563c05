// Runs the sequential pipeline over the example model with ActivationMax
// watching, as a consumer's own test would.

#include "modifier/activation_max.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "modifiers/modifier.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"

namespace consumer {
namespace {

namespace pl = tracecut::pipelines;

std::string g_model_path;

TEST(ActivationMaxTest, RecordsEveryDecoderLayer) {
  absl::StatusOr<pl::LoadedForCalibration> loaded =
      pl::LoadForCalibration(g_model_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->vocab_size.has_value());
  absl::StatusOr<at::Tensor> tokens =
      pl::SyntheticTokens(4, 16, *loaded->vocab_size, /*seed=*/0);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  absl::StatusOr<pl::CalibrationData> data = pl::MakeCalibrationData(
      *tokens, pl::ModelInputNames(loaded->model), 2, "synthetic");
  ASSERT_TRUE(data.ok()) << data.status();

  pl::PipelineOptions options;
  options.partition.targets = {"LlamaDecoderLayer"};
  ActivationMax act_max;
  tracecut::modifiers::CalibrationResults results;
  std::vector<tracecut::modifiers::Modifier*> modifiers = {&act_max};
  absl::StatusOr<pl::PipelineResult> run =
      pl::RunPipeline(loaded->model, *data, modifiers, results, options);
  ASSERT_TRUE(run.ok()) << run.status();

  std::vector<std::string> labels;
  for (const ActivationMax::Layer& layer : act_max.layers()) {
    if (layer.calls == 0) continue;
    labels.push_back(layer.label);
    EXPECT_GT(layer.max_abs, 0) << layer.label;
    for (const auto& [path, max_abs] : layer.modules) {
      EXPECT_LE(max_abs, layer.max_abs) << path;
    }
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"(head)", "model.layers.0",
                                              "model.layers.1"}));
  EXPECT_NE(act_max.ToJson().find("\"model.layers.1.mlp.down_proj\""),
            std::string::npos);
}

}  // namespace
}  // namespace consumer

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::cerr << "usage: activation_max_test MODEL.pt\n";
    return 2;
  }
  consumer::g_model_path = argv[1];
  return RUN_ALL_TESTS();
}
