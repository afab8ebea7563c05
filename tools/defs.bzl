"""Build rules that run tracecut as build actions in any Bazel workspace.

    load("@tracecut//tools:defs.bzl", "tracecut_partition", "tracecut_trace")

    tracecut_trace(
        name = "llama_ir",
        model = "//models:llama.pt",
    )

    tracecut_partition(
        name = "llama_plan",
        model = "//models:llama.pt",
        targets = ["LlamaDecoderLayer"],
    )

Every rule runs the `tracecut` command line (//tools:tracecut, built for the
execution platform) in an action whose only inputs are the declared files,
so Bazel caches the results and reruns an action only when the model, its
options or tracecut itself change. Outputs are predeclared (`:llama_ir.ir.txt`,
`:llama_plan.svg`, ...), returned in DefaultInfo and in output groups named
after their kind, so other rules, genrules and tests can take them as inputs.

Reference with examples: docs/rules.md. Setting up the workspace:
docs/consuming.md.
"""

_TRACECUT = Label("//tools:tracecut")

# Graphviz renders DOT to SVG in a separate action (Debian's `graphviz`).
_DOT = "/usr/bin/dot"

_TRACE_EXTENSIONS = {
    "dot": "dot",
    "json": "json",
    "proto": "ir.pb",
    "text": "ir.txt",
}

def _tracecut_attr(doc = "The tracecut binary to run."):
    return attr.label(
        default = _TRACECUT,
        executable = True,
        cfg = "exec",
        doc = doc,
    )

def _comma_flag(args, flag, values):
    if values:
        args.add_joined(values, join_with = ",", format_joined = "--" + flag + "=%s")

# Runs "$@", its stdout going to $1 ("" : nowhere). What it says on stderr
# (tracecut's "wrote FILE" lines, progress, Graphviz's fontconfig warnings)
# is shown only when it fails, so successful builds stay quiet.
_QUIET = """out="$1"; shift
if [ -z "$out" ]; then out=/dev/null; fi
err=$("$@" 2>&1 >"$out") || {
  status=$?
  printf '%s\\n' "$err" >&2
  exit $status
}"""

def _run_quiet(ctx, tool, arguments, inputs, outputs, mnemonic, progress_message, stdout = None):
    """Runs the executable of `tool` (an exec-cfg attribute) in an action."""
    ctx.actions.run_shell(
        command = _QUIET,
        arguments = [stdout.path if stdout else "", tool[DefaultInfo].files_to_run.executable.path] + arguments,
        inputs = inputs,
        outputs = outputs + ([stdout] if stdout else []),
        tools = [tool[DefaultInfo].files_to_run],
        mnemonic = mnemonic,
        progress_message = progress_message,
    )

def _run_tracecut(ctx, arguments, inputs, outputs, summary, mnemonic, progress_message):
    """Runs tracecut with `arguments` and --json; the summary goes to `summary`."""
    json = ctx.actions.args()
    json.add("--json")
    _run_quiet(
        ctx,
        ctx.attr.tracecut,
        arguments + [json],
        inputs,
        outputs,
        mnemonic,
        progress_message,
        stdout = summary,
    )

def _leaf_args(ctx, args):
    """--leaf, --no-default-leaves and --config; returns the extra inputs."""
    args.add_all(ctx.attr.leaves, format_each = "--leaf=%s")
    if ctx.attr.no_default_leaves:
        args.add("--no-default-leaves")
    if ctx.file.config:
        args.add(ctx.file.config, format = "--config=%s")
        return [ctx.file.config]
    return []

# How a model is traced; trace and partition share these.
_TRACE_ATTRS = {
    "config": attr.label(
        allow_single_file = [".json"],
        doc = "A Hugging Face config.json to use instead of the one " +
              "embedded in the model (--config).",
    ),
    "leaves": attr.string_list(
        doc = "Module types (LlamaRMSNorm, or qualified) or paths/globs " +
              "(model.layers.*.mlp) to keep as call_module leaves (--leaf).",
    ),
    "model": attr.label(
        mandatory = True,
        allow_single_file = [".pt"],
        doc = "The TorchScript model (.pt).",
    ),
    "no_default_leaves": attr.bool(
        default = False,
        doc = "Inline torch.nn built-ins and Conv1D too " +
              "(--no-default-leaves).",
    ),
}

