#ifndef TRACECUT_TRANSFORMS_TRANSFORMATION_H_
#define TRACECUT_TRANSFORMS_TRANSFORMATION_H_

// The pass API (Optimum's Transformation / ReversibleTransformation, XLA's
// HloPassInterface): a pass rewrites a GraphModule in place and says whether
// it changed anything. Passes never run on a user's module directly: a
// PassPipeline (pipeline.h) runs them on a GraphModule::Clone().
//
//   class MyPass : public Transformation {
//    public:
//     absl::string_view name() const override { return "my-pass"; }
//     absl::StatusOr<bool> Run(runtime::GraphModule& gm) override;
//   };
//
// Every node a pass creates or rewrites carries a TransformMark
// {pass: name(), data} in its meta (see Note [Transform marks]). Marks are
// plain meta, so they survive Graph::Clone, the text form and the protobuf
// form, and a ReversibleTransformation undoes its changes from the marks and
// the originals it kept, never from state inside the pass object: any
// instance of the pass can reverse a module another instance transformed.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "runtime/graph_module.h"

namespace tracecut::transforms {

class Transformation {
 public:
  virtual ~Transformation() = default;

  // kebab-case, unique among passes ("merge-linears").
  virtual absl::string_view name() const = 0;

  // True when the rewritten module computes the same function as before: the
  // same mathematical result, with at most floating-point rounding
  // differences from reassociated arithmetic (each pass documents and tests
  // its bound). Approximations (gelu-tanh-approx, inexact reciprocals)
  // return false.
  virtual bool preserves_computation() const { return true; }

  // Whether this pass can be undone (it is a ReversibleTransformation whose
  // Reverse is usable).
  virtual bool is_reversible() const { return false; }

  // How many application ids (Note [Transform marks]) one Run may use: 1
  // for a pass, the sum over its passes for a pipeline.
  virtual int application_count() const { return 1; }

  // Rewrites `gm` in place. Returns true when anything changed. A pattern
  // that does not apply is not an error (the pass returns false); errors mean
  // bad input or a bug and name the node involved.
  virtual absl::StatusOr<bool> Run(runtime::GraphModule& gm) = 0;
};

class ReversibleTransformation : public Transformation {
 public:
  bool is_reversible() const override { return true; }

  // Undoes the most recent application of this pass to `gm` (the marks with
  // the highest application id, Note [Transform marks]), restoring the
  // graph and every parameter bit for bit. Returns false when `gm` holds no
  // application of this pass. Fails with FAILED_PRECONDITION, changing
  // nothing, when a later pass rewrote the same nodes and has not been
  // undone first.
  virtual absl::StatusOr<bool> Reverse(runtime::GraphModule& gm) = 0;
};

// Note [Transform marks]
// A pass records what it did in ir::NodeMeta::transforms: one
// TransformMark{pass, data} per node it created or rewrote. data["app"] is
// the application id: one more than the largest id of any mark in the graph
// when the pass starts (so ids increase along a pipeline and are reused after
// a reversal). Reverse undoes the marks of its pass with the largest id,
// which is what "undo the last application" means even when a pipeline runs
// the same pass twice. The rest of `data` is up to the pass: names of the
// original modules, snapshots of erased nodes (rewrite_util.h), sizes.
inline constexpr absl::string_view kAppKey = "app";

// Pipelines pin the id each pass step uses (graph meta extra
// kPinnedAppKey, present only while the pass runs), so that every subgraph
// of a partition gives step i the same id and the reassembled graph can be
// undone step by step (per_subgraph.h).
inline constexpr absl::string_view kPinnedAppKey = "tracecut.transform_app";

// The application id the next pass run on `graph` should use: the pinned id
// when there is one, else one more than the largest id of any mark.
int64_t NextApplicationId(const ir::Graph& graph);

// Pins (or, with nullopt, unpins) the id NextApplicationId returns.
void PinApplicationId(ir::Graph& graph, std::optional<int64_t> app);

// The pinned id, if any.
std::optional<int64_t> PinnedApplicationId(const ir::Graph& graph);

// The largest application id among `pass`'s marks, or nullopt.
std::optional<int64_t> LatestApplicationId(const ir::Graph& graph,
                                           absl::string_view pass);

// Appends a mark {pass, data + {"app": app}} to `node`.
void MarkTransformed(ir::Node* node, absl::string_view pass, int64_t app,
                     std::map<std::string, std::string> data = {});

// `node`'s last mark by `pass` (any application when `app` is nullopt), or
// nullptr.
const ir::TransformMark* FindMark(const ir::Node& node, absl::string_view pass,
                                  std::optional<int64_t> app = std::nullopt);

// The application id of a mark (-1 when missing or malformed).
int64_t MarkApplicationId(const ir::TransformMark& mark);

// Removes `node`'s marks by `pass` with application id `app`. Returns how
// many were removed.
int RemoveMarks(ir::Node* node, absl::string_view pass, int64_t app);

// Nodes carrying a mark by `pass_name` (any application), in graph order.
std::vector<ir::Node*> GetTransformedNodes(const ir::Graph& graph,
                                           absl::string_view pass_name);

// Nodes carrying a mark by `pass_name` from application `app`.
std::vector<ir::Node*> GetTransformedNodes(const ir::Graph& graph,
                                           absl::string_view pass_name,
                                           int64_t app);

// OK when application `app` of `pass` is the most recent application still
// marked anywhere in `graph`; otherwise FAILED_PRECONDITION naming a node
// and the later pass to undo first. Every Reverse starts with this: a later
// pass may have replaced this pass's nodes (their marks then live only in
// that pass's snapshots), so undoing out of order is never safe.
absl::Status CheckIsLatestApplication(const ir::Graph& graph,
                                      absl::string_view pass, int64_t app);

// OK when `mark` is the last mark on `node` (nothing later rewrote the node),
// else FAILED_PRECONDITION naming the node and the later pass.
absl::Status CheckLastMark(const ir::Node& node, const ir::TransformMark& mark);

}  // namespace tracecut::transforms

#endif  // TRACECUT_TRANSFORMS_TRANSFORMATION_H_
