// Times PartitionGraph on a graph in the IR text form, or on a synthetic
// Mixtral-shaped MoE graph (partition/test_graphs.h), without LibTorch, and
// optionally dumps the complete result so that a change to the partitioner
// can be checked to produce identical partitions (diff two dumps).
//
//   partition_bench GRAPH.txt [--targets=LlamaDecoderLayer] [--reps=N]
//                   [--threads=N] [--cold] [--dump=FILE]
//   partition_bench --moe=LAYERSxEXPERTS [--write_graph=FILE] [...]
//                   (targets default to MixtralDecoderLayer)
//
// Prints one JSON object: nodes, subgraphs, partition_s (median wall time of
// reps, after one warm-up call), min_s, cpu_s (median CPU time of the
// process, both threads of a large graph's partitioning included: steadier
// than wall time on a busy machine), us_per_node (partition_s per
// node) and destroy_s (median time to free a result, not in partition_s).
// --write_graph writes the graph partitioned in the text form, so that
// another build (e.g. the one before a change) can time the same graph.
// bench/partition_scale.py runs it over the growth curve.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ir/text.h"
#include "partition/partitioner.h"
#include "partition/test_graphs.h"

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
  std::string targets, dump, path, write_graph;
  int reps = 20;
  int threads = 0;
  bool cold = false;
  int moe_layers = 0, moe_experts = 0;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (!absl::StartsWith(a, "--") && path.empty()) {
      path = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--moe=")) {
      std::vector<absl::string_view> le = absl::StrSplit(a, 'x');
      if (le.size() != 2 || !absl::SimpleAtoi(le[0], &moe_layers) ||
          !absl::SimpleAtoi(le[1], &moe_experts) || moe_layers < 1 ||
          moe_experts < 1) {
        std::fprintf(stderr, "partition_bench: --moe=LAYERSxEXPERTS, got %s\n",
                     argv[i]);
        return 2;
      }
    } else if (absl::ConsumePrefix(&a, "--write_graph=")) {
      write_graph = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--targets=")) {
      targets = std::string(a);
    } else if (absl::ConsumePrefix(&a, "--reps=")) {
      if (!absl::SimpleAtoi(a, &reps) || reps < 1) reps = 1;
    } else if (a == "--cold") {
      cold = true;
    } else if (absl::ConsumePrefix(&a, "--threads=")) {
      if (!absl::SimpleAtoi(a, &threads) || threads < 0) {
        std::fprintf(stderr, "partition_bench: --threads=N, got %s\n", argv[i]);
        return 2;
      }
    } else if (absl::ConsumePrefix(&a, "--dump=")) {
      dump = std::string(a);
    } else {
      std::fprintf(stderr, "partition_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (path.empty() == (moe_layers == 0)) {
    std::fprintf(stderr,
                 "usage: partition_bench GRAPH.txt|--moe=LAYERSxEXPERTS "
                 "[flags]\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<ir::Graph>> graph;
  if (moe_layers > 0) {
    graph = testing::BuildMoe({.layers = moe_layers, .experts = moe_experts});
    if (targets.empty()) targets = "MixtralDecoderLayer";
  } else {
    std::ifstream in(path);
    std::stringstream buf;
    buf << in.rdbuf();
    graph = ir::ParseGraph(buf.str());
    if (targets.empty()) targets = "LlamaDecoderLayer";
  }
  if (!graph.ok()) {
    std::fprintf(stderr, "partition_bench: %s\n",
                 graph.status().ToString().c_str());
    return 1;
  }
  if (!write_graph.empty()) {
    std::ofstream(write_graph) << ir::PrintGraph(**graph);
  }
  PartitionOptions options;
  options.targets = {targets};
  options.threads = threads;
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
    // The process's, not the thread's: a large graph is partitioned on two
    // threads (Note [Partitioning on two threads] in partitioner.cc).
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
  };
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
        .count();
  };
  // --cold: before each timed call, write a buffer twice the size of this
  // machine's last-level cache, so that no call finds the graph (or the
  // previous result's memory) in cache: what a single partition right after
  // loading a large graph sees, rather than a loop re-partitioning a small
  // one that stays in L2.
  std::vector<char> evict(cold ? 64 << 20 : 0);
  std::vector<double> times, cpu, destroy;
  for (int i = 0; i < reps; ++i) {
    for (size_t k = 0; k < evict.size(); k += 64) {
      evict[k] = static_cast<char>(i);
    }
    auto start = std::chrono::steady_clock::now();
    double cpu_start = cpu_now();
    std::optional<Partition> q = run();
    cpu.push_back(cpu_now() - cpu_start);
    times.push_back(since(start));
    start = std::chrono::steady_clock::now();
    q.reset();
    destroy.push_back(since(start));
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  std::sort(destroy.begin(), destroy.end());
  const double median = times[times.size() / 2];
  const size_t nodes = (*graph)->size();
  std::printf(
      "{\"nodes\": %zu, \"subgraphs\": %zu, \"partition_s\": %.9g, "
      "\"min_s\": %.9g, \"cpu_s\": %.9g, \"us_per_node\": %.4g, "
      "\"destroy_s\": %.9g, \"reps\": %d}\n",
      nodes, p.subgraphs.size(), median, times.front(), cpu[cpu.size() / 2],
      1e6 * median / nodes, destroy[destroy.size() / 2], reps);
  return 0;
}

}  // namespace
}  // namespace tracecut::partition

int main(int argc, char** argv) {
  return tracecut::partition::Main(argc, argv);
}