def _info(ctx, outputs):
    """Every output in DefaultInfo (as files and as runfiles, so that a test
    with the target in `data` finds them) and in an output group each."""
    files = [outputs[kind] for kind in sorted(outputs)]
    return [
        DefaultInfo(files = depset(files), runfiles = ctx.runfiles(files = files)),
        OutputGroupInfo(**{kind: depset([f]) for kind, f in outputs.items()}),
    ]

# ---------------------------------------------------------------- trace

def _trace_outputs(name, format):
    return {
        "out": "%s.%s" % (name, _TRACE_EXTENSIONS[format]),
        "summary": name + ".summary.json",
    }

def _tracecut_trace_impl(ctx):
    args = ctx.actions.args()
    args.add("trace")
    args.add(ctx.file.model)
    inputs = [ctx.file.model] + _leaf_args(ctx, args)
    args.add(ctx.attr.format, format = "--format=%s")
    args.add("-o", ctx.outputs.out)
    _run_tracecut(
        ctx,
        [args],
        inputs,
        [ctx.outputs.out],
        ctx.outputs.summary,
        "TracecutTrace",
        "Tracing %s into %s" % (ctx.file.model.short_path, ctx.outputs.out.short_path),
    )
    return _info(ctx, {"ir": ctx.outputs.out, "summary": ctx.outputs.summary})

tracecut_trace = rule(
    implementation = _tracecut_trace_impl,
    doc = """Traces a TorchScript model into tracecut's graph IR (`tracecut trace`).

Outputs `<name>.ir.txt` (format "text"), `<name>.ir.pb` ("proto", a binary
GraphProto), `<name>.dot` or `<name>.json`, and `<name>.summary.json` (node
counts per op kind, call_module targets, tracing assumptions). Output
groups: `ir`, `summary`.
""",
    attrs = dict(_TRACE_ATTRS, **{
        "format": attr.string(
            default = "text",
            values = sorted(_TRACE_EXTENSIONS.keys()),
            doc = "text (default), proto, dot or json.",
        ),
        "tracecut": _tracecut_attr(),
    }),
    outputs = _trace_outputs,
)

# ---------------------------------------------------------------- partition

def _partition_outputs(name, svg):
    outputs = {
        "dot": name + ".dot",
        "plan": name + ".json",
        "summary": name + ".summary.json",
        "text": name + ".txt",
    }
    if svg:
        outputs["svg"] = name + ".svg"
    return outputs

def _partition_args(ctx, format, out):
    args = ctx.actions.args()
    args.add("partition")
    args.add(ctx.file.model)
    _leaf_args(ctx, args)
    _comma_flag(args, "targets", ctx.attr.targets)
    _comma_flag(args, "ignore", ctx.attr.ignore)
    if ctx.attr.targets_per_subgraph:
        args.add(str(ctx.attr.targets_per_subgraph), format = "--targets-per-subgraph=%s")
    if ctx.attr.max_param_bytes:
        if not ctx.attr.max_param_bytes.isdigit():
            fail("want a number of bytes", attr = "max_param_bytes")
        args.add(ctx.attr.max_param_bytes, format = "--max-param-bytes=%s")
    args.add(format, format = "--format=%s")
    args.add("-o", out)
    return args

def _partition_inputs(ctx):
    return [ctx.file.model] + ([ctx.file.config] if ctx.file.config else [])

