#ifndef TRACECUT_IR_VERIFIER_H_
#define TRACECUT_IR_VERIFIER_H_

// The IR verifier (torch's lint(), XLA's HloVerifier): checks every
// invariant a well-formed Graph keeps and names the first offending node.
//
//   RETURN_IF_ERROR(Verify(graph));
//
// Graph's own mutators keep the structural invariants (use lists, order,
// names), so a failure there means memory corruption or a bug in Graph; the
// semantic ones (targets, where placeholders and the output sit, constant
// meta) are what passes and front ends get wrong. Pass pipelines run it
// before the first pass and after every pass that changed the graph.
//
// Checked, in this order:
//  * every node belongs to this graph; names are identifiers
//    ([A-Za-z_][A-Za-z0-9_]*, ir/names.h), unique, and the name index maps
//    exactly the nodes' names to them;
//  * order keys strictly increase along the node list;
//  * every referenced node is in this graph and strictly before its user;
//    kwarg names are unique identifiers;
//  * each node's users list has no duplicates and holds exactly the nodes
//    that reference it;
//  * op kinds are valid; placeholders come before all other nodes and have
//    no node operands; get_attr has no node operands; targets are
//    well-formed (see CheckTarget); scope entries' paths are "" (the root)
//    or module paths (ir/names.h);
//  * exactly one output node, last, with exactly one positional argument, no
//    kwargs and no users;
//  * node and graph meta `extra` values are constants.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"
#include "ir/names.h"  // IsIdentifier, IsModulePath: kept for callers.

namespace tracecut::ir {

// OK when `graph` keeps every invariant above; otherwise a
// FailedPreconditionError whose message starts with the offending node's
// Describe() (or "graph: " for graph-level problems).
absl::Status Verify(const Graph& graph);

// As above; on failure `*culprit` (when not null) is set to the offending
// node, or nullptr for graph-level problems. Lets callers such as the text
// parser point at the node's source line.
absl::Status Verify(const Graph& graph, const Node** culprit);

// Whether `target` is well-formed for `op`, with a message saying what was
// expected when not:
//   get_attr, call_module: a module path, segments of any characters but
//     '.' joined by '.' (IsModulePath: "model.layers.0.self_attn.q_proj",
//     "trunk_output.block1.block1-0.proj.0");
//   call_function: "ns::name" or "ns::name.overload" with identifier parts
//     ("aten::add.Tensor"), or "getitem";
//   call_method: an identifier ("view");
//   placeholder, output: any non-empty string.
absl::Status CheckTarget(OpKind op, absl::string_view target);

}  // namespace tracecut::ir

#endif  // TRACECUT_IR_VERIFIER_H_
