// Times PartitionGraph on a graph in the IR text form, without LibTorch, and
// optionally dumps the complete result so that a change to the partitioner
// can be checked to produce identical partitions (diff two dumps).
//
//   partition_bench GRAPH.txt [--targets=LlamaDecoderLayer] [--reps=N]
//                   [--dump=FILE]
//
// Prints one JSON object: nodes, subgraphs, partition_s (median wall time of
// reps, after one warm-up call), min_s, and cpu_s (median thread CPU time:
// steadier than wall time on a busy machine).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "ir/text.h"
#include "partition/partitioner.h"

namespace tracecut::partition {
namespace {

std::string Dump(const Partition& p) {
  std::string s;
  auto list = [&](absl::string_view what, const std::vector<std::string>& v) {
    absl::StrAppend(&s, what, ": [", absl::StrJoin(v, ", "), "]\n");
  };
  list("targets_used", p.targets_used);
  list("model_inputs", p.model_inputs);
  list("model_outputs", p.model_outputs);
  list("warnings", p.warnings);
  for (const Subgraph& sub : p.subgraphs) {
    absl::StrAppend(&s, "== subgraph ", sub.index, " nodes=", sub.node_count,
                    " param_bytes=", sub.param_bytes, "\n");
    list("module_paths", sub.module_paths);
    list("input_names", sub.input_names);
    list("output_names", sub.output_names);
    list("last_use", sub.last_use);
    list("param_targets", sub.param_targets);
    list("leaf_modules", sub.leaf_modules);
    list("warnings", sub.warnings);
    absl::StrAppend(&s, ir::PrintGraph(*sub.graph));
  }
  absl::StrAppend(&s, "== output graph\n", ir::PrintGraph(*p.output_graph));
  std::vector<std::pair<std::string, int>> home(p.home.begin(), p.home.end());
  std::sort(home.begin(), home.end());
  for (const auto& [name, h] : home) absl::StrAppend(&s, name, " @", h, "\n");
  return s;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: partition_bench GRAPH.txt [flags]\n");
    return 2;
  }
  std::string targets = "LlamaDecoderLayer", dump;
  int reps = 20;
  for (int i = 2; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--targets=")) {
      targets = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--reps=")) {
      if (!absl::SimpleAtoi(a, &reps) || reps < 1) reps = 1;
    } else if (absl::ConsumePrefix(&a, "--dump=")) {
      dump = std::string(a);
    } else {
      std::fprintf(stderr, "partition_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  std::ifstream in(argv[1]);
  std::stringstream buf;
  buf << in.rdbuf();
  auto graph = ir::ParseGraph(buf.str());
  if (!graph.ok()) {
    std::fprintf(stderr, "partition_bench: %s\n",
                 graph.status().ToString().c_str());
    return 1;
  }
  PartitionOptions options;
  options.targets = {targets};
  auto run = [&] {
    auto p = PartitionGraph(**graph, options);
    if (!p.ok()) {
      std::fprintf(stderr, "partition_bench: %s\n",
                   p.status().ToString().c_str());
      std::exit(1);
    }
    return *std::move(p);
  };
  Partition p = run();  // Warm-up; also the one dumped.
  if (!dump.empty()) {
    std::ofstream(dump) << Dump(p);
  }
  auto cpu_now = [] {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
  };
  std::vector<double> times, cpu;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    double cpu_start = cpu_now();
    Partition q = run();
    cpu.push_back(cpu_now() - cpu_start);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  std::printf(
      "{\"nodes\": %zu, \"subgraphs\": %zu, \"partition_s\": %.9g, "
      "\"min_s\": %.9g, \"cpu_s\": %.9g}\n",
      (*graph)->size(), p.subgraphs.size(), times[times.size() / 2],
      times.front(), cpu[cpu.size() / 2]);
  return 0;
}

}  // namespace
}  // namespace tracecut::partition

int main(int argc, char** argv) {
  return tracecut::partition::Main(argc, argv);
}
