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

def _python_env_dir(ctx):
    """The project's Python environment (see tools/python_env.sh)."""
    script = ctx.path(Label("//tools:python_env.sh"))

    # Watch the lock file: a new lock means a new environment.
    ctx.path(Label("//third_party/python:requirements.lock"))
    result = ctx.execute(["bash", str(script)])
    if result.return_code != 0:
        fail("tools/python_env.sh failed: " + result.stderr)
    return ctx.path(result.stdout.strip())

def _site_packages(env):
    lib = env.get_child("lib")
    if lib.exists:
        for d in lib.readdir():
            if d.basename.startswith("python") and d.get_child("site-packages").exists:
                return d.get_child("site-packages")
    return None

def _pytorch_impl(ctx):
    env = _python_env_dir(ctx)
    ready = env.get_child(".tracecut-complete").exists
    home = ctx.os.environ.get("LIBTORCH_HOME")
    if home:
        include = ctx.path(home + "/include")
        lib = ctx.path(home + "/lib")
        where = "LIBTORCH_HOME=" + home
    else:
        site = _site_packages(env) if ready else None
        if not site or not site.get_child("torch").exists:
            fail(("the Python environment %s is missing or incomplete (it " +
                  "provides LibTorch): run tools/bootstrap.sh") % env)
        include = site.get_child("torch").get_child("include")
        lib = site.get_child("torch").get_child("lib")
        where = "the Python environment " + str(env)
    if not include.get_child("torch").get_child("script.h").exists:
        fail("%s: no include/torch/script.h" % where)
    if not lib.get_child("libtorch_cpu.so").exists:
        fail("%s: no lib/libtorch_cpu.so" % where)
    for d in include.readdir():
        if d.basename != "python" and not d.basename.startswith("."):
            ctx.symlink(d, "include/" + d.basename)

    # The environment's Python, for build actions and tests: a script rather
    # than a symlink, because a virtual environment is found from the path the
    # interpreter is started by.
    ctx.file("python", "#!/bin/sh\nexec '%s/bin/python' \"$@\"\n" % env, executable = True)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# CPU LibTorch only: libtorch.so of a CUDA wheel would pull in libtorch_cuda.
cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"], allow_empty = True),
    includes = ["include", "include/torch/csrc/api/include"],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-Wl,--push-state,--no-as-needed",
        "-ltorch_cpu",
        "-lc10",
        "-Wl,--pop-state",
        "-pthread",
    ],
)

# c10d's Gloo process group (runtime/collective): ProcessGroupGloo.hpp
# includes <gloo/...>, which the wheel does not ship; Debian's libgloo-dev
# provides them under /usr/include. Only torch's own factories touch gloo
# types, so the gloo compiled into libtorch_cpu is the one that runs.
cc_library(
    name = "c10d_gloo",
    defines = ["USE_C10D_GLOO"],
    deps = [":torch"],
)

# The project's Python (tools/python), for genrules (`tools`) and tests
# (`data`): fixture generators, checks against Python torch, benchmark peers.
exports_files(["python"])
""".format(lib = str(lib)))

# @libtorch: LibTorch from the project's Python environment (the PyTorch wheel
# pinned in third_party/python/requirements.lock), or from LIBTORCH_HOME.
pytorch_repository = repository_rule(
    implementation = _pytorch_impl,
    environ = ["LIBTORCH_HOME", "TRACECUT_PYTHON_ENV", "XDG_CACHE_HOME", "HOME"],
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
