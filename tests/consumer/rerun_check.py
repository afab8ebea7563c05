#!/usr/bin/env python3
"""Checks that Bazel re-ran exactly the actions that depend on a change.

    rerun_check.py count EXEC_LOG.json
    rerun_check.py snapshot AQUERY.json EXECROOT CHANGED... > OLD.json
    (change the CHANGED source files, build with --execution_log_json_file)
    rerun_check.py check AQUERY.json OLD.json EXEC_LOG.json CHANGED...

`count` prints how many spawns (actions run, or taken from a cache) an
execution log (--execution_log_json_file) holds, then one line for each.
AQUERY.json is `bazel aquery --output=jsonproto 'deps(//...)'`; CHANGED are
exec paths of source files (model/tiny_llama.flags). `snapshot` records the
SHA-256 of every output of every action downstream of CHANGED, before the
change. `check` works out which actions had to run: an action re-runs when
one of its inputs changed, and its outputs changed when their digest in the
execution log differs from the snapshot (so an action whose inputs came out
byte-identical must not run: Bazel's early cutoff). The spawns in the
execution log must be exactly those actions; it prints both and exits 1 when
they differ.
"""

import hashlib
import json
import os
import sys

# Actions Bazel runs in-process (no spawn, so never in the execution log);
# their outputs depend on paths, not on the contents of their inputs.
INTERNAL = {
    "BazelWorkspaceStatusAction",
    "ExecutableSymlink",
    "FileWrite",
    "Middleman",
    "SolibSymlink",
    "SourceSymlinkManifest",
    "Symlink",
    "SymlinkTree",
    "TemplateExpand",
    "TestRunner",
}


class ActionGraph:
    def __init__(self, path):
        with open(path) as f:
            data = json.load(f)
        fragments = {p["id"]: p for p in data.get("pathFragments", [])}

        def fragment_path(fid):
            parts = []
            while fid:
                p = fragments[fid]
                parts.append(p["label"])
                fid = p.get("parentId", 0)
            return "/".join(reversed(parts))

        self.paths = {}
        for a in data["artifacts"]:
            self.paths[a["id"]] = a["execPath"] if "execPath" in a else fragment_path(a["pathFragmentId"])
        self.depsets = {d["id"]: d for d in data.get("depSetOfFiles", [])}
        self._expanded = {}
        self.actions = []
        for a in data["actions"]:
            if a["mnemonic"] in INTERNAL:
                continue
            inputs = set()
            for d in a.get("inputDepSetIds", []):
                inputs |= self._expand(d)
            outputs = [self.paths[o] for o in a.get("outputIds", [])]
            self.actions.append({"mnemonic": a["mnemonic"], "inputs": inputs, "outputs": outputs})

    def _expand(self, depset_id):
        if depset_id in self._expanded:
            return self._expanded[depset_id]
        d = self.depsets[depset_id]
        files = {self.paths[i] for i in d.get("directArtifactIds", [])}
        for t in d.get("transitiveDepSetIds", []):
            files |= self._expand(t)
        self._expanded[depset_id] = files
        return files

    def downstream(self, changed):
        """Actions that could be affected by `changed`, ignoring contents."""
        reached, dirty = [], set(changed)
        grew = True
        while grew:
            grew = False
            for a in self.actions:
                if a not in reached and a["inputs"] & dirty:
                    reached.append(a)
                    dirty |= set(a["outputs"])
                    grew = True
        return reached


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_exec_log(path):
    with open(path) as f:
        text = f.read()
    decoder, i, spawns = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return spawns
        obj, i = decoder.raw_decode(text, i)
        spawns.append(obj)


def snapshot(aquery, execroot, changed):
    graph = ActionGraph(aquery)
    old = {}
    for a in graph.downstream(changed):
        for out in a["outputs"]:
            full = os.path.join(execroot, out)
            if os.path.isfile(full):
                old[out] = sha256(full)
    json.dump(old, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


def check(aquery, old_path, log_path, changed):
    graph = ActionGraph(aquery)
    with open(old_path) as f:
        old = json.load(f)
    spawns = read_exec_log(log_path)
    new = {}
    ran = {}
    for s in spawns:
        for o in s.get("actualOutputs", []):
            new[o["path"]] = o["digest"]["hash"]
        key = s["listedOutputs"][0] if s.get("listedOutputs") else s.get("progressMessage", "?")
        ran[key] = s

    dirty, expected = set(changed), {}
    grew = True
    while grew:
        grew = False
        for a in graph.actions:
            key = a["outputs"][0] if a["outputs"] else None
            if key in expected or not (a["inputs"] & dirty):
                continue
            expected[key] = a
            grew = True
            for out in a["outputs"]:
                if new.get(out) is None or new.get(out) != old.get(out):
                    dirty.add(out)

    print("actions that had to run (an input changed):")
    for key, a in sorted(expected.items()):
        status = "ran" if key in ran else "DID NOT RUN"
        hit = " (disk cache hit)" if ran.get(key, {}).get("remoteCacheHit") else ""
        print("  %-18s %s: %s%s" % (a["mnemonic"], key, status, hit))
    unexpected = sorted(set(ran) - set(expected))
    for key in unexpected:
        print("  UNEXPECTED %-18s %s" % (ran[key].get("mnemonic", "?"), key))
    cut = [
        (a["mnemonic"], out)
        for a in graph.downstream(changed)
        for out in a["outputs"][:1]
        if out not in expected
    ]
    if cut:
        print("not run (their inputs came out byte-identical):")
        for mnemonic, out in sorted(cut):
            print("  %-18s %s" % (mnemonic, out))
    missing = sorted(set(expected) - set(ran))
    if missing or unexpected:
        print("FAIL: %d expected actions did not run, %d ran unexpectedly" % (len(missing), len(unexpected)))
        return 1
    print("OK: %d actions re-ran, exactly those that depend on %s" % (len(expected), ", ".join(changed)))
    return 0


def count(log_path):
    spawns = read_exec_log(log_path)
    print(len(spawns))
    for s in spawns:
        print("%s %s" % (s.get("mnemonic", "?"), s.get("progressMessage", "")))
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "count":
        return count(argv[2])
    if len(argv) >= 4 and argv[1] == "snapshot":
        return snapshot(argv[2], argv[3], argv[4:])
    if len(argv) >= 6 and argv[1] == "check":
        return check(argv[2], argv[3], argv[4], argv[5:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
