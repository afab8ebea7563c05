#ifndef TRACECUT_PARTITION_PARTITIONER_H_
#define TRACECUT_PARTITION_PARTITIONER_H_

// Topological partitioner: splits a traced graph into subgraphs at
// sequential targets (e.g. every LlamaDecoderLayer), so that running the
// subgraphs in order, each reading only values produced before it, computes
// the whole model (llm-compressor's sequential pipeline, natively).
//
//   PartitionOptions options;
//   options.targets = {"LlamaDecoderLayer"};
//   ASSIGN_OR_RETURN(Partition p, PartitionGraph(graph, options));
//   // p.subgraphs: head (embedding, mask, rotary), layer 0, ..., layer N-1
//   // (with the final norm and lm_head).
//
// How nodes are assigned (Note [Placement] in partitioner.cc has the why):
//
// * A node belongs to a target instance when a module in its scope stack
//   (or, for call_module, the called leaf) matches a target pattern and no
//   module at or above it matches an ignore pattern. With nested matches the
//   outermost one wins by default (Nesting::kInnermost picks the innermost).
// * Each target instance starts a new subgraph, in graph order of its first
//   node; `targets_per_subgraph` or `max_param_bytes` group consecutive
//   instances into one subgraph.
// * Computation before the first target node forms the head subgraph
//   (omitted when it computes nothing). Every other node outside a target is
//   placed in the subgraph of its earliest consumer, so what follows the
//   last target goes with it (the tail). Dead nodes stay with their inputs.
// * get_attr reads are parameter references, not values: each subgraph that
//   uses a parameter reads it itself; the node's home is the earliest.
// * No subgraph ever reads a value produced by a later one. When targets
//   cannot be ordered that way (a target module that runs twice around
//   another, or an outer target whose own nodes surround an inner target
//   under kInnermost), PartitionGraph fails naming both module paths.
//
// Runs in time linear in the graph's size, up to a binary search per
// operand reference (plus pattern matching once per distinct module path);
// the subgraphs share the original's scope stacks (see ir::Scope).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "partition/subgraph.h"

namespace tracecut::partition {

// Which instance wins when target instances nest (a LlamaMLP target inside a
// LlamaDecoderLayer target).
enum class Nesting {
  kOutermost,  // The outer instance takes the inner one's nodes.
  kInnermost,  // Each node goes to the innermost instance it is in.
};

// Bytes held at a dotted path of the root module: a parameter or buffer
// (get_attr targets), or a leaf module's parameters and buffers together
// (call_module targets). nullopt when unknown.
using ParamBytesFn =
    std::function<std::optional<int64_t>(absl::string_view path)>;

// A ParamBytesFn over a fixed map (paths missing from it are unknown).
ParamBytesFn ParamBytesFromMap(absl::flat_hash_map<std::string, int64_t> map);

// Bytes of one tensor from its meta (shape and dtype both known), else
// nullopt.
std::optional<int64_t> TensorBytes(const ir::TensorMeta& meta);

struct PartitionOptions {
  // Module patterns (ir/module_pattern.h, the syntax of --leaf too) that
  // start a subgraph. Each is matched against every module in a node's
  // scope stack:
  //   "LlamaDecoderLayer"                  short type
  //   "transformers.models.llama.modeling_llama.LlamaDecoderLayer"
  //                                        qualified (demangled) type
  //   "model.layers.3"                     module path
  //   "model.layers.*", "*DecoderLayer"    glob on the path or the type
  //                                        (on a path '*' and '?' stop at
  //                                        '.', '**' does not; path
  //                                        segments are any PyTorch name,
  //                                        ir/names.h:
  //                                        "trunk_output.*.block1-*"; on a
  //                                        type '*' spans '.')
  //   "re:.*layers\.[0-9]+"                ECMAScript regex, full match on
  //                                        the path or either type
  std::vector<std::string> targets;
  // Modules (same pattern syntax) that never start a subgraph; nothing
  // inside them does either.
  std::vector<std::string> ignore;
  // Consecutive target instances per subgraph. 0 (the default) means one
  // without a budget and no limit with one.
  int targets_per_subgraph = 0;
  // When > 0, consecutive targets share a subgraph while the parameters the
  // subgraph reads stay within this many bytes. A target over the budget on
  // its own gets a subgraph to itself and a warning.
  int64_t max_param_bytes = 0;
  Nesting nesting = Nesting::kOutermost;
  // Parameter sizes. When unset, get_attr sizes come from the node's meta
  // (shape and dtype) and leaf modules count as unknown.
  ParamBytesFn param_bytes;
  // 1: partition on the calling thread only. Otherwise a graph of a few
  // thousand nodes or more is partitioned on two threads (the result is the
  // same); `param_bytes` is only called from the calling thread.
  int threads = 0;
};

// "outermost" / "innermost".
absl::string_view NestingName(Nesting nesting);

// Whether one target/ignore pattern (syntax above) matches a module:
// ir::ModulePattern(pattern).Matches(path, type).
// `type` is the demangled qualified type ("" when unknown). An invalid
// "re:" pattern matches nothing; PartitionGraph reports it as an error.
bool ModulePatternMatches(absl::string_view pattern, absl::string_view path,
                          absl::string_view type);

// Partitions `graph` (left unchanged). Errors: no targets given, an invalid
// pattern, targets matching no module (the message lists the module types
// that occur more than once, the likely layer types), targets that cannot be
// ordered (naming both module paths), a graph without an output node.
absl::StatusOr<Partition> PartitionGraph(const ir::Graph& graph,
                                         const PartitionOptions& options);

// Internal error unless `partition` (of `graph`) places every sequential
// target instance in exactly one subgraph: each path of a module_paths list
// appears in no other subgraph's, and every module call and computation
// scoped inside an instance has that instance's subgraph as its home.
// PartitionGraph checks its own result with it; exposed for tests.
absl::Status CheckTargetPlacement(const ir::Graph& graph,
                                  const Partition& partition);

}  // namespace tracecut::partition

#endif  // TRACECUT_PARTITION_PARTITIONER_H_
