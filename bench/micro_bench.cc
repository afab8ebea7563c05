// Micro-benchmarks of tracecut's own code with Google Benchmark: tracing,
// partitioning, running the graph (interpreter and lowered module), the GPTQ
// solve, and the JSON the CLI writes. The side-by-side runs against peers
// stay in bench_main, pipeline_bench, transforms_bench and gptq_bench
// (driven by run_all.sh and report.py).
//
//   bazel run -c opt //bench:micro_bench -- [MODEL.pt]
//   [--benchmark_filter=Trace]
//
// MODEL.pt defaults to the llama fixture (tests/fixtures/llama.pt, relative
// to the runfiles directory that `bazel run` starts in).

#include <benchmark/benchmark.h>
#include <torch/script.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/bench_util.h"
#include "partition/partitioner.h"
#include "partition/plan.h"
#include "quantization/gptq.h"
#include "runtime/graph_module.h"
#include "runtime/interpreter.h"
#include "runtime/lowering.h"
#include "tracer/load.h"
#include "tracer/tracer.h"
#include "util/json.h"

namespace tracecut::bench {
namespace {

constexpr char kTool[] = "micro_bench";

std::string& ModelPath() {
  static auto* path = new std::string("tests/fixtures/llama.pt");
  return *path;
}

// The model, traced once, with what the benchmarks below run on it.
struct Traced {
  tracer::LoadedModel model;
  tracer::TraceOptions options;
  runtime::GraphModule gm;
  std::vector<c10::IValue> inputs;
};

const Traced& Model() {
  static const Traced* traced = [] {
    torch::NoGradGuard no_grad;
    tracer::LoadedModel model =
        OrDie(tracer::LoadModel(ModelPath()), kTool, "load");
    tracer::TraceOptions options =
        OrDie(tracer::WithModelFiles(model, {}), kTool, "model files");
    runtime::GraphModule gm =
        OrDie(tracer::Trace(model.module, options), kTool, "trace");
    std::vector<c10::IValue> inputs =
        OrDie(tracer::ResolveExampleInputs(model.module, options), kTool,
              "inputs")
            .values;
    return new Traced{std::move(model), std::move(options), std::move(gm),
                      std::move(inputs)};
  }();
  return *traced;
}

partition::PartitionOptions DecoderLayers() {
  partition::PartitionOptions options;
  options.targets = {"LlamaDecoderLayer"};
  return options;
}

void BM_Trace(benchmark::State& state) {
  const Traced& t = Model();
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        OrDie(tracer::Trace(t.model.module, t.options), kTool, "trace"));
  }
  state.counters["nodes"] = static_cast<double>(t.gm.graph().size());
}
BENCHMARK(BM_Trace)->Unit(benchmark::kMillisecond);

void BM_PartitionGraph(benchmark::State& state) {
  const Traced& t = Model();
  const partition::PartitionOptions options = DecoderLayers();
  size_t subgraphs = 0;
  for (auto _ : state) {
    partition::Partition p = OrDie(
        partition::PartitionGraph(t.gm.graph(), options), kTool, "partition");
    subgraphs = p.subgraphs.size();
    benchmark::DoNotOptimize(p);
  }
  state.counters["subgraphs"] = static_cast<double>(subgraphs);
}
BENCHMARK(BM_PartitionGraph)->Unit(benchmark::kMicrosecond);

void BM_PlanToJson(benchmark::State& state) {
  const Traced& t = Model();
  const partition::PartitionOptions options = DecoderLayers();
  partition::Partition p = OrDie(
      partition::PartitionGraph(t.gm.graph(), options), kTool, "partition");
  const partition::PartitionPlan plan = partition::BuildPlan(p, options);
  size_t bytes = 0;
  for (auto _ : state) {
    std::string json = partition::PlanToJson(plan);
    bytes = json.size();
    benchmark::DoNotOptimize(json);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_PlanToJson)->Unit(benchmark::kMicrosecond);

void BM_ParseJson(benchmark::State& state) {
  const Traced& t = Model();
  const partition::PartitionOptions options = DecoderLayers();
  partition::Partition p = OrDie(
      partition::PartitionGraph(t.gm.graph(), options), kTool, "partition");
  const std::string text =
      partition::PlanToJson(partition::BuildPlan(p, options));
  for (auto _ : state) {
    benchmark::DoNotOptimize(OrDie(util::ParseJson(text), kTool, "parse"));
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_ParseJson)->Unit(benchmark::kMicrosecond);

void BM_InterpreterRun(benchmark::State& state) {
  const Traced& t = Model();
  torch::NoGradGuard no_grad;
  runtime::Interpreter interp =
      OrDie(runtime::Interpreter::Create(t.gm), kTool, "interpreter");
  for (auto _ : state) {
    benchmark::DoNotOptimize(OrDie(interp.Run(t.inputs), kTool, "run"));
  }
}
BENCHMARK(BM_InterpreterRun)->Unit(benchmark::kMicrosecond);

void BM_LoweredForward(benchmark::State& state) {
  const Traced& t = Model();
  torch::NoGradGuard no_grad;
  torch::jit::Module lowered =
      OrDie(runtime::LowerToTorchScript(t.gm), kTool, "lower");
  std::vector<c10::IValue> inputs = t.inputs;
  for (auto _ : state) benchmark::DoNotOptimize(lowered.forward(inputs));
}
BENCHMARK(BM_LoweredForward)->Unit(benchmark::kMicrosecond);

// One Linear's solve: W [n, n] against the Hessian of 4n random tokens,
// int4 in groups of 128 (the default recipe's scheme).
void BM_GptqQuantize(benchmark::State& state) {
  const int64_t n = state.range(0);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const at::Tensor w = torch::randn({n, n});
  quantization::HessianAccumulator acc(n);
  OrDie(acc.Add(torch::randn({4 * n, n})), kTool, "hessian");
  quantization::GptqOptions options;
  options.scheme.bits = 4;
  options.scheme.group_size = 128;
  for (auto _ : state) {
    benchmark::DoNotOptimize(OrDie(
        quantization::GptqQuantize(w, acc.hessian(), options), kTool, "gptq"));
  }
}
BENCHMARK(BM_GptqQuantize)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tracecut::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // What Initialize leaves: at most the model path.
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::fprintf(stderr,
                 "usage: micro_bench [MODEL.pt] [--benchmark_* flags]\n");
    return 2;
  }
  if (argc == 2) tracecut::bench::ModelPath() = argv[1];
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
