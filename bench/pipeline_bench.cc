// Row 4: the overhead of the sequential calibration pipeline. Runs ONE mode
// per process, so that each process's peak RSS belongs to that mode alone,
// and prints one JSON object:
//
//   pipeline_bench MODEL.pt --mode=plain|sequential|basic
//                  [--samples=16] [--seq=64] [--batch=4] [--runs=3]
//
//  * plain: the original TorchScript module's forward over the calibration
//    batches (what calibration costs at the very least);
//  * sequential / basic: RunPipeline (pipelines/pipeline.h) over the same
//    batches with one no-op modifier that asks for every Linear call (the
//    hooks run, nothing is computed in them, no weight changes, so no
//    propagation pass runs).
//
// Timings are the median of --runs whole passes over the data after one
// warm-up pass. The calibration data are synthetic tokens (seed 0), the same
// in every mode.

#include <torch/script.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bench/bench_util.h"
#include "modifiers/modifier.h"
#include "partition/partitioner.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"
#include "runtime/torch_status.h"

namespace tracecut::bench {
namespace {

constexpr char kTool[] = "pipeline_bench";

// Sees every Linear call and does nothing with it.
class NoOpModifier : public modifiers::Modifier {
 public:
  std::string name() const override { return "no-op"; }
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override {
    return partition::ModulePatternMatches("Linear", path, type);
  }
  absl::Status OnModuleCall(modifiers::RunContext& ctx,
                            const modifiers::ModuleCall& call) override {
    ++calls_;
    return absl::OkStatus();
  }
  int64_t calls() const { return calls_; }

 private:
  int64_t calls_ = 0;
};

int Main(int argc, char** argv) {
  if (argc < 2 || absl::string_view(argv[1]).substr(0, 2) == "--") {
    std::fprintf(stderr,
                 "usage: pipeline_bench MODEL.pt --mode=plain|sequential|basic "
                 "[--samples=N] [--seq=N] [--batch=N] [--runs=N]\n");
    return 2;
  }
  const std::string path = argv[1];
  std::string mode = "sequential";
  int64_t samples = 16, seq = 64, batch = 4;
  int runs = 3;
  for (int i = 2; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (StringFlag(a, "mode", &mode) ||
        IntFlag(kTool, a, "samples", &samples) ||
        IntFlag(kTool, a, "seq", &seq) || IntFlag(kTool, a, "batch", &batch) ||
        IntFlag(kTool, a, "runs", &runs)) {
      continue;
    }
    std::fprintf(stderr, "%s: unknown flag '%s'\n", kTool, argv[i]);
    return 2;
  }
  if (mode != "plain" && mode != "sequential" && mode != "basic") {
    std::fprintf(stderr, "%s: --mode must be plain, sequential or basic\n",
                 kTool);
    return 2;
  }
  if (runs < 1 || samples < 1 || seq < 1 || batch < 1) {
    std::fprintf(stderr, "%s: --runs, --samples, --seq, --batch must be >= 1\n",
                 kTool);
    return 2;
  }
  torch::NoGradGuard no_grad;

  // Both modes load and trace, so the peak RSS of `basic` and `sequential`
  // differ by what their pipelines hold, not by how the model was read.
  pipelines::LoadedForCalibration loaded =
      OrDie(pipelines::LoadForCalibration(path), kTool, "load");
  if (!loaded.vocab_size.has_value()) {
    Die(kTool, "model", absl::InvalidArgumentError("no vocab_size in config"));
  }
  at::Tensor tokens =
      OrDie(pipelines::SyntheticTokens(samples, seq, *loaded.vocab_size, 0),
            kTool, "tokens");
  pipelines::CalibrationData data = OrDie(
      pipelines::MakeCalibrationData(
          tokens, pipelines::ModelInputNames(loaded.model), batch, "synthetic"),
      kTool, "data");

  std::string out = absl::StrCat(
      "{\"mode\": \"", mode, "\", \"model\": \"", path,
      "\", \"samples\": ", samples, ", \"seq\": ", seq, ", \"batch\": ", batch,
      ", \"batches\": ", data.batches.size(), ", \"runs\": ", runs);
  double seconds = 0;
  if (mode == "plain") {
    torch::jit::Module original = OrDie(
        runtime::TorchCall("loading", [&] { return torch::jit::load(path); }),
        kTool, "load");
    original.eval();
    auto pass = [&] {
      OrDie(runtime::TorchCall("forward",
                               [&] {
                                 for (const auto& b : data.batches) {
                                   original.forward(b);
                                 }
                               }),
            kTool, "forward");
    };
    seconds = TimeMedian(runs, 1, pass);
  } else {
    pipelines::PipelineOptions options;
    options.kind = mode == "basic" ? pipelines::PipelineKind::kBasic
                                   : pipelines::PipelineKind::kSequential;
    options.partition.targets = loaded.default_targets;
    NoOpModifier noop;
    std::vector<modifiers::Modifier*> modifiers = {&noop};
    pipelines::PipelineResult last;
    auto pass = [&] {
      modifiers::CalibrationResults results;
      last = OrDie(pipelines::RunPipeline(loaded.model, data, modifiers,
                                          results, options),
                   kTool, "pipeline");
    };
    seconds = TimeMedian(runs, 1, pass);
    int64_t max_held = 0;
    for (const pipelines::SubgraphCacheStats& s : last.subgraphs) {
      max_held = std::max(max_held, s.bytes_held);
    }
    absl::StrAppend(&out, ", \"subgraphs\": ", last.num_subgraphs,
                    ", \"linear_calls_per_pass\": ", noop.calls() / (runs + 1),
                    ", \"cache_peak_bytes\": ", last.cache.peak_bytes_held,
                    ", \"cache_max_bytes_between_subgraphs\": ", max_held,
                    ", \"cache_peak_values\": ", last.peak_cache_values,
                    ", \"cache_bytes_spilled\": ", last.cache.bytes_spilled);
  }
  absl::StrAppend(&out, ", \"seconds\": ", seconds,
                  ", \"peak_rss_bytes\": ", PeakRssBytes(), "}");
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace
}  // namespace tracecut::bench

int main(int argc, char** argv) { return tracecut::bench::Main(argc, argv); }
