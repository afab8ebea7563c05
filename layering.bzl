"""The layering test's view of a package (//tests/layering:layering_test)."""

def layering_sources():
    """Exports the package's C++ sources and BUILD file to the layering test.

    Every package with C++ code calls this once; the test lists the package.
    """
    native.filegroup(
        name = "layering_sources",
        srcs = native.glob([
            "**/*.cc",
            "**/*.h",
        ]) + ["BUILD"],
        visibility = ["//tests/layering:__pkg__"],
    )
