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

def _run_tracecut(ctx, arguments, inputs, outputs, summary, mnemonic, progress_message):
    """Runs tracecut with `arguments`; its stdout (the --json summary) goes to `summary`.

    A shell redirect is the one thing ctx.actions.run cannot do; the summary
    is worth keeping (machine-readable counts for tests) and stops tracecut's
    "wrote FILE" lines from showing up in every build.
    """
    ctx.actions.run_shell(
        command = 'out="$1"; shift; exec "$@" --json > "$out"',
        arguments = [summary.path, ctx.executable.tracecut.path] + arguments,
        inputs = inputs,
        outputs = outputs + [summary],
        tools = [ctx.attr.tracecut[DefaultInfo].files_to_run],
        mnemonic = mnemonic,
        progress_message = progress_message,
    )

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
    args.add_all(ctx.attr.leaves, format_each = "--leaf=%s")
    inputs = [ctx.file.model]
    if ctx.file.config:
        args.add(ctx.file.config, format = "--config=%s")
        inputs.append(ctx.file.config)
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
    attrs = {
        "model": attr.label(
            mandatory = True,
            allow_single_file = [".pt"],
            doc = "The TorchScript model (.pt).",
        ),
        "leaves": attr.string_list(
            doc = "Module types (LlamaRMSNorm, or qualified) or paths/globs " +
                  "(model.layers.*.mlp) to keep as call_module leaves (--leaf).",
        ),
        "config": attr.label(
            allow_single_file = [".json"],
            doc = "A Hugging Face config.json to use instead of the one " +
                  "embedded in the model (--config).",
        ),
        "format": attr.string(
            default = "text",
            values = sorted(_TRACE_EXTENSIONS.keys()),
            doc = "text (default), proto, dot or json.",
        ),
        "tracecut": _tracecut_attr(),
    },
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
    _comma_flag(args, "targets", ctx.attr.targets)
    _comma_flag(args, "ignore", ctx.attr.ignore)
    args.add(format, format = "--format=%s")
    args.add("-o", out)
    return args

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
        [ctx.file.model],
        [ctx.outputs.plan],
        ctx.outputs.summary,
        "TracecutPartition",
        "Partitioning %s" % ctx.file.model.short_path,
    )
    for format, out in [("text", ctx.outputs.text), ("dot", ctx.outputs.dot)]:
        ctx.actions.run(
            executable = ctx.executable.tracecut,
            arguments = [_partition_args(ctx, format, out)],
            inputs = [ctx.file.model],
            outputs = [out],
            mnemonic = "TracecutPartition",
            progress_message = "Partitioning %s (%s)" % (ctx.file.model.short_path, format),
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
                       'exec {dot} -Tsvg -o "$2" "$1"').format(dot = _DOT, label = ctx.label),
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
    attrs = {
        "model": attr.label(
            mandatory = True,
            allow_single_file = [".pt"],
            doc = "The TorchScript model (.pt).",
        ),
        "targets": attr.string_list(
            doc = "Module patterns that start a subgraph (LlamaDecoderLayer, " +
                  "model.layers.*, re:...). Empty: the model's Hugging Face " +
                  "defaults.",
        ),
        "ignore": attr.string_list(
            doc = "Module patterns never split at.",
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
    },
    outputs = _partition_outputs,
)

# ---------------------------------------------------------------- transform

def _tracecut_transform_impl(ctx):
    if not ctx.attr.passes:
        fail("give at least one pass", attr = "passes")
    args = ctx.actions.args()
    args.add("transform")
    args.add(ctx.file.model)
    _comma_flag(args, "passes", ctx.attr.passes)
    _comma_flag(args, "targets", ctx.attr.targets)
    if ctx.attr.check:
        args.add("--check")
    args.add("-o", ctx.outputs.out)
    _run_tracecut(
        ctx,
        [args],
        [ctx.file.model],
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
and Python torch) and `<name>.summary.json`. Output groups: `model`,
`summary`.
""",
    attrs = {
        "model": attr.label(
            mandatory = True,
            allow_single_file = [".pt"],
            doc = "The TorchScript model (.pt).",
        ),
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
    },
    outputs = {
        "out": "%{name}.pt",
        "summary": "%{name}.summary.json",
    },
)
