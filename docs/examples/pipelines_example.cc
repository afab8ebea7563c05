// docs/api.md, "pipelines": a modifier of one's own next to a built-in one
// in a sequential calibration run, and the whole flow of `tracecut
// calibrate` from a recipe.
//
//   pipelines_example MODEL.pt [OUT_DIR]

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "modifiers/modifier.h"
#include "modifiers/weight_quant_modifier.h"
#include "partition/partitioner.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"
#include "pipelines/recipe.h"
#include "runtime/lowering.h"
#include "util/status_macros.h"

namespace {

namespace modifiers = tracecut::modifiers;
namespace partition = tracecut::partition;
namespace pipelines = tracecut::pipelines;
namespace runtime = tracecut::runtime;

// [START modifier]
// Counts the calls of every Linear during calibration.
class CountLinearCalls : public modifiers::Modifier {
 public:
  std::string name() const override { return "count-linear-calls"; }
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override {
    return partition::ModulePatternMatches("Linear", path, type);
  }
  absl::Status OnModuleCall(modifiers::RunContext& ctx,
                            const modifiers::ModuleCall& call) override {
    ++calls_[std::string(call.path)];
    return absl::OkStatus();
  }
  const std::map<std::string, int>& calls() const { return calls_; }

 private:
  std::map<std::string, int> calls_;
};
// [END modifier]

absl::Status Example(const std::string& model_path,
                     const std::string& out_dir) {
  // [START pipeline]
  // Traced, with what its config says (vocabulary, decoder layer type).
  ASSIGN_OR_RETURN(pipelines::LoadedForCalibration loaded,
                   pipelines::LoadForCalibration(model_path));
  ASSIGN_OR_RETURN(at::Tensor tokens, pipelines::SyntheticTokens(
                                          /*num_samples=*/8,
                                          /*seq_len=*/16, *loaded.vocab_size,
                                          /*seed=*/0));
  ASSIGN_OR_RETURN(pipelines::CalibrationData data,
                   pipelines::MakeCalibrationData(
                       tokens, pipelines::ModelInputNames(loaded.model),
                       /*batch_size=*/4, "synthetic"));

  modifiers::WeightQuantOptions rtn_options;
  rtn_options.modules.targets = {"Linear"};
  rtn_options.modules.ignore = {"lm_head"};
  rtn_options.scheme.bits = 4;
  modifiers::RtnModifier rtn(rtn_options);
  CountLinearCalls count;

  pipelines::PipelineOptions options;
  options.kind = pipelines::PipelineKind::kSequential;
  options.partition.targets = loaded.default_targets;  // LlamaDecoderLayer
  modifiers::CalibrationResults results;
  std::vector<modifiers::Modifier*> modifiers = {&count, &rtn};
  ASSIGN_OR_RETURN(
      pipelines::PipelineResult run,
      pipelines::RunPipeline(loaded.model, data, modifiers, results, options));
  for (const auto& [path, record] : results.modules) {
    std::cout << path << ": " << record.weight_scheme << ", error "
              << record.weight_error << ", " << count.calls().at(path)
              << " calls\n";
  }
  // Scales and zero points become buffers of the saved model.
  RETURN_IF_ERROR(modifiers::ExportQuantParams(results, loaded.model));
  RETURN_IF_ERROR(
      runtime::SaveTorchScript(loaded.model, out_dir + "/rtn_w4.pt"));
  // [END pipeline]

  // [START calibrate]
  pipelines::CalibrateOptions calibrate;
  calibrate.model_path = model_path;
  ASSIGN_OR_RETURN(calibrate.recipe, pipelines::ParseRecipe(R"pb(
                     modifiers {
                       gptq {
                         scheme { bits: 4 group_size: 32 }
                         targets: "Linear"
                         ignore: "lm_head"
                       }
                     }
                     pipeline: SEQUENTIAL
                   )pb"));
  calibrate.synthetic_samples = 8;
  calibrate.output_path = out_dir + "/gptq_w4.pt";
  calibrate.report_path = out_dir + "/gptq_w4.json";
  ASSIGN_OR_RETURN(pipelines::CalibrateOutcome outcome,
                   pipelines::Calibrate(calibrate));
  std::cout << outcome.pipeline.num_subgraphs << " subgraphs calibrated\n";
  // [END calibrate]
  if (run.num_subgraphs != outcome.pipeline.num_subgraphs) {
    return absl::InternalError("the two runs split the model differently");
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: pipelines_example MODEL.pt [OUT_DIR]\n";
    return 2;
  }
  // Under `bazel test`, OUT_DIR defaults to the test's scratch directory.
  const char* tmp = std::getenv("TEST_TMPDIR");
  absl::Status status =
      Example(argv[1], argc == 3 ? argv[2] : (tmp != nullptr ? tmp : "."));
  if (!status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  return 0;
}
