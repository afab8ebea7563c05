// `tracecut trace MODEL.pt`: trace a TorchScript model into the graph IR.

#include <unistd.h>

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ir/dot.h"
#include "ir/graph.h"
#include "ir/proto.h"
#include "ir/text.h"
#include "runtime/lowering.h"
#include "tools/cli/common.h"
#include "tools/cli/graph_json.h"
#include "tools/cli/model_flags.h"
#include "tracer/tracer.h"
#include "util/json.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

absl::StatusOr<std::string> Render(const ir::Graph& graph,
                                   const std::string& format) {
  if (format == "text") return ir::PrintGraph(graph);
  if (format == "proto") return ir::SerializeGraph(graph);
  if (format == "dot") {
    ir::DotOptions options;
    options.show_scope = true;
    return ir::ToDot(graph, options);
  }
  if (format == "json") return util::DumpJson(GraphToJson(graph), 2) + "\n";
  return UsageError(absl::StrCat("unknown --format '", format,
                                 "' (text, proto, dot or json)"));
}

absl::Status RunTrace(const ParsedArgs& args, Io& io) {
  const std::string model = args.positional()[0];
  const std::string format = args.Get("format").value_or("text");
  if (format != "text" && format != "proto" && format != "dot" &&
      format != "json" && format != "torchscript") {
    return UsageError(
        absl::StrCat("unknown --format '", format,
                     "' (text, proto, dot, json or torchscript)"));
  }
  const bool json = args.Has("json");
  std::optional<std::string> output = args.Get("output");
  if (format == "torchscript" && (!output.has_value() || *output == "-")) {
    return UsageError(
        "--format=torchscript writes a .pt archive; give -o FILE");
  }
  if (output.has_value())
    RETURN_IF_ERROR(CheckOutputIsNotInput(*output, model));
  if (format == "proto" && !output.has_value() && !json) {
    // Binary on a terminal helps nobody; "-o -" still forces stdout.
    if (isatty(1)) {
      return UsageError("--format=proto writes binary; give -o FILE (or -o -)");
    }
  }

  ASSIGN_OR_RETURN(TracedModel traced, LoadAndTrace(args));
  runtime::GraphModule& gm = traced.gm;
  std::string rendered;
  if (format != "torchscript") {
    ASSIGN_OR_RETURN(rendered, Render(gm.graph(), format));
  }

  // With --json, stdout carries the summary; the graph goes to -o only.
  if (format == "torchscript") {
    // The traced graph lowered back to TorchScript, with the model's files.
    RETURN_IF_ERROR(runtime::SaveTorchScript(gm, *output));
  } else if (output.has_value()) {
    RETURN_IF_ERROR(WriteOutput(*output, rendered, io));
  } else if (!json) {
    RETURN_IF_ERROR(WriteOutput("-", rendered, io));
  }
  if (json) {
    util::Json summary = GraphSummaryJson(gm.graph());
    summary["model"] = util::Json(model);
    summary["format"] = util::Json(format);
    summary["output"] = output.has_value() ? util::Json(*output) : util::Json();
    io.out << util::DumpJson(summary, 2) << "\n";
  } else if (output.has_value() && *output != "-") {
    io.err << "tracecut trace: wrote " << *output << " (" << gm.graph().size()
           << " nodes, " << gm.graph().meta().assumptions.size()
           << " assumptions)\n";
  }
  return absl::OkStatus();
}

Subcommand TraceCommand() {
  Subcommand c;
  c.name = "trace";
  c.synopsis =
      "MODEL.pt [--leaf=TYPE_OR_PATH]... [--config=config.json] "
      "[--no-default-leaves] [--format=text|proto|dot|json|torchscript] "
      "[-o FILE] "
      "[--json]";
  c.summary = "Trace a TorchScript or torch.export model into the graph IR.";
  c.description =
      "MODEL is a TorchScript .pt, a torch.export .pt2 (see `tracecut "
      "export`), a directory holding one .pt2, or a Llama, Mistral, "
      "Qwen2, Qwen3, Phi-3, Granite or OLMo 2 checkpoint directory without "
      "one (built "
      "from "
      "its "
      "config.json). "
      "Walks the model's forward with example inputs (its embedded "
      "tracecut_inputs.json, else Hugging Face dummy inputs from its "
      "config.json), inlining submodules except leaves (torch.nn built-ins, "
      "HF Conv1D, and every --leaf). Branches on constants and input shapes "
      "are resolved and recorded as assumptions; a branch on tensor values is "
      "an error that names the module to pass to --leaf. The graph goes to "
      "stdout, or atomically to -o FILE.";
  c.flags = ModelFlags();
  c.flags.insert(
      c.flags.end(),
      {
          FlagSpec::Value(
              "format", "FORMAT",
              "text (default), proto (binary GraphProto), dot, json, "
              "or torchscript (the graph lowered to a .pt that "
              "LibTorch and torch.jit.load run; needs -o)"),
          FlagSpec::Value("output", "FILE",
                          "write the graph here ('-': stdout)")
              .Short('o'),
          FlagSpec::Bool("json",
                         "print a JSON summary (node counts per op kind, "
                         "call_module targets, assumptions) on stdout"),
      });
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunTrace;
  return c;
}

const bool kRegistered = RegisterSubcommand(TraceCommand());

}  // namespace
}  // namespace tracecut::cli
