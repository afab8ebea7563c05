// Row 6: GPTQ. Two modes, each printing one JSON object.
//
//   gptq_bench solve MODEL.pt --out=FILE.pt [--layer=model.layers.0]
//              [--samples=32] [--seq=64] [--reps=3] [--bits=4]
//              [--group=128] [--block=128] [--damp=0.01] [--act_order=1]
//
// collects the Hessian of every Linear under --layer from real calibration
// activations (synthetic tokens, seed 0, through the basic pipeline with a
// collecting modifier), times GptqQuantize (quantization/gptq.h) on each
// (median of --reps) and writes {"<path>|W", "<path>|H", "<path>|Q"} to
// FILE.pt (torch.save format) so that bench/reference/gptq_ref.py solves
// the very same problems and compares its weights with ours.
//
//   gptq_bench logits MODEL.pt [--samples=128] [--seq=32] [--eval=32]
//              [--bits=4] [--group=128] [--damp=0.01] [--act_order=1]
//
// calibrates MODEL.pt twice with the sequential pipeline (Calibrate, as
// `tracecut calibrate` does): GPTQ and round-to-nearest with the same scheme
// on every Linear but lm_head, on --samples synthetic sequences (seed 0);
// then compares the final logits of each with the fp32 model on --eval
// held-out sequences (seed 1234, never used for calibration).

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "bench/bench_util.h"
#include "modifiers/modifier.h"
#include "partition/partitioner.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "pipelines/pipeline.h"
#include "pipelines/recipe.h"
#include "quantization/gptq.h"
#include "runtime/torch_status.h"
#include "util/status_macros.h"

namespace tracecut::bench {
namespace {

constexpr char kTool[] = "gptq_bench";

struct Settings {
  std::string out;
  std::string layer = "model.layers.0";
  int64_t samples = -1;
  int64_t seq = -1;
  int64_t eval = 32;
  int reps = 3;
  int bits = 4;
  int64_t group = 128;
  int64_t block = 128;
  double damp = 0.01;
  bool act_order = true;
};

// Accumulates the Hessian of every Linear whose path starts with `prefix.`.
class HessianCollector : public modifiers::Modifier {
 public:
  explicit HessianCollector(std::string prefix) : prefix_(prefix + ".") {}
  std::string name() const override { return "hessian-collector"; }
  bool WantsModule(absl::string_view path,
                   absl::string_view type) const override {
    return absl::StartsWith(path, prefix_) &&
           partition::ModulePatternMatches("Linear", path, type);
  }
  absl::Status OnModuleCall(modifiers::RunContext& ctx,
                            const modifiers::ModuleCall& call) override {
    const at::Tensor x = call.inputs[0].toTensor();
    auto it = hessians_.find(std::string(call.path));
    if (it == hessians_.end()) {
      it = hessians_
               .emplace(std::string(call.path),
                        quantization::HessianAccumulator(x.size(-1)))
               .first;
    }
    return it->second.Add(x);
  }
  const std::map<std::string, quantization::HessianAccumulator>& hessians()
      const {
    return hessians_;
  }

