#ifndef TRACECUT_IR_PROTO_H_
#define TRACECUT_IR_PROTO_H_

// Graph <-> GraphProto (ir/graph.proto), and the binary form that
// `tracecut trace --format=proto` writes.
//
//   GraphProto proto;
//   ToProto(graph, &proto);
//   ASSIGN_OR_RETURN(std::unique_ptr<Graph> copy, FromProto(proto));
//   // StructurallyEqual(graph, *copy)
//
//   ASSIGN_OR_RETURN(std::string bytes, SerializeGraph(graph));
//   ASSIGN_OR_RETURN(std::unique_ptr<Graph> back, DeserializeGraph(bytes));
//
// The conversion is exact (doubles bit for bit, strings byte for byte) and
// the bytes are deterministic: the same graph always serializes the same.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/graph.pb.h"

namespace tracecut::ir {

struct FromProtoOptions {
  // Verify the result (ir/verifier.h). Turn off only to load deliberately
  // broken graphs.
  bool verify = true;
};

// Overwrites `proto` with `graph`.
void ToProto(const Graph& graph, GraphProto* proto);

// Builds a graph from `proto`, checking what the proto itself cannot
// enforce: names are unique identifiers, op kinds are known, every argument
// has a value, references name earlier nodes, meta holds constants, and
// (with options.verify) every verifier invariant. Errors are
// InvalidArgumentError naming the node ("node #3 %linear: ...").
absl::StatusOr<std::unique_ptr<Graph>> FromProto(
    const GraphProto& proto, const FromProtoOptions& options = {});

// Deterministic binary serialization of ToProto(graph).
absl::StatusOr<std::string> SerializeGraph(const Graph& graph);

// Parses what SerializeGraph wrote and runs FromProto on it. Allows the
// argument nesting the text form allows (kMaxTextNesting), deeper than
// protobuf's default recursion limit.
absl::StatusOr<std::unique_ptr<Graph>> DeserializeGraph(
    absl::string_view bytes, const FromProtoOptions& options = {});

}  // namespace tracecut::ir

#endif  // TRACECUT_IR_PROTO_H_
