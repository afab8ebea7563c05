// Row 5: latency of a transformed model against the original module and
// against LibTorch's own inference optimisation. Prints one JSON object:
//
//   transforms_bench MODEL.pt --passes=NAME,... [--runs=200] [--inner=10]
//                    [--only=VARIANT]
//
// Variants, all on the model's embedded example inputs:
//  * original:   the TorchScript module as loaded;
//  * ofi: torch::jit::optimize_for_inference(torch::jit::freeze(original))
//                (what a LibTorch user would do; it folds conv+BN, converts
//                convolutions to MKLDNN where it pays, ...);
//  * ours:       trace, our passes (transforms/registry.h), lowered back to
//                TorchScript (runtime/lowering.h);
//  * ours_frozen: `ours` after torch::jit::freeze (the target row);
//  * ours_ofi:   `ours` after optimize_for_inference (for information).
// Each variant's first output tensor is compared with the original's
// (max_err_* = max |difference|), so the timings compare the same work.
// Times are the median over --runs of the mean of --inner back-to-back calls,
// after 5 warm-up calls (TorchScript's profiling executor optimises on the
// first calls); the variants take turns run by run. --only=VARIANT times that
// variant alone (the others are still built and checked), for profiling one
// variant with perf (bench/profile.sh).

#include <torch/csrc/jit/api/module.h>
#include <torch/script.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "runtime/graph_module.h"
#include "runtime/lowering.h"
#include "runtime/torch_status.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "transforms/pass_pipeline.h"
#include "transforms/registry.h"

namespace tracecut::bench {
namespace {

constexpr char kTool[] = "transforms_bench";

at::Tensor FirstTensor(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor();
  if (v.isTuple()) return FirstTensor(v.toTupleRef().elements()[0]);
  if (v.isList()) return FirstTensor(v.toListRef()[0]);
  if (v.isGenericDict()) return FirstTensor(v.toGenericDict().begin()->value());
  return at::Tensor();
}

int Main(int argc, char** argv) {
  if (argc < 2 || absl::string_view(argv[1]).substr(0, 2) == "--") {
    std::fprintf(stderr,
                 "usage: transforms_bench MODEL.pt --passes=NAME,... "
                 "[--runs=N] [--inner=N] [--only=VARIANT]\n");
    return 2;
  }
  const std::string path = argv[1];
  std::string passes, only;
  int runs = 200, inner = 10;
  for (int i = 2; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (StringFlag(a, "passes", &passes) || StringFlag(a, "only", &only) ||
        IntFlag(kTool, a, "runs", &runs) ||
        IntFlag(kTool, a, "inner", &inner)) {
      continue;
    }
    std::fprintf(stderr, "%s: unknown flag '%s'\n", kTool, argv[i]);
    return 2;
  }
  if (passes.empty() || runs < 1 || inner < 1) {
    std::fprintf(stderr, "%s: --passes is required; --runs, --inner >= 1\n",
                 kTool);
    return 2;
  }
  if (!only.empty() && only != "original" && only != "ofi" && only != "ours" &&
      only != "ours_frozen" && only != "ours_ofi") {
    std::fprintf(stderr,
                 "%s: --only=%s is not a variant (original, ofi, ours, "
                 "ours_frozen, ours_ofi)\n",
                 kTool, only.c_str());
    return 2;
  }
  torch::NoGradGuard no_grad;

  tracer::LoadedModel model = OrDie(tracer::LoadModel(path), kTool, "load");
  tracer::TraceOptions options =
      OrDie(tracer::WithModelFiles(model, {}), kTool, "model files");
  tracer::ExampleInputs inputs = OrDie(
      tracer::ResolveExampleInputs(model.module, options), kTool, "inputs");
  runtime::GraphModule gm =
      OrDie(tracer::Trace(model.module, options), kTool, "trace");
  std::unique_ptr<transforms::PassPipeline> pipeline =
      OrDie(transforms::MakePassPipeline(passes), kTool, "passes");
  Clock::time_point s = Clock::now();
  runtime::GraphModule transformed =
      OrDie(pipeline->Apply(gm), kTool, "transform");
  const double transform_s = SecondsSince(s);
  int changed = 0;
  for (const auto& r : pipeline->records()) changed += r.changed ? 1 : 0;

  torch::jit::Module original = model.module;
  original.eval();
  torch::jit::Module ours =
      OrDie(runtime::LowerToTorchScript(transformed), kTool, "lower");
  ours.eval();
  auto freeze = [&](const torch::jit::Module& m, bool ofi) {
    return OrDie(runtime::TorchCall(
                     "freeze",
                     [&] {
                       torch::jit::Module f = torch::jit::freeze(m.clone());
                       return ofi ? torch::jit::optimize_for_inference(f) : f;
                     }),
                 kTool, ofi ? "optimize_for_inference" : "freeze");
  };
  torch::jit::Module ofi = freeze(original, true);
  torch::jit::Module ours_frozen = freeze(ours, false);
  torch::jit::Module ours_ofi = freeze(ours, true);

  struct Variant {
    const char* name;
    torch::jit::Module* module;
    double seconds = 0;
    double max_err = 0;
  };
  std::vector<Variant> variants = {{"original", &original},
                                   {"ofi", &ofi},
                                   {"ours", &ours},
                                   {"ours_frozen", &ours_frozen},
                                   {"ours_ofi", &ours_ofi}};
  const std::vector<c10::IValue>& in = inputs.values;
  at::Tensor reference;
  auto call = [&](Variant& v) {
    return OrDie(
        runtime::TorchCall(v.name, [&] { return v.module->forward(in); }),
        kTool, v.name);
  };
  for (Variant& v : variants) {
    for (int i = 0; i < 5; ++i) call(v);
    at::Tensor out = FirstTensor(call(v));
    if (!reference.defined()) reference = out;
    v.max_err = (out.to(at::kDouble) - reference.to(at::kDouble))
                    .abs()
                    .max()
                    .item<double>();
  }
  // Round-robin: run r times every variant in turn, so that load from other
  // processes on the machine falls on all variants alike.
  std::vector<std::vector<double>> times(variants.size());
  for (int r = 0; r < runs; ++r) {
    for (size_t k = 0; k < variants.size(); ++k) {
      if (!only.empty() && only != variants[k].name) continue;
      Clock::time_point start = Clock::now();
      for (int i = 0; i < inner; ++i) call(variants[k]);
      times[k].push_back(SecondsSince(start) / inner);
    }
  }
  for (size_t k = 0; k < variants.size(); ++k) {
    if (!times[k].empty()) variants[k].seconds = Median(times[k]);
  }
  std::string out = absl::StrCat(
      "{\"model\": \"", path, "\", \"passes\": \"", passes,
      "\", \"passes_changed\": ", changed, ", \"transform_s\": ", transform_s,
      ", \"runs\": ", runs, ", \"inner\": ", inner,
      ", \"output_abs_max\": ", reference.abs().max().item<double>());
  for (const Variant& v : variants) {
    absl::StrAppend(&out, ", \"", v.name, "_s\": ", v.seconds, ", \"max_err_",
                    v.name, "\": ", v.max_err);
  }
  absl::StrAppend(&out, ", \"peak_rss_bytes\": ", PeakRssBytes(), "}");
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace
}  // namespace tracecut::bench

int main(int argc, char** argv) { return tracecut::bench::Main(argc, argv); }
