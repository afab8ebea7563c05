"""Repositories tracecut needs, from the local system and the project's Python
environment (offline once tools/bootstrap.sh has run).

A consumer workspace calls `tracecut_dependencies()` from its WORKSPACE; see
docs/consuming.md. Every repository is skipped when the workspace already
defines one of the same name, so consumers can bring their own.
"""

load("//third_party:system_libs.bzl", "pytorch_repository", "system_absl", "system_stub_repos")

def _maybe(rule, name, **kwargs):
    if name not in native.existing_rules():
        rule(name = name, **kwargs)

def tracecut_dependencies():
    """Declares the system-backed repositories tracecut builds against."""
    _maybe(native.local_repository, "rules_java", path = "/usr/share/bazel/rules/java")
    _maybe(native.local_repository, "platforms", path = "/usr/share/bazel/tools/platforms")
    _maybe(native.local_repository, "bazel_skylib", path = "/usr/share/bazel/tools/skylib")
    _maybe(system_stub_repos, "rules_cc", kind = "rules_cc")
    _maybe(system_stub_repos, "remote_coverage_tools", kind = "coverage")
    _maybe(
        native.new_local_repository,
        "com_google_protobuf",
        path = "/usr",
        build_file = str(Label("//third_party:protobuf.BUILD")),
    )
    _maybe(
        native.new_local_repository,
        "com_google_googletest",
        path = "/usr",
        build_file = str(Label("//third_party:googletest.BUILD")),
    )
    _maybe(
        native.new_local_repository,
        "nlohmann_json",
        path = "/usr",
        build_file = str(Label("//third_party:nlohmann_json.BUILD")),
    )
    _maybe(
        native.new_local_repository,
        "cli11",
        path = "/usr",
        build_file = str(Label("//third_party:cli11.BUILD")),
    )
    _maybe(
        native.new_local_repository,
        "com_github_jbeder_yaml_cpp",
        path = "/usr",
        build_file = str(Label("//third_party:yaml_cpp.BUILD")),
    )
    _maybe(
        native.new_local_repository,
        "com_github_google_benchmark",
        path = "/usr",
        build_file = str(Label("//third_party:benchmark.BUILD")),
    )
    _maybe(system_absl, "com_google_absl")
    _maybe(pytorch_repository, "libtorch")
