#!/usr/bin/env bash
# Checks the report of :tiny_llama_w8: RTN quantized the Linears to int8 and
# ActivationMax left its notes.
set -euo pipefail
python3 - modifier/tiny_llama_w8.report.json modifier/tiny_llama_w8.pt <<'PY'
import json, os, sys

report = json.load(open(sys.argv[1]))
modules = {m["path"]: m for m in report["modules"]}
down = modules["model.layers.1.mlp.down_proj"]
assert down["weight"]["method"] == "rtn", down["weight"]
assert down["weight"]["scheme"].startswith("int8"), down["weight"]
assert any(n.startswith("max |output|") for n in down["notes"]), down["notes"]
assert report["subgraphs"] == ["(head)", "model.layers.0", "model.layers.1"], report["subgraphs"]
assert os.path.getsize(sys.argv[2]) > 0
print("calibrate_report_test: OK,", len(modules), "modules")
PY
