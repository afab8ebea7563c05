#ifndef TRACECUT_TOOLS_CLI_MODEL_FLAGS_H_
#define TRACECUT_TOOLS_CLI_MODEL_FLAGS_H_

// The flags that say how MODEL is traced, shared by `trace`, `partition`
// and `transform`/`debug`: leaves, the HF config, and example inputs.
//
//   c.flags = ModelFlags();  // plus the command's own
//   ASSIGN_OR_RETURN(TracedModel t, LoadAndTrace(args));
//
// Example inputs, in the order they win: --example-inputs=FILE (a
// torch.save'd tensor, list, tuple or dict of tensors, matched to the
// forward's arguments by position or by name), --input=NAME:DTYPE[D0,...]
// (repeatable; values normal, or :ones, :zeros, :tokens=HIGH), the
// model's embedded tracecut_inputs.json, a torch.export program's own
// example inputs, then Hugging Face dummy inputs from its config.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/graph_module.h"
#include "tools/cli/common.h"
#include "tracer/hf/inputs.h"
#include "tracer/load.h"
#include "tracer/tracer.h"

namespace tracecut::cli {

std::vector<FlagSpec> ModelFlags();

struct TracedModel {
  tracer::LoadedModel loaded;
  tracer::TraceOptions options;  // As resolved (config, inputs, leaves).
  runtime::GraphModule gm;
};

// Loads args.positional()[0] and traces it as the flags say. Errors name
// the model file.
absl::StatusOr<TracedModel> LoadAndTrace(const ParsedArgs& args);

// "input_ids:int64[2,16]:tokens=32000" -> an InputSpec; usage errors say
// what is wrong.
absl::StatusOr<tracer::hf::InputSpec> ParseInputFlag(absl::string_view flag);

}  // namespace tracecut::cli

#endif  // TRACECUT_TOOLS_CLI_MODEL_FLAGS_H_