def _tracecut_partition_impl(ctx):
    # One action writes the plan as JSON (with the --json summary), one the
    # text table and one the DOT drawing: each output has exactly the inputs
    # it needs, so `bazel build :plan.json` partitions once.
    args = _partition_args(ctx, "json", ctx.outputs.plan)
    if ctx.attr.check:
        args.add("--check")
    _run_tracecut(
        ctx,
        [args],
        _partition_inputs(ctx),
        [ctx.outputs.plan],
        ctx.outputs.summary,
        "TracecutPartition",
        "Partitioning %s" % ctx.file.model.short_path,
    )
    for format, out in [("text", ctx.outputs.text), ("dot", ctx.outputs.dot)]:
        _run_quiet(
            ctx,
            ctx.attr.tracecut,
            [_partition_args(ctx, format, out)],
            _partition_inputs(ctx),
            [out],
            "TracecutPartition",
            "Partitioning %s (%s)" % (ctx.file.model.short_path, format),
        )
    outputs = {
        "dot": ctx.outputs.dot,
        "plan": ctx.outputs.plan,
        "summary": ctx.outputs.summary,
        "text": ctx.outputs.text,
    }
    if ctx.attr.svg:
        # A second action, so the drawing is only made when asked for and a
        # machine without Graphviz can still build the plan.
        ctx.actions.run_shell(
            command = ('if [ ! -x {dot} ]; then echo "{label}: Graphviz is not ' +
                       "installed ({dot} is missing): apt-get install graphviz, " +
                       'or set svg = False" >&2; exit 1; fi; ' +
                       'if ! err=$({dot} -Tsvg -o "$2" "$1" 2>&1); then ' +
                       'echo "$err" >&2; exit 1; fi').format(dot = _DOT, label = ctx.label),
            arguments = [ctx.outputs.dot.path, ctx.outputs.svg.path],
            inputs = [ctx.outputs.dot],
            outputs = [ctx.outputs.svg],
            mnemonic = "TracecutDotSvg",
            progress_message = "Drawing %s" % ctx.outputs.svg.short_path,
        )
        outputs["svg"] = ctx.outputs.svg
    return _info(ctx, outputs)

tracecut_partition = rule(
    implementation = _tracecut_partition_impl,
    doc = """Partitions a model into sequential subgraphs (`tracecut partition`).

Outputs `<name>.json` (the PartitionPlan as JSON), `<name>.txt` (the plan as
a table), `<name>.dot` (the graph, one cluster per subgraph),
`<name>.summary.json` (one entry per subgraph) and, unless svg = False,
`<name>.svg` rendered from the DOT file by Graphviz (/usr/bin/dot) in a
separate action. Output groups: `plan`, `text`, `dot`, `svg`, `summary`.
""",
    attrs = dict(_TRACE_ATTRS, **{
        "targets": attr.string_list(
            doc = "Module patterns that start a subgraph (LlamaDecoderLayer, " +
                  "model.layers.*, re:...). Empty: the model's Hugging Face " +
                  "defaults.",
        ),
        "ignore": attr.string_list(
            doc = "Module patterns never split at (default: the Hugging " +
                  "Face config's, lm_head).",
        ),
        "targets_per_subgraph": attr.int(
            default = 0,
            doc = "Group this many consecutive targets per subgraph.",
        ),
        "max_param_bytes": attr.string(
            doc = "Group consecutive targets while their parameters fit in " +
                  "this many bytes (a string: attr.int stops at 2^31).",
        ),
        "check": attr.bool(
            default = False,
            doc = "Also run the subgraphs in order and fail when they do " +
                  "not compute what the whole model computes (--check).",
        ),
        "svg": attr.bool(
            default = True,
            doc = "Render <name>.svg with Graphviz (needs /usr/bin/dot).",
        ),
        "tracecut": _tracecut_attr(),
    }),
    outputs = _partition_outputs,
)

# ---------------------------------------------------------------- transform

def _tracecut_transform_impl(ctx):
    if not ctx.attr.passes:
        fail("give at least one pass", attr = "passes")
    args = ctx.actions.args()
    args.add("transform")
    args.add(ctx.file.model)
    extra_inputs = _leaf_args(ctx, args)
    _comma_flag(args, "passes", ctx.attr.passes)
    _comma_flag(args, "targets", ctx.attr.targets)
    if ctx.attr.check:
        args.add("--check")
    args.add("-o", ctx.outputs.out)
    _run_tracecut(
        ctx,
        [args],
        [ctx.file.model] + extra_inputs,
        [ctx.outputs.out],
        ctx.outputs.summary,
        "TracecutTransform",
        "Transforming %s (%s)" % (ctx.file.model.short_path, ",".join(ctx.attr.passes)),
    )
    return _info(ctx, {"model": ctx.outputs.out, "summary": ctx.outputs.summary})

