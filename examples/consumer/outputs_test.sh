#!/usr/bin/env bash
# Reads the outputs of the tracecut rules in BUILD as a consumer's test
# would: they are ordinary files in the test's runfiles.
set -euo pipefail

fail() {
  echo "outputs_test: $*" >&2
  exit 1
}

ir=tiny_llama_ir.ir.txt
summary=tiny_llama_ir.summary.json
[[ $(head -1 "$ir") == "graph {" ]] || fail "$ir is not IR text"
grep -q '"hf.sequential_targets" = \["LlamaDecoderLayer"\]' "$ir" ||
  fail "$ir does not name the decoder layers as sequential targets"
python3 - "$summary" tiny_llama_mlp_leaves.json tiny_llama_plan tiny_llama_gptq_w4.report.json \
  tiny_llama_merged_ir.summary.json <<'PY'
import json, sys

summary = json.load(open(sys.argv[1]))
targets = summary["call_module_targets"]
assert "model.layers.1.mlp.down_proj" in targets, targets
assert summary["op_counts"]["placeholder"] == 2, summary["op_counts"]

# With LlamaMLP as a leaf the MLP's Linears are no longer called one by one.
graph = json.load(open(sys.argv[2]))
text = json.dumps(graph)
assert '"model.layers.0.mlp"' in text, "no call_module of model.layers.0.mlp"
assert "model.layers.0.mlp.down_proj" not in text, "the MLP was inlined"

# The partition: a head and one subgraph per decoder layer, drawn.
plan_stem = sys.argv[3]
plan = json.load(open(plan_stem + ".json"))
labels = [s["module_paths"] for s in plan["subgraphs"]]
assert labels == [[], ["model.layers.0"], ["model.layers.1"]], labels
svg = open(plan_stem + ".svg").read()
assert "<svg" in svg, "no SVG drawing"
assert open(plan_stem + ".dot").read().startswith("digraph"), "no DOT drawing"
assert "LlamaDecoderLayer" in open(plan_stem + ".txt").read()

# GPTQ quantized every decoder-layer Linear to int4.
report = json.load(open(sys.argv[4]))
methods = {m["path"]: m["weight"]["method"] for m in report["modules"] if m.get("weight")}
assert methods["model.layers.1.self_attn.q_proj"] == "gptq", methods
assert "lm_head" not in methods or methods["lm_head"] != "gptq", methods

# merge-linears left one merged projection where q, k and v were.
merged = json.load(open(sys.argv[5]))["call_module_targets"]
assert not any(t.endswith(".q_proj") for t in merged), merged
assert any("merged" in t for t in merged), merged
PY
echo "outputs_test: OK"
