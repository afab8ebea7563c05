#ifndef TRACECUT_IR_TEXT_H_
#define TRACECUT_IR_TEXT_H_

// The IR's text form: one node a line, printable and parseable back to an
// identical graph. Tests build graphs from it; tools dump it. The grammar is
// in docs/ir_text_format.md.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ParseGraph(R"(
//     graph {
//       %x = placeholder[x]()
//       %w = get_attr[fc.weight]()
//       %linear = call_function[aten::linear](%x, %w, None)
//       %output = output[output](%linear)
//     })"));
//   std::string text = PrintGraph(*g);
//
// Printing is canonical and exact: ParseGraph(PrintGraph(g)) is
// StructurallyEqual to g (doubles bit for bit, strings byte for byte) and
// prints to the same text, for every graph whose arguments nest at most
// kMaxTextNesting deep and whose node names are identifiers.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ir/graph.h"

namespace tracecut::ir {

// Lists, tuples, and meta containers nest at most this deep in parsed text,
// so hostile input cannot exhaust the stack.
inline constexpr int kMaxTextNesting = 256;

struct ParseOptions {
  // Verify the parsed graph (ir/verifier.h), reporting a failure at the
  // offending node's line. Turn off only to build deliberately broken graphs
  // (a node after the output, a malformed target, no output yet).
  bool verify = true;
};

// The whole graph, ending in a newline.
std::string PrintGraph(const Graph& graph);

// One node's line, without indentation or newline:
//   %add = call_function[aten::add.Tensor](%x, %y, alpha=1)
std::string PrintNode(const Node& node);

// An argument as the text form writes it (constants, %refs, lists, tuples).
std::string PrintArgument(const Argument& arg);

// A double in the shortest form that reads back to the same bits, always
// recognisable as a double: "0.1", "1.0", "-0.0", "1e+300", "inf", "nan",
// "nan(0x7ff0000000000001)" for non-canonical NaNs.
std::string FormatDouble(double value);

// A double-quoted string; printable ASCII stays, `"` and `\` are escaped,
// \n \t \r are spelled so, and every other byte is \xNN.
std::string QuoteString(absl::string_view bytes);

// Parses the text form. Errors are InvalidArgumentError with
// "line L, column C: <what was expected>" followed by the offending line and
// a caret; undefined or later references, duplicate names and (with
// options.verify) a missing output or any verifier failure are reported the
// same way.
absl::StatusOr<std::unique_ptr<Graph>> ParseGraph(
    absl::string_view text, const ParseOptions& options = {});

}  // namespace tracecut::ir

#endif  // TRACECUT_IR_TEXT_H_