tracecut_transform = rule(
    implementation = _tracecut_transform_impl,
    doc = """Runs transformation passes over a model (`tracecut transform`).

Outputs `<name>.pt` (the transformed TorchScript model, loadable by LibTorch
and Python torch, and by the other rules) and `<name>.summary.json` (what
each pass changed, per subgraph with `targets`, and the --check error).
Output groups: `model`, `summary`.
""",
    attrs = dict(_TRACE_ATTRS, **{
        "passes": attr.string_list(
            mandatory = True,
            doc = "Pass names, run in order (`tracecut transform --help` " +
                  "lists them).",
        ),
        "targets": attr.string_list(
            doc = "Run the passes per subgraph, split at these module " +
                  "patterns. Empty: on the whole graph.",
        ),
        "check": attr.bool(
            default = True,
            doc = "Fail when the transformed model's outputs differ from the " +
                  "original's beyond tolerance (--check).",
        ),
        "tracecut": _tracecut_attr(),
    }),
    outputs = {
        "out": "%{name}.pt",
        "summary": "%{name}.summary.json",
    },
)

# ---------------------------------------------------------------- calibrate

def _tracecut_calibrate_impl(ctx):
    if (ctx.attr.synthetic > 0) == (ctx.file.data != None):
        fail("give exactly one of data and synthetic", attr = "synthetic")
    args = ctx.actions.args()
    args.add("calibrate")
    args.add(ctx.file.model)
    inputs = [ctx.file.model]
    if ctx.file.recipe:
        args.add(ctx.file.recipe, format = "--recipe=%s")
        inputs.append(ctx.file.recipe)
    if ctx.file.data:
        args.add(ctx.file.data, format = "--data=%s")
        inputs.append(ctx.file.data)
    else:
        args.add(str(ctx.attr.synthetic), format = "--synthetic=%s")
        args.add(str(ctx.attr.seq_len), format = "--seq-len=%s")
        args.add(str(ctx.attr.seed), format = "--seed=%s")
    args.add(str(ctx.attr.batch_size), format = "--batch-size=%s")
    if ctx.attr.pipeline:
        args.add(ctx.attr.pipeline, format = "--pipeline=%s")
    _comma_flag(args, "targets", ctx.attr.targets)
    args.add(ctx.outputs.report, format = "--report=%s")
    args.add("--deterministic-report")
    args.add("-o", ctx.outputs.out)

    _run_quiet(
        ctx,
        ctx.attr.calibrate,
        [args],
        inputs,
        [ctx.outputs.out, ctx.outputs.report],
        "TracecutCalibrate",
        "Calibrating %s" % ctx.file.model.short_path,
    )
    return _info(ctx, {"model": ctx.outputs.out, "report": ctx.outputs.report})

tracecut_calibrate = rule(
    implementation = _tracecut_calibrate_impl,
    doc = """Calibrates a model (`tracecut calibrate`).

Outputs `<name>.pt` (the calibrated TorchScript model, quantization
parameters as buffers) and `<name>.report.json` (the calibration report,
without timings, so the same inputs give the same bytes). Output groups:
`model`, `report`.

`calibrate` runs another binary with the same command line: the
`<name>_calibrate` binary of a tracecut_modifier, which adds the
workspace's own modifier after the recipe's.
""",
    attrs = {
        "model": attr.label(
            mandatory = True,
            allow_single_file = [".pt"],
            doc = "The TorchScript model (.pt), with its Hugging Face " +
                  "config embedded for `synthetic`.",
        ),
        "recipe": attr.label(
            allow_single_file = True,
            doc = "The recipe, protobuf text format (docs/recipes.md). " +
                  "Optional for a tracecut_modifier binary.",
        ),
        "data": attr.label(
            allow_single_file = True,
            doc = "Calibration token ids: a torch.save file or JSON lines.",
        ),
        "synthetic": attr.int(
            default = 0,
            doc = "Calibrate on this many seeded random token sequences " +
                  "from the model's vocabulary instead of `data`.",
        ),
        "seq_len": attr.int(default = 16, doc = "Tokens per synthetic sample."),
        "seed": attr.int(default = 0, doc = "Seed of the synthetic samples."),
        "batch_size": attr.int(default = 1, doc = "Samples per batch."),
        "pipeline": attr.string(
            values = ["", "basic", "layer_sequential", "sequential"],
            doc = "Override the recipe's pipeline.",
        ),
        "targets": attr.string_list(
            doc = "Sequential targets (default: the recipe's, else the " +
                  "Hugging Face config's).",
        ),
        "calibrate": _tracecut_attr(
            "The binary: tracecut, or a tracecut_modifier's " +
            "<name>_calibrate.",
        ),
    },
    outputs = {
        "out": "%{name}.pt",
        "report": "%{name}.report.json",
    },
)

