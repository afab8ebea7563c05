#include "tools/cli/model_flags.h"

#include <torch/script.h>

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/torch_status.h"
#include "tracer/input_files.h"
#include "util/status_macros.h"

namespace tracecut::cli {
namespace {

constexpr char kInputSyntax[] =
    "NAME:DTYPE[D0,D1,...][:ones|:zeros|:tokens=HIGH]";

}  // namespace

std::vector<FlagSpec> ModelFlags() {
  return {
      FlagSpec::Value("leaf", "TYPE_OR_PATH",
                      "keep this module type (LlamaRMSNorm, or qualified) or "
                      "module path/glob (model.layers.*.mlp) as a call_module")
          .Repeated(),
      FlagSpec::Bool("no-default-leaves",
                     "inline torch.nn built-ins and Conv1D too (only --leaf "
                     "modules stay call_module)"),
      FlagSpec::Value(
          "dtype", "DTYPE",
          "what a checkpoint directory without a .pt2, built from its "
          "config.json, computes in: float32 (default), bfloat16, float16, "
          "or auto (config.json's dtype, as llm-compressor and transformers "
          "load it: ~3x faster where the CPU multiplies bfloat16 natively, "
          "with bfloat16's rounding); a .pt2 or .pt keeps its own"),
      FlagSpec::Value("config", "FILE",
                      "HF config.json to use instead of the embedded one")
          .InputFile(16 << 20),
      FlagSpec::Value(
          "input", "SPEC",
          absl::StrCat("describe an example input of forward: ", kInputSyntax,
                       ", e.g. x:float32[1,3,224,224] or "
                       "input_ids:int64[2,16]:tokens=32000 "
                       "(repeatable; wins over the model's "
                       "embedded inputs)"))
          .Repeated(),
      FlagSpec::Value("example-inputs", "FILE",
                      "a torch.save'd tensor, list, tuple or dict of "
                      "tensors: forward's example inputs by position or "
                      "argument name")
          .InputFile(),
  };
}

absl::StatusOr<tracer::hf::InputSpec> ParseInputFlag(absl::string_view flag) {
  auto usage = [&](absl::string_view why) {
    return UsageError(absl::StrCat("--input=", flag, ": ", why, " (want ",
                                   kInputSyntax, ")"));
  };
  tracer::hf::InputSpec spec;
  size_t colon = flag.find(':');
  size_t open = flag.find('[');
  size_t close = flag.find(']');
  if (colon == absl::string_view::npos || open == absl::string_view::npos ||
      close == absl::string_view::npos || open < colon || close < open) {
    return usage("not NAME:DTYPE[SHAPE]");
  }
  spec.name = std::string(flag.substr(0, colon));
  if (spec.name.empty()) return usage("no argument name");
  spec.dtype = std::string(flag.substr(colon + 1, open - colon - 1));
  if (!tracer::hf::IsKnownDType(spec.dtype)) {
    return usage(absl::StrCat("unknown dtype '", spec.dtype,
                              "' (float32, float16, bfloat16, int64, ...)"));
  }
  absl::string_view dims = flag.substr(open + 1, close - open - 1);
  for (absl::string_view d : absl::StrSplit(dims, ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(d, &n) || n < 0) {
      return usage(absl::StrCat("'", d, "' is not a dimension"));
    }
    spec.shape.push_back(n);
  }
  absl::string_view rest = flag.substr(close + 1);
  if (rest.empty() || rest == ":normal") {
    spec.kind = "normal";
  } else if (rest == ":ones" || rest == ":zeros") {
    spec.kind = std::string(rest.substr(1));
  } else if (absl::ConsumePrefix(&rest, ":tokens=")) {
    int64_t high = 0;
    if (!absl::SimpleAtoi(rest, &high) || high < 1) {
      return usage("tokens=HIGH wants an integer >= 1");
    }
    spec.kind = "tokens";
    spec.high = high;
  } else {
    return usage(absl::StrCat("unknown value kind '", rest, "'"));
  }
  return spec;
}

absl::StatusOr<TracedModel> LoadAndTrace(const ParsedArgs& args) {
  const std::string path = args.positional()[0];
  tracer::TraceOptions options;
  if (args.Has("no-default-leaves")) {
    options.leaf_policy = tracer::LeafPolicy::None();
  }
  for (std::string& leaf : args.GetAll("leaf")) {
    options.leaf_policy.AddTypeOrPath(std::move(leaf));
  }
  if (std::optional<std::string> config = args.Get("config")) {
    options.config_path = *config;
  }
  for (const std::string& flag : args.GetAll("input")) {
    ASSIGN_OR_RETURN(tracer::hf::InputSpec spec, ParseInputFlag(flag));
    options.input_specs.push_back(std::move(spec));
  }
  tracer::LoadOptions load;
  load.dtype = args.Get("dtype").value_or("");
  ASSIGN_OR_RETURN(tracer::LoadedModel loaded, tracer::LoadModel(path, load));
  if (std::optional<std::string> file = args.Get("example-inputs")) {
    ASSIGN_OR_RETURN(options.example_inputs,
                     tracer::ReadExampleInputs(*file, loaded.module));
  }
  ASSIGN_OR_RETURN(options, tracer::WithModelFiles(loaded, std::move(options)));
  absl::StatusOr<runtime::GraphModule> gm =
      tracer::Trace(loaded.module, options);
  if (!gm.ok()) return tracer::TraceErrorOf(path, gm.status());
  gm->mutable_extra_files() = loaded.extra_files;
  if (!options.config_path.empty() && options.config.has_value()) {
    gm->mutable_extra_files()[tracer::kConfigJson] = options.config->text();
  }
  return TracedModel{std::move(loaded), std::move(options), *std::move(gm)};
}

}  // namespace tracecut::cli