 private:
  std::string prefix_;
  std::map<std::string, quantization::HessianAccumulator> hessians_;
};

quantization::GptqOptions GptqOptionsOf(const Settings& s) {
  quantization::GptqOptions o;
  o.scheme.bits = s.bits;
  o.scheme.symmetric = true;
  o.scheme.group_size = s.group;
  o.dampening_frac = s.damp;
  o.block_size = s.block;
  o.act_order = s.act_order;
  return o;
}

std::string SettingsJson(const Settings& s) {
  return absl::StrCat("\"bits\": ", s.bits, ", \"symmetric\": true",
                      ", \"group_size\": ", s.group,
                      ", \"block_size\": ", s.block, ", \"damp\": ", s.damp,
                      ", \"act_order\": ", s.act_order ? "true" : "false");
}

int Solve(const std::string& path, Settings s) {
  if (s.out.empty()) {
    std::fprintf(stderr, "%s: solve needs --out=FILE.pt\n", kTool);
    return 2;
  }
  if (s.samples < 0) s.samples = 32;
  if (s.seq < 0) s.seq = 64;
  pipelines::LoadedForCalibration loaded =
      OrDie(pipelines::LoadForCalibration(path), kTool, "load");
  if (!loaded.vocab_size.has_value()) {
    Die(kTool, "model", absl::InvalidArgumentError("no vocab_size in config"));
  }
  at::Tensor tokens =
      OrDie(pipelines::SyntheticTokens(s.samples, s.seq, *loaded.vocab_size, 0),
            kTool, "tokens");
  pipelines::CalibrationData data = OrDie(
      pipelines::MakeCalibrationData(
          tokens, pipelines::ModelInputNames(loaded.model), 4, "synthetic"),
      kTool, "data");
  HessianCollector collector(s.layer);
  pipelines::PipelineOptions popts;
  popts.kind = pipelines::PipelineKind::kBasic;
  modifiers::CalibrationResults results;
  std::vector<modifiers::Modifier*> modifiers = {&collector};
  OrDie(pipelines::RunPipeline(loaded.model, data, modifiers, results, popts),
        kTool, "collecting Hessians");
  if (collector.hessians().empty()) {
    Die(kTool, "layers",
        absl::NotFoundError(absl::StrCat("no Linear under ", s.layer)));
  }

  const quantization::GptqOptions options = GptqOptionsOf(s);
  c10::Dict<std::string, at::Tensor> saved;
  std::string layers;
  double total = 0;
  for (const auto& [name, acc] : collector.hessians()) {
    at::Tensor w = OrDie(loaded.model.GetTensor(absl::StrCat(name, ".weight")),
                         kTool, "weight")
                       .detach()
                       .clone();
    at::Tensor h = acc.hessian();
    quantization::GptqResult r;
    const double seconds = TimeMedian(s.reps, 1, [&] {
      r = OrDie(quantization::GptqQuantize(w, h, options), kTool, name);
    });
    total += seconds;
    saved.insert(absl::StrCat(name, "|W"), w);
    saved.insert(absl::StrCat(name, "|H"), h);
    saved.insert(absl::StrCat(name, "|Q"), r.weight);
    absl::StrAppend(&layers, layers.empty() ? "" : ", ", "{\"name\": \"", name,
                    "\", \"rows\": ", w.size(0), ", \"columns\": ", w.size(1),
                    ", \"seconds\": ", seconds, ", \"fell_back_to_rtn\": ",
                    r.fell_back_to_rtn ? "true" : "false",
                    ", \"loss\": ", r.loss, "}");
  }
  std::vector<char> bytes =
      OrDie(runtime::TorchCall("pickle_save",
                               [&] { return torch::jit::pickle_save(saved); }),
            kTool, "saving");
  std::ofstream f(s.out, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f.good()) {
    Die(kTool, s.out, absl::PermissionDeniedError("cannot write"));
  }
  std::printf(
      "%s\n",
      absl::StrCat("{\"mode\": \"solve\", \"model\": \"", path,
                   "\", \"layer\": \"", s.layer, "\", \"samples\": ", s.samples,
                   ", \"seq\": ", s.seq, ", \"reps\": ", s.reps, ", ",
                   SettingsJson(s), ", \"total_s\": ", total, ", \"layers\": [",
                   layers, "], \"file\": \"", s.out, "\"}")
          .c_str());
  return 0;
}

absl::StatusOr<pipelines::OutputError> Calibrated(
    const std::string& model_path, const std::string& recipe_text,
    const Settings& s, const std::string& out_path,
    const torch::jit::Module& reference, const pipelines::CalibrationData& eval,
    double* seconds) {
  pipelines::CalibrateOptions o;
  o.model_path = model_path;
  ASSIGN_OR_RETURN(o.recipe, pipelines::ParseRecipe(recipe_text, "bench"));
  o.synthetic_samples = s.samples;
  o.synthetic_seq_len = s.seq;
  o.seed = 0;
  o.batch_size = 8;
  o.output_path = out_path;
  Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(pipelines::CalibrateOutcome outcome,
                   pipelines::Calibrate(o));
  *seconds = SecondsSince(start);
  ASSIGN_OR_RETURN(torch::jit::Module m, runtime::TorchCall("loading", [&] {
                     return torch::jit::load(out_path);
                   }));
  return pipelines::CompareOutputs(reference, m, eval);
}

int Logits(const std::string& path, Settings s) {
  if (s.samples < 0) s.samples = 128;
  if (s.seq < 0) s.seq = 32;
  const std::string scheme = absl::StrFormat(
      "scheme { bits: %d symmetric: true group_size: %d } targets: \"Linear\" "
      "ignore: \"lm_head\"",
      s.bits, s.group);
  const std::string gptq = absl::StrFormat(
      "modifiers { gptq { %s dampening_frac: %g block_size: %d actorder: %s } "
      "} pipeline: SEQUENTIAL",
      scheme, s.damp, s.block, s.act_order ? "true" : "false");
  const std::string rtn =
      absl::StrFormat("modifiers { rtn { %s } } pipeline: SEQUENTIAL", scheme);

  pipelines::LoadedForCalibration loaded =
      OrDie(pipelines::LoadForCalibration(path), kTool, "load");
  if (!loaded.vocab_size.has_value()) {
    Die(kTool, "model", absl::InvalidArgumentError("no vocab_size in config"));
  }
  at::Tensor eval_tokens =
      OrDie(pipelines::SyntheticTokens(s.eval, s.seq, *loaded.vocab_size, 1234),
            kTool, "eval tokens");
  pipelines::CalibrationData eval = OrDie(
      pipelines::MakeCalibrationData(
          eval_tokens, pipelines::ModelInputNames(loaded.model), 8, "held-out"),
      kTool, "eval data");
  torch::jit::Module reference = OrDie(
      runtime::TorchCall("loading", [&] { return torch::jit::load(path); }),
      kTool, "load");
  reference.eval();

  char dir_template[] = "/tmp/gptq_bench.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) {
    Die(kTool, "mkdtemp", absl::InternalError("cannot create a directory"));
  }
  const std::string gptq_out = absl::StrCat(dir, "/gptq.pt");
  const std::string rtn_out = absl::StrCat(dir, "/rtn.pt");
  double gptq_s = 0, rtn_s = 0;
  pipelines::OutputError g =
      OrDie(Calibrated(path, gptq, s, gptq_out, reference, eval, &gptq_s),
            kTool, "gptq");
  pipelines::OutputError r = OrDie(
      Calibrated(path, rtn, s, rtn_out, reference, eval, &rtn_s), kTool, "rtn");
  std::remove(gptq_out.c_str());
  std::remove(rtn_out.c_str());
  rmdir(dir);
  std::printf(
      "%s\n",
      absl::StrCat(
          "{\"mode\": \"logits\", \"model\": \"", path, "\", \"samples\": ",
          s.samples, ", \"seq\": ", s.seq, ", \"eval_samples\": ", s.eval, ", ",
          SettingsJson(s), ", \"gptq_rel_err\": ", g.relative,
          ", \"rtn_rel_err\": ", r.relative, ", \"gptq_max_abs\": ", g.max_abs,
          ", \"rtn_max_abs\": ", r.max_abs, ", \"gptq_calibrate_s\": ", gptq_s,
          ", \"rtn_calibrate_s\": ", rtn_s, "}")
          .c_str());
  return 0;
}

int Main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gptq_bench solve|logits MODEL.pt [flags]\n");
    return 2;
  }
  const std::string mode = argv[1];
  const std::string path = argv[2];
  Settings s;
  for (int i = 3; i < argc; ++i) {
    absl::string_view a = argv[i];
    std::string v;
    int act = -1;
    if (StringFlag(a, "out", &s.out) || StringFlag(a, "layer", &s.layer) ||
        IntFlag(kTool, a, "samples", &s.samples) ||
        IntFlag(kTool, a, "seq", &s.seq) ||
        IntFlag(kTool, a, "eval", &s.eval) ||
        IntFlag(kTool, a, "reps", &s.reps) ||
        IntFlag(kTool, a, "bits", &s.bits) ||
        IntFlag(kTool, a, "group", &s.group) ||
        IntFlag(kTool, a, "block", &s.block)) {
      continue;
    }
    if (IntFlag(kTool, a, "act_order", &act)) {
      s.act_order = act != 0;
      continue;
    }
    if (StringFlag(a, "damp", &v) && absl::SimpleAtod(v, &s.damp)) continue;
    std::fprintf(stderr, "%s: bad flag '%s'\n", kTool, argv[i]);
    return 2;
  }
  if (s.reps < 1 || s.eval < 1) {
    std::fprintf(stderr, "%s: --reps and --eval must be >= 1\n", kTool);
    return 2;
  }
  torch::NoGradGuard no_grad;
  if (mode == "solve") return Solve(path, s);
  if (mode == "logits") return Logits(path, s);
  std::fprintf(stderr, "%s: mode must be solve or logits, got '%s'\n", kTool,
               mode.c_str());
  return 2;
}

}  // namespace
}  // namespace tracecut::bench

int main(int argc, char** argv) { return tracecut::bench::Main(argc, argv); }