# ---------------------------------------------------------------- modifier

# main() of a tracecut_modifier's calibrate binary: `tracecut calibrate`'s
# flow (pipelines/calibrate.h) with the workspace's modifier added after the
# recipe's. {factory_decl} declares the factory; {factory} calls it.
_MODIFIER_MAIN = """// Generated by tracecut_modifier (@tracecut//tools:defs.bzl) for {label}.
//
//   {binary} [calibrate] MODEL.pt -o OUT.pt [--recipe=RECIPE.textproto]
//       [--synthetic=N | --data=FILE] [--seq-len=16] [--batch-size=1]
//       [--seed=0] [--pipeline=sequential|layer_sequential|basic]
//       [--targets=TYPE,...] [--report=REPORT.json]
//
// The command line of `tracecut calibrate` (what tracecut_calibrate passes),
// less checkpoints and --json.
//
// Calibrates MODEL.pt with the recipe's modifiers (none without a recipe)
// followed by {factory}(), and writes the calibrated model and, with
// --report, the calibration report, both atomically.

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "util/status_macros.h"
#include "pipelines/calibrate.h"
#include "pipelines/calibration_data.h"
#include "modifiers/modifier.h"
#include "pipelines/pipeline.h"
#include "pipelines/recipe.h"
#include "pipelines/report.h"
#include "runtime/lowering.h"
#include "util/json.h"

{factory_decl}

namespace {{

namespace pl = tracecut::pipelines;

constexpr char kUsage[] =
    "usage: {binary} [calibrate] MODEL.pt -o OUT.pt [--recipe=FILE] "
    "[--synthetic=N | --data=FILE] [--seq-len=N] [--batch-size=N] "
    "[--seed=N] [--pipeline=KIND] [--targets=TYPE,...] [--report=FILE]";

absl::StatusOr<int64_t> IntFlag(const std::map<std::string, std::string>& f,
                                const std::string& name, int64_t fallback) {{
  auto it = f.find(name);
  if (it == f.end()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {{
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " wants an integer, not '", it->second, "'"));
  }}
  return value;
}}

absl::Status Run(std::vector<std::string> args) {{
  if (!args.empty() && args[0] == "calibrate") args.erase(args.begin());
  std::map<std::string, std::string> flags;
  std::vector<std::string> positional;
  const std::vector<std::string> known = {{
      "output", "recipe", "synthetic", "data", "seq-len", "batch-size",
      "seed", "pipeline", "targets", "report"}};
  for (size_t i = 0; i < args.size(); ++i) {{
    std::string name, value;
    if (args[i] == "--deterministic-report") {{
      continue;  // The report never has timings here.
    }} else if (args[i] == "-o" && i + 1 < args.size()) {{
      name = "output";
      value = args[++i];
    }} else if (absl::StartsWith(args[i], "--")) {{
      const size_t eq = args[i].find('=');
      if (eq == std::string::npos) {{
        return absl::InvalidArgumentError(
            absl::StrCat("flags take --name=value: '", args[i], "'"));
      }}
      name = args[i].substr(2, eq - 2);
      value = args[i].substr(eq + 1);
      if (name == "o") name = "output";
    }} else {{
      positional.push_back(args[i]);
      continue;
    }}
    if (std::find(known.begin(), known.end(), name) == known.end()) {{
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }}
    flags[name] = value;
  }}
  if (positional.size() != 1 || !flags.count("output")) {{
    return absl::InvalidArgumentError("give MODEL.pt and -o OUT.pt");
  }}
  const std::string model_path = positional[0];
  ASSIGN_OR_RETURN(int64_t synthetic, IntFlag(flags, "synthetic", 0));
  ASSIGN_OR_RETURN(int64_t seq_len, IntFlag(flags, "seq-len", 16));
  ASSIGN_OR_RETURN(int64_t batch_size, IntFlag(flags, "batch-size", 1));
  ASSIGN_OR_RETURN(int64_t seed, IntFlag(flags, "seed", 0));
  if ((synthetic > 0) == (flags.count("data") > 0)) {{
    return absl::InvalidArgumentError(
        "give exactly one of --data=FILE and --synthetic=N");
  }}

  tracecut::recipe::Recipe recipe;
  std::string recipe_source = "(none)";
  std::vector<std::unique_ptr<tracecut::modifiers::Modifier>> owned;
  if (flags.count("recipe")) {{
    recipe_source = flags["recipe"];
    ASSIGN_OR_RETURN(recipe, pl::LoadRecipe(recipe_source));
    ASSIGN_OR_RETURN(owned, pl::BuildModifiers(recipe));
  }}
  std::unique_ptr<tracecut::modifiers::Modifier> own = {factory}();
  if (own == nullptr) {{
    return absl::InternalError("{factory}() returned no modifier");
  }}
  owned.push_back(std::move(own));
  std::vector<tracecut::modifiers::Modifier*> modifiers;
  for (const auto& m : owned) modifiers.push_back(m.get());

  ASSIGN_OR_RETURN(pl::LoadedForCalibration loaded,
                   pl::LoadForCalibration(model_path));
  at::Tensor tokens;
  std::string source;
  if (synthetic > 0) {{
    if (!loaded.vocab_size.has_value()) {{
      return absl::InvalidArgumentError(absl::StrCat(
          "--synthetic needs the vocab_size of ", model_path,
          "'s config.json; use --data=FILE"));
    }}
    ASSIGN_OR_RETURN(tokens, pl::SyntheticTokens(synthetic, seq_len,
                                                 *loaded.vocab_size, seed));
    source = absl::StrFormat("synthetic (%d samples of %d tokens, seed %d)",
                             synthetic, seq_len, seed);
  }} else {{
    source = flags["data"];
    ASSIGN_OR_RETURN(tokens, pl::LoadTokenFile(source));
  }}
  pl::TokenLimits limits;
  limits.vocab_size = loaded.vocab_size;
  limits.max_seq_len = loaded.max_positions;
  RETURN_IF_ERROR(pl::CheckTokens(tokens, limits, source));
  ASSIGN_OR_RETURN(pl::CalibrationData data,
                   pl::MakeCalibrationData(
                       tokens, pl::ModelInputNames(loaded.model), batch_size,
                       source));

  pl::PipelineOptions options;
  switch (recipe.pipeline()) {{
    case tracecut::recipe::Recipe::BASIC:
      options.kind = pl::PipelineKind::kBasic;
      break;
    case tracecut::recipe::Recipe::LAYER_SEQUENTIAL:
      options.kind = pl::PipelineKind::kLayerSequential;
      break;
    default:
      options.kind = pl::PipelineKind::kSequential;
  }}
  if (flags.count("pipeline")) {{
    ASSIGN_OR_RETURN(options.kind, pl::ParsePipelineKind(flags["pipeline"]));
  }}
  options.propagate_error = recipe.propagate_error();
  options.partition.targets.assign(recipe.sequential_targets().begin(),
                                   recipe.sequential_targets().end());
  if (flags.count("targets")) {{
    options.partition.targets =
        absl::StrSplit(flags["targets"], ',', absl::SkipEmpty());
  }}
  if (options.partition.targets.empty()) {{
    options.partition.targets = loaded.default_targets;
  }}
  if (options.partition.targets.empty() &&
      options.kind != pl::PipelineKind::kBasic) {{
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, " names no sequential targets in its config: give the "
        "recipe's sequential_targets or --pipeline=basic"));
  }}

  tracecut::modifiers::CalibrationResults results;
  ASSIGN_OR_RETURN(pl::PipelineResult run,
                   pl::RunPipeline(loaded.model, data, modifiers, results,
                                   options));
  RETURN_IF_ERROR(tracecut::modifiers::ExportQuantParams(results, loaded.model));
  RETURN_IF_ERROR(
      tracecut::runtime::SaveTorchScript(loaded.model, flags["output"]));
  if (flags.count("report")) {{
    pl::ReportInfo info;
    info.model = model_path;
    info.recipe = recipe_source;
    info.pipeline = std::string(pl::PipelineKindName(options.kind));
    info.propagate_error = options.propagate_error;
    info.sequential_targets = options.partition.targets;
    info.data_source = source;
    info.samples = data.num_samples;
    info.seq_len = data.seq_len;
    info.batches = static_cast<int64_t>(data.batches.size());
    info.data_fingerprint = data.fingerprint;
    info.include_run_section = false;  // Byte-identical across runs.
    RETURN_IF_ERROR(pl::WriteFileAtomically(
        flags["report"],
        tracecut::util::DumpJson(pl::BuildReport(info, results, &run), 2) +
            "\\n"));
  }}
  return absl::OkStatus();
}}

}}  // namespace

int main(int argc, char** argv) {{
  absl::Status status = Run(std::vector<std::string>(argv + 1, argv + argc));
  if (!status.ok()) {{
    std::cerr << "{binary}: " << status.message() << "\\n";
    if (absl::IsInvalidArgument(status)) std::cerr << kUsage << "\\n";
    return 1;
  }}
  return 0;
}}
"""

