"""Repository rules that expose system libraries under upstream target names."""

# Abseil packages tracecut code may depend on; each becomes
# @com_google_absl//absl/<pkg>:<target>, all backed by the system shared
# libraries. They are linked --no-as-needed: with --as-needed, symbols that
# one Abseil library needs from another went missing in dynamically linked
# tests.
_ABSL_TARGETS = {
    "absl/algorithm": ["algorithm", "container"],
    "absl/base": ["base", "core_headers"],
    "absl/cleanup": ["cleanup"],
    "absl/container": [
        "btree",
        "fixed_array",
        "flat_hash_map",
        "flat_hash_set",
        "inlined_vector",
        "node_hash_map",
        "node_hash_set",
    ],
    "absl/flags": ["flag", "parse", "usage"],
    "absl/functional": ["any_invocable", "bind_front", "function_ref"],
    "absl/hash": ["hash"],
    "absl/memory": ["memory"],
    "absl/random": ["random", "distributions"],
    "absl/status": ["status", "statusor"],
    "absl/strings": ["cord", "str_format", "strings"],
    "absl/synchronization": ["synchronization"],
    "absl/time": ["time"],
    "absl/types": ["optional", "span", "variant"],
    "absl/utility": ["utility"],
}

def _system_absl_impl(ctx):
    lib_dir = ctx.os.environ.get("ABSL_LIBDIR", "/usr/lib/x86_64-linux-gnu")
    libs = sorted([
        f.basename[len("lib"):-len(".so")]
        for f in ctx.path(lib_dir).readdir()
        if f.basename.startswith("libabsl_") and f.basename.endswith(".so")
    ])
    if not libs:
        fail("no libabsl_*.so under %s: run tools/bootstrap.sh" % lib_dir)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "absl_all",
    linkopts = ["-L{dir}", "-Wl,--push-state,--no-as-needed"] +
               {libs} + ["-Wl,--pop-state"],
)
""".format(dir = lib_dir, libs = repr(["-l" + l for l in libs])))
    for pkg, targets in _ABSL_TARGETS.items():
        ctx.file(pkg + "/BUILD", "\n".join([
            'package(default_visibility = ["//visibility:public"])',
        ] + [
            'cc_library(name = "%s", deps = ["//:absl_all"])' % t
            for t in targets
        ]) + "\n")

system_absl = repository_rule(
    implementation = _system_absl_impl,
    environ = ["ABSL_LIBDIR"],
    local = True,
)

def _system_libtorch_impl(ctx):
    home = ctx.os.environ.get("LIBTORCH_HOME") or "/usr"
    include = ctx.path(home + "/include")
    if not include.get_child("torch").get_child("script.h").exists:
        fail("LIBTORCH_HOME=%s has no include/torch/script.h" % home)
    lib = ctx.path(home + "/lib")
    if not lib.get_child("libtorch.so").exists:
        lib = ctx.path(home + "/lib/x86_64-linux-gnu")
    if not lib.get_child("libtorch.so").exists:
        fail("LIBTORCH_HOME=%s has no lib/libtorch.so" % home)
    for d in ["ATen", "c10", "caffe2", "torch"]:
        if include.get_child(d).exists:
            ctx.symlink(include.get_child(d), "include/" + d)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h"], allow_empty = True),
    includes = ["include", "include/torch/csrc/api/include"],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-Wl,--push-state,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-Wl,--pop-state",
        "-pthread",
    ],
)
""".format(lib = str(lib)))

system_libtorch = repository_rule(
    implementation = _system_libtorch_impl,
    environ = ["LIBTORCH_HOME"],
    local = True,
)

_RULES_CC_DEFS = '''"""Re-exports Bazel's native C++ rules (Debian's rules_cc needs a newer Bazel)."""

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)

def cc_import(**kwargs):
    native.cc_import(**kwargs)

def cc_library(**kwargs):
    native.cc_library(**kwargs)

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)

def cc_test(**kwargs):
    native.cc_test(**kwargs)

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)

def fdo_prefetch_hints(**kwargs):
    native.fdo_prefetch_hints(**kwargs)

def fdo_profile(**kwargs):
    native.fdo_profile(**kwargs)

def objc_import(**kwargs):
    native.objc_import(**kwargs)

def objc_library(**kwargs):
    native.objc_library(**kwargs)
'''

def _system_stub_repos_impl(ctx):
    if ctx.attr.kind == "rules_cc":
        ctx.file("BUILD", "")
        ctx.file("cc/BUILD", "")
        ctx.file("cc/defs.bzl", _RULES_CC_DEFS)
    else:
        # Test rules reference these even when coverage is off.
        ctx.file("collect.sh", "#!/bin/sh\necho 'coverage is not configured offline' >&2\nexit 1\n", executable = True)
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

sh_binary(name = "coverage_report_generator", srcs = ["collect.sh"])

sh_binary(name = "lcov_merger", srcs = ["collect.sh"])
""")

system_stub_repos = repository_rule(
    implementation = _system_stub_repos_impl,
    attrs = {"kind": attr.string(values = ["rules_cc", "coverage"])},
)
