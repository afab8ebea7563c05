"""What a workspace that depends on tracecut loads from its WORKSPACE.

    load("@tracecut//tools:deps.bzl", "tracecut_dependencies")

    tracecut_dependencies()

The same macro as //third_party:deps.bzl (which tracecut's own WORKSPACE
loads); this file is the stable place for other workspaces, next to the
build rules in //tools:defs.bzl. See docs/consuming.md.
"""

load("//third_party:deps.bzl", _tracecut_dependencies = "tracecut_dependencies")

tracecut_dependencies = _tracecut_dependencies
