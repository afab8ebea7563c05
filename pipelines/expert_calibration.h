#ifndef TRACECUT_PIPELINES_EXPERT_CALIBRATION_H_
#define TRACECUT_PIPELINES_EXPERT_CALIBRATION_H_

// Calibrating every expert of an MoE block on all the tokens of its layer
// (llm-compressor's `calibrate_all_experts`), without changing what the
// layer computes.
//
// In a sparse MoE block each expert runs on the tokens the router sends it:
// an expert the router rarely picks gets few calibration tokens, one it
// never picks gets none. With this option, the calibration pass still runs
// the model as it is (its outputs are unchanged), but the modifiers see each
// expert's Linears called on every token of the block instead: after each
// batch, a copy of the expert's nodes runs on the tokens the block gathered
// the expert's input from, and the routed calls are not calibration data.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<AllExpertsRunner> experts,
//                    AllExpertsRunner::Create(subgraph, root, pattern));
//   experts->AttachCapture(main_interpreter);   // before the batches
//   ... main_interpreter.Run(batch) ...
//   RETURN_IF_ERROR(experts->RunOnAllTokens());  // after each batch
//
// What counts as an expert: a module instance whose path matches `pattern`
// (partitioner syntax; kDefaultExpertPattern: "...experts.N", transformers
// v4's Mixtral, Qwen2-MoE, DeepSeek, and llm-compressor's convention). Its
// region is every node scoped inside it. The region must read exactly one
// value from outside (parameter reads aside): its tokens, a row gather
// (aten::index / index_select, possibly followed by view / reshape /
// unsqueeze / squeeze / flatten / contiguous) of the block's token matrix.
// Anything else is an error naming the expert, not a silent fallback.
// Expert networks must be token-wise (an MLP is): each token's output
// depends on that token only.

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "runtime/interpreter.h"

namespace tracecut::pipelines {

inline constexpr char kDefaultExpertPattern[] = "re:(.+\\.)?experts\\.[0-9]+";

// One expert's nodes, runnable on its own.
struct ExpertRegion {
  std::string path;    // "model.layers.0.block_sparse_moe.experts.3"
  std::string gather;  // The row-gather node; its operand 0 is all tokens.
  // Rank of the value the region reads (its tokens), from meta; -1 when
  // unknown.
  int64_t entry_rank = -1;
  // A placeholder "tokens" (standing for `entry`), parameter reads, copies
  // of the region's nodes (same names, targets, scopes) and an output
  // returning the region's last node.
  std::unique_ptr<ir::Graph> graph;
};

// The expert regions of `graph`, in graph order. Errors name the expert.
absl::StatusOr<std::vector<ExpertRegion>> FindExpertRegions(
    const ir::Graph& graph, absl::string_view pattern = kDefaultExpertPattern);

class AllExpertsRunner {
 public:
  // Regions of `graph` (whose get_attr / call_module targets are paths in
  // `root`), each with an interpreter. No expert in the graph is not an
  // error: empty() is then true and the runner does nothing.
  static absl::StatusOr<std::unique_ptr<AllExpertsRunner>> Create(
      const ir::Graph& graph, const torch::jit::Module& root,
      absl::string_view pattern = kDefaultExpertPattern);

  bool empty() const { return regions_.empty(); }
  const std::vector<ExpertRegion>& regions() const { return regions_; }

  // True when the module at `path` lies inside an expert: its calls in the
  // main run see only the routed tokens and are not calibration data.
  bool InExpert(absl::string_view path) const;

  // Adds a node hook to the interpreter running `graph` that keeps, per
  // batch, the token matrix each expert is gathered from.
  runtime::Interpreter::HookId AttachCapture(runtime::Interpreter& main);

  // The interpreters that run the experts on all tokens: attach the
  // calibration hooks to these.
  std::vector<runtime::Interpreter*> expert_interpreters();

  // Runs every expert whose tokens were captured in the last main run on
  // all of them, then forgets them. Errors name the expert.
  absl::Status RunOnAllTokens();

 private:
  AllExpertsRunner() = default;

  std::vector<ExpertRegion> regions_;
  std::vector<std::unique_ptr<runtime::Interpreter>> interpreters_;
  absl::flat_hash_map<std::string, int> region_of_gather_;
  std::vector<std::string> prefixes_;  // "<expert path>."
  std::vector<c10::IValue> captured_;  // Per region; None when not run.
};

}  // namespace tracecut::pipelines

#endif  // TRACECUT_PIPELINES_EXPERT_CALIBRATION_H_
