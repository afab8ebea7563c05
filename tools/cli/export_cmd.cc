// `tracecut export`: a Hugging Face transformers model to a torch.export
// .pt2 (or a TorchScript .pt) that the other subcommands read. The work is
// Python's (transformers builds the model, torch.export traces it): this
// runs python/tracecut_export.py with the project's Python, both found as
// runfiles of the tracecut binary.

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/cli/common.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

constexpr char kScript[] = "tracecut/python/tracecut_export.py";
constexpr char kPython[] = "libtorch/python";

// A runfile of the export: found, or an error saying how to get it.
absl::StatusOr<std::string> ExportRunfile(const std::string& name) {
  absl::StatusOr<std::string> path = FindRunfile(name);
  if (!path.ok()) {
    return absl::NotFoundError(absl::StrCat(
        path.status().message(),
        "; run tracecut built by bazel (bazel run //tools:tracecut -- export "
        "...)"));
  }
  return path;
}

absl::Status RunExport(const ParsedArgs& args, Io& io) {
  if (!args.Get("output").has_value()) {
    return UsageError("give -o OUT.pt2 (where to write the program)");
  }
  ASSIGN_OR_RETURN(std::string script, ExportRunfile(kScript));
  ASSIGN_OR_RETURN(std::string python, ExportRunfile(kPython));

  // A model id (no such path) is passed through for the local HF cache.
  std::string model = args.positional()[0];
  if (std::string p = UserPath(model); access(p.c_str(), F_OK) == 0) {
    model = p;
  }
  std::vector<std::string> argv = {python, script, model, "-o",
                                   UserPath(*args.Get("output"))};
  for (const char* flag : {"batch", "seq-len", "class", "seed", "dtype"}) {
    if (std::optional<std::string> v = args.Get(flag)) {
      argv.push_back(absl::StrCat("--", flag, "=", *v));
    }
  }
  for (const char* flag :
       {"torchscript", "random-weights", "meta", "no-cache"}) {
    if (args.Has(flag)) argv.push_back(absl::StrCat("--", flag));
  }
  io.out.flush();
  io.err.flush();
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  execv(python.c_str(), c_argv.data());
  return absl::InternalError(
      absl::StrCat("cannot run ", python, ": ", std::strerror(errno)));
}

Subcommand ExportCommand() {
  Subcommand c;
  c.name = "export";
  c.synopsis =
      "HF_DIR_OR_MODEL_ID -o OUT.pt2 [--meta] [--torchscript] [--batch=N] "
      "[--seq-len=N] [--class=NAME] [--random-weights] [--seed=N] "
      "[--dtype=float32|bfloat16|float16|auto] [--no-cache]";
  c.summary =
      "Export a Hugging Face transformers model to a torch.export .pt2.";
  c.description =
      "Builds the model with transformers' own classes from a checkpoint "
      "directory (config.json + safetensors) or a model id already in the "
      "local Hugging Face cache (never downloads), exports it with "
      "torch.export (eval mode, no KV cache) and writes OUT.pt2 atomically, "
      "with config.json, the example inputs (tracecut_inputs.json) and the "
      "model class's _no_split_modules (tracecut_model.json) embedded, so "
      "`tracecut trace|partition|calibrate|transform|debug OUT.pt2` need "
      "nothing else. Writing OUT.pt2 into the checkpoint directory lets the "
      "directory itself be the MODEL argument. A model torch.export cannot "
      "export gets one error naming the module and source line. A --meta "
      "export of a checkpoint directory is cached under "
      "$TRACECUT_CACHE_DIR/export (default ~/.cache/tracecut/export), keyed "
      "by the SHA-256 of what it depends on (config.json, custom code, the "
      "safetensors' names, dtypes and shapes, the exporter and the Python "
      "packages; not the weights): exporting the same checkpoint again, or "
      "another fine-tune of the same model, copies it in milliseconds. "
      "--dtype=auto (or bfloat16) exports the program computing in "
      "config.json's dtype with transformers' own casts, as llm-compressor "
      "and transformers run the checkpoint (faster where the CPU multiplies "
      "bfloat16 natively); the default is float32.";
  c.flags = {
      FlagSpec::Value("output", "OUT.pt2", "where to write the program")
          .Short('o'),
      FlagSpec::Bool("torchscript",
                     "write a TorchScript .pt (torch.jit.trace) instead"),
      FlagSpec::Value("batch", "N", "batch size of the example inputs (2)"),
      FlagSpec::Value("seq-len", "N",
                      "sequence length of the example inputs (16)"),
      FlagSpec::Value("class", "NAME",
                      "transformers class to build (default: config.json's "
                      "architectures[0])"),
      FlagSpec::Bool("meta",
                     "build and export on the meta device: no weight is read "
                     "or held; tracecut reads the weights by name from the "
                     "checkpoint's safetensors next to OUT.pt2"),
      FlagSpec::Bool("random-weights",
                     "seeded random weights instead of the checkpoint's "
                     "(for configs without weights)"),
      FlagSpec::Value("seed", "N", "seed of --random-weights (0)"),
      FlagSpec::Value("dtype", "DTYPE",
                      "what the program computes in: float32 (default), "
                      "bfloat16, float16, or auto (config.json's dtype)"),
      FlagSpec::Bool("no-cache",
                     "export even when the export cache holds the same "
                     "export"),
  };
  c.min_positional = 1;
  c.max_positional = 1;
  c.run = RunExport;
  return c;
}

const bool kRegistered = RegisterSubcommand(ExportCommand());

}  // namespace
}  // namespace tracecut::cli
