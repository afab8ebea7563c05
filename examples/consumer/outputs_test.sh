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
python3 - "$summary" tiny_llama_mlp_leaves.json <<'PY'
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
PY
echo "outputs_test: OK"
