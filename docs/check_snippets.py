#!/usr/bin/env python3
"""Keeps code quoted in the docs identical to the files it comes from.

    docs/check_snippets.py [--fix] PAGE.md...

A quote in a page is a marker line followed by a fenced code block:

    <!-- snippet: docs/examples/ir_example.cc ir -->
    ```c++
    ...
    ```

The block must equal the lines between `[START ir]` and `[END ir]` in the
file (a comment line in any language: `// [START ir]`, `# [START ir]`),
without their common indentation; with no name, the whole file. Paths are
relative to the source tree, found from this script's real location (the
test runs unsandboxed). --fix rewrites the blocks from the files. Exit
status: 0 all equal (or fixed), 1 some differ, 2 a marker is broken.
"""

import difflib
import os
import re
import sys

MARKER = re.compile(r"^<!-- snippet: (\S+)(?: (\S+))? -->$")
START = re.compile(r"\[START (\S+)\]")
END = re.compile(r"\[END (\S+)\]")


class Broken(Exception):
    pass


def region(root, path, name):
    full = os.path.join(root, path)
    try:
        with open(full) as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise Broken("cannot read %s: %s" % (path, e))
    if lines and lines[-1] == "":
        lines.pop()
    if name is None:
        return lines
    out, inside, found = [], False, False
    for line in lines:
        if not inside:
            m = START.search(line)
            if m and m.group(1) == name:
                inside, found = True, True
            continue
        m = END.search(line)
        if m and m.group(1) == name:
            inside = False
            break
        if START.search(line) or END.search(line):
            continue  # Nested markers are not quoted.
        out.append(line)
    if not found or inside:
        raise Broken("%s has no complete [START %s] ... [END %s]" % (path, name, name))
    indent = min((len(l) - len(l.lstrip()) for l in out if l.strip()), default=0)
    return [l[indent:] for l in out]


def process(root, page, fix):
    full = os.path.join(root, page)
    with open(full) as f:
        lines = f.read().split("\n")
    out, i, stale, count = [], 0, 0, 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        m = MARKER.match(line)
        i += 1
        if not m:
            continue
        count += 1
        if i >= len(lines) or not lines[i].startswith("```"):
            raise Broken("%s:%d: a snippet marker must be followed by a ``` block" % (page, i))
        fence = lines[i]
        j = i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        if j >= len(lines):
            raise Broken("%s:%d: unterminated ``` block" % (page, i + 1))
        quoted, want = lines[i + 1 : j], region(root, m.group(1), m.group(2))
        if quoted != want:
            stale += 1
            what = m.group(1) + (" " + m.group(2) if m.group(2) else "")
            if fix:
                print("%s:%d: updated from %s" % (page, i + 1, what))
            else:
                print("%s:%d: differs from %s:" % (page, i + 1, what))
                sys.stdout.writelines(
                    difflib.unified_diff(
                        [l + "\n" for l in want], [l + "\n" for l in quoted], what, page, n=1
                    )
                )
        out.append(fence)
        out.extend(want if fix else quoted)
        out.append("```")
        i = j + 1
    if fix and stale:
        with open(full, "w") as f:
            f.write("\n".join(out))
    return count, stale


def main(argv):
    fix = "--fix" in argv[1:]
    pages = [a for a in argv[1:] if a != "--fix"]
    if not pages:
        sys.stderr.write(__doc__)
        return 2
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        sys.stderr.write("check_snippets: no source tree at %s (run unsandboxed)\n" % root)
        return 2
    total = stale = 0
    try:
        for page in pages:
            c, s = process(root, page, fix)
            total, stale = total + c, stale + s
    except Broken as e:
        print("check_snippets: %s" % e)
        return 2
    print("check_snippets: %d snippets, %d %s" % (total, stale, "updated" if fix else "differ"))
    if stale and not fix:
        print("run docs/check_snippets.py --fix %s" % " ".join(pages))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