def _factory_declaration(factory):
    parts = factory.split("::")
    if parts[0] == "":
        parts = parts[1:]
    name = parts[-1]
    decl = "std::unique_ptr<tracecut::modifiers::Modifier> %s();" % name
    for ns in reversed(parts[:-1]):
        decl = "namespace %s {\n%s\n}  // namespace %s" % (ns, decl, ns)
    return decl

def _modifier_main_impl(ctx):
    ctx.actions.write(
        output = ctx.outputs.out,
        content = _MODIFIER_MAIN.format(
            binary = ctx.attr.binary,
            factory = ctx.attr.factory,
            factory_decl = _factory_declaration(ctx.attr.factory),
            label = ctx.attr.library,
        ),
    )

_modifier_main = rule(
    implementation = _modifier_main_impl,
    attrs = {
        "binary": attr.string(mandatory = True),
        "factory": attr.string(mandatory = True),
        "library": attr.string(mandatory = True),
        "out": attr.output(mandatory = True),
    },
)

def tracecut_modifier(name, factory, srcs = [], hdrs = [], deps = [], visibility = None, **kwargs):
    """A calibration modifier of the workspace's own, and a calibrate binary with it.

    Declares:
      <name>            cc_library (alwayslink) with the modifier; depends on
                        @tracecut//modifiers:modifier.
      <name>_calibrate  cc_binary running tracecut's calibration flow with
                        the recipe's modifiers followed by this one; run it
                        in a build with tracecut_calibrate(calibrate = ...).

    `factory` is the C++ function (fully qualified, no arguments) that
    returns a new std::unique_ptr<tracecut::modifiers::Modifier>; the
    library defines it. Other arguments (copts, testonly, tags, ...) go to
    both targets.
    """
    if not factory or " " in factory or "(" in factory:
        fail("factory must name a C++ function, e.g. \"mylib::MakeMyModifier\"")
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        alwayslink = True,
        linkstatic = True,
        deps = deps + [Label("//modifiers:modifier")],
        visibility = visibility,
        **kwargs
    )
    main = name + "_calibrate_main"
    _modifier_main(
        name = main,
        out = main + ".cc",
        binary = name + "_calibrate",
        factory = factory,
        library = "//%s:%s" % (native.package_name(), name),
        visibility = ["//visibility:private"],
        tags = kwargs.get("tags", []),
        testonly = kwargs.get("testonly", False),
    )
    native.cc_binary(
        name = name + "_calibrate",
        srcs = [":" + main],
        deps = [
            ":" + name,
            Label("//util:status_macros"),
            Label("//pipelines:calibrate"),
            Label("//pipelines:calibration_data"),
            Label("//modifiers:modifier"),
            Label("//pipelines:pipeline"),
            Label("//pipelines:recipe"),
            Label("//pipelines:report"),
            Label("//util:json"),
            Label("//runtime:lowering"),
            Label("@com_google_absl//absl/status"),
            Label("@com_google_absl//absl/status:statusor"),
            Label("@com_google_absl//absl/strings"),
            Label("@com_google_absl//absl/strings:str_format"),
        ],
        visibility = visibility,
        **kwargs
    )
