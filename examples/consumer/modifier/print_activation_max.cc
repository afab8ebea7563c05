// print_activation_max MODEL.pt OUT.json [SAMPLES]
//
// Calibrates MODEL.pt (a Hugging Face-style TorchScript model with its
// config.json embedded) one decoder layer at a time on SAMPLES (default 8)
// synthetic token sequences, with the ActivationMax modifier watching every
// leaf module, and writes the per-layer activation maxima to OUT.json.

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "modifier/activation_max.h"
#include "modifiers/modifier.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"
#include "util/status_macros.h"

namespace {

namespace pl = tracecut::pipelines;

absl::Status Run(const std::string& model_path, const std::string& out_path,
                 int64_t samples) {
  // Traced, with the config's vocabulary size and sequential targets.
  ASSIGN_OR_RETURN(pl::LoadedForCalibration loaded,
                   pl::LoadForCalibration(model_path));
  if (!loaded.vocab_size.has_value() || loaded.default_targets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": no Hugging Face config.json embedded"));
  }

  ASSIGN_OR_RETURN(at::Tensor tokens,
                   pl::SyntheticTokens(samples, /*seq_len=*/16,
                                       *loaded.vocab_size, /*seed=*/0));
  ASSIGN_OR_RETURN(
      pl::CalibrationData data,
      pl::MakeCalibrationData(tokens, pl::ModelInputNames(loaded.model),
                              /*batch_size=*/2, "synthetic"));

  pl::PipelineOptions options;
  options.kind = pl::PipelineKind::kSequential;
  options.partition.targets = loaded.default_targets;  // LlamaDecoderLayer
  consumer::ActivationMax act_max;
  tracecut::modifiers::CalibrationResults results;
  std::vector<tracecut::modifiers::Modifier*> modifiers = {&act_max};
  ASSIGN_OR_RETURN(
      pl::PipelineResult run,
      pl::RunPipeline(loaded.model, data, modifiers, results, options));
  RETURN_IF_ERROR(pl::WriteFileAtomically(out_path, act_max.ToJson()));
  std::cerr << "print_activation_max: " << run.num_subgraphs << " subgraphs, "
            << data.batches.size() << " batches, wrote " << out_path << "\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t samples = 8;
  if (argc < 3 || argc > 4 ||
      (argc == 4 && !absl::SimpleAtoi(argv[3], &samples))) {
    std::cerr << "usage: print_activation_max MODEL.pt OUT.json [SAMPLES]\n";
    return 2;
  }
  absl::Status status = Run(argv[1], argv[2], samples);
  if (!status.ok()) {
    std::cerr << "print_activation_max: " << status << "\n";
    return 1;
  }
  return 0;
}
