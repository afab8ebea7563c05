// docs/api.md, "ir": build a graph with the Graph API, verify it, print its
// text form and parse it back, and draw it. No LibTorch involved.

#include <iostream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "ir/dot.h"
#include "ir/graph.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "util/status_macros.h"

namespace {

namespace ir = tracecut::ir;

absl::Status Example() {
  // [START ir]
  ir::Graph g;
  ASSIGN_OR_RETURN(ir::Node * x, g.Placeholder("x"));
  ASSIGN_OR_RETURN(ir::Node * w, g.GetAttr("fc.weight"));
  ASSIGN_OR_RETURN(ir::Node * y,
                   g.CallFunction("aten::linear",
                                  {ir::Argument::Ref(x), ir::Argument::Ref(w),
                                   ir::Argument::None()}));
  ASSIGN_OR_RETURN(ir::Node * relu,
                   g.CallFunction("aten::relu", {ir::Argument::Ref(y)}));
  RETURN_IF_ERROR(g.Output(ir::Argument::Ref(relu)).status());
  RETURN_IF_ERROR(ir::Verify(g));  // Names the offending node on failure.

  // The text form is exact: parsing it gives the same graph.
  const std::string text = ir::PrintGraph(g);
  ASSIGN_OR_RETURN(std::unique_ptr<ir::Graph> parsed, ir::ParseGraph(text));
  if (!ir::StructurallyEqual(g, *parsed)) {
    return absl::InternalError("the text form did not round-trip");
  }
  std::cout << text << ir::ToDot(*parsed);  // Graphviz: dot -Tsvg
  // [END ir]
  return absl::OkStatus();
}

}  // namespace

int main() {
  absl::Status status = Example();
  if (!status.ok()) {
    std::cerr << status << "\n";
    return 1;
  }
  return 0;
}
