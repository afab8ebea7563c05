// Measures tracecut on one TorchScript model and prints one JSON object:
// load and trace time, runtime latency of the original module, the
// Interpreter and the lowered module (median of N runs on the same inputs),
// and PartitionGraph time. bench/run_all.sh compares these with the peers.
//
//   bench_main MODEL.pt [--runs=N] [--leaf=TYPE] [--targets=TYPE]
//              [--partition_reps=N] [--trace_reps=N] [--skip_runtime]

#include <torch/script.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench/bench_util.h"
#include "partition/partitioner.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "tracer/load.h"
#include "tracer/tracer.h"

namespace tracecut::bench {
namespace {

constexpr char kTool[] = "bench_main";

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_main MODEL.pt [flags]\n");
    return 2;
  }
  std::string path = argv[1];
  int runs = 20;
  int partition_reps = 20;
  int trace_reps = 3;
  bool skip_runtime = false;
  std::string leaf, targets = "LlamaDecoderLayer";
  for (int i = 2; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--runs=")) {
      (void)absl::SimpleAtoi(a, &runs);
    } else if (absl::ConsumePrefix(&a, "--partition_reps=")) {
      (void)absl::SimpleAtoi(a, &partition_reps);
    } else if (absl::ConsumePrefix(&a, "--trace_reps=")) {
      (void)absl::SimpleAtoi(a, &trace_reps);
    } else if (absl::ConsumePrefix(&a, "--leaf=")) {
      leaf = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--targets=")) {
      targets = std::string(a);
    } else if (a == "--skip_runtime") {
      skip_runtime = true;
    }
  }
  torch::NoGradGuard no_grad;

  Clock::time_point s = Clock::now();
  tracer::LoadedModel model = OrDie(tracer::LoadModel(path), kTool, "load");
  double load_s = SecondsSince(s);

  tracer::TraceOptions base;
  if (!leaf.empty()) base.leaf_policy.AddTypeOrPath(leaf);
  tracer::TraceOptions options =
      OrDie(tracer::WithModelFiles(model, base), kTool, "model files");
  // Trace time: median of --trace_reps (each trace clones the module and
  // walks it); bench/profile.sh raises it so that tracing dominates a profile.
  std::vector<double> trace_times;
  std::optional<runtime::GraphModule> gm;
  for (int i = 0; i < std::max(1, trace_reps); ++i) {
    s = Clock::now();
    gm.emplace(OrDie(tracer::Trace(model.module, options), kTool, "trace"));
    trace_times.push_back(SecondsSince(s));
  }
  double trace_s = Median(trace_times);
  // The share of the trace that is cloning the module (the tracer's first
  // step: Module::clone(/*inplace=*/true) in its default meta mode).
  std::vector<double> clone_times;
  for (int i = 0; i < 3; ++i) {
    s = Clock::now();
    torch::jit::Module clone = model.module.clone(/*inplace=*/true);
    clone_times.push_back(SecondsSince(s));
  }
  double clone_s = Median(clone_times);
  int64_t nodes = 0;
  for (const ir::Node* n : gm->graph().nodes()) {
    (void)n;
    ++nodes;
  }

  partition::PartitionOptions popts;
  popts.targets = {targets};
  std::vector<double> ptimes;
  size_t subgraphs = 0;
  for (int i = 0; i < partition_reps; ++i) {
    s = Clock::now();
    partition::Partition p = OrDie(
        partition::PartitionGraph(gm->graph(), popts), kTool, "partition");
    ptimes.push_back(SecondsSince(s));
    subgraphs = p.subgraphs.size();
  }
  double partition_s = Median(ptimes);

  std::string out = absl::StrCat(
      "{\"model\": \"", path, "\", \"nodes\": ", nodes,
      ", \"load_s\": ", load_s, ", \"trace_s\": ", trace_s,
      ", \"clone_s\": ", clone_s, ", \"partition_s\": ", partition_s,
      ", \"subgraphs\": ", subgraphs);

  if (!skip_runtime) {
    tracer::ExampleInputs inputs = OrDie(
        tracer::ResolveExampleInputs(model.module, options), kTool, "inputs");
    runtime::Interpreter interp =
        OrDie(runtime::Interpreter::Create(*gm), kTool, "interpreter");
    torch::jit::Module lowered =
        OrDie(runtime::LowerToTorchScript(*gm), kTool, "lower");
    torch::jit::Module original = model.module;
    original.eval();
    std::vector<c10::IValue> in = inputs.values;
    double orig_s =
        TimeMedian(runs, /*warmup=*/2, [&] { original.forward(in); });
    double interp_s =
        TimeMedian(runs, /*warmup=*/2, [&] { (void)interp.Run(in); });
    double lowered_s =
        TimeMedian(runs, /*warmup=*/2, [&] { lowered.forward(in); });
    // The three must agree, or the timings compare different work.
    at::Tensor a = original.forward(in).toTuple()->elements()[0].toTensor();
    c10::IValue iv = OrDie(interp.Run(in), kTool, "interpreter run");
    at::Tensor b = (iv.isTuple() ? iv.toTuple()->elements()[0] : iv).toTensor();
    c10::IValue lv = lowered.forward(in);
    at::Tensor c = (lv.isTuple() ? lv.toTuple()->elements()[0] : lv).toTensor();
    double err_i = (a - b).abs().max().item<double>();
    double err_l = (a - c).abs().max().item<double>();
    absl::StrAppend(
        &out, ", \"runs\": ", runs, ", \"original_s\": ", orig_s,
        ", \"interpreter_s\": ", interp_s, ", \"lowered_s\": ", lowered_s,
        ", \"interpreter_max_err\": ", err_i, ", \"lowered_max_err\": ", err_l);
  }
  absl::StrAppend(&out, "}");
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace
}  // namespace tracecut::bench

int main(int argc, char** argv) { return tracecut::bench::Main(argc, argv); }
