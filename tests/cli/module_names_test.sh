#!/bin/bash
# `tracecut` on a model whose module paths are not identifiers (GitHub issue
# 19): a scripted RegNet with torchvision's names
# ("trunk_output.block1.block1-0.proj.0") and a module called "avg pool".
# trace (every format), --leaf/--targets/--ignore patterns naming such
# paths, partition --check and transform --check must all succeed, and
# PyTorch must load the transformed model and compute what the original
# does.

set -u

# RUNFILES, TRACECUT, TMP, PYTHON, the counters and fail().
# shellcheck source=tests/cli/bad_input_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bad_input_lib.sh"
MODEL="$RUNFILES/tests/fixtures/regnet_names.pt"

# expect_ok NAME OUT -- ARGS...: `tracecut ARGS` exits 0, stdout to OUT.
expect_ok() {
  local name="$1" out="$2"
  shift 3
  cases=$((cases + 1))
  if ! "$TRACECUT" "$@" >"$out" 2>"$TMP/stderr.txt"; then
    fail "$name" "tracecut $* failed: $(head -c 2000 "$TMP/stderr.txt")"
    return 1
  fi
  return 0
}

# expect_in NAME FILE TEXT: FILE holds TEXT (fixed string).
expect_in() {
  if ! grep -qF -- "$3" "$2"; then
    fail "$1" "$2 does not contain: $3"
    head -c 3000 "$2" | sed 's/^/    | /'
  fi
}

expect_not_in() {
  if grep -qF -- "$3" "$2"; then
    fail "$1" "$2 contains: $3"
  fi
}

# --- trace -------------------------------------------------------------------
G="$TMP/graph.txt"
if expect_ok trace-text /dev/null -- trace "$MODEL" -o "$G"; then
  # Module paths are quoted where they must be; node names are identifiers.
  expect_in trace-text "$G" \
    '%trunk_output_block1_block1_0_proj_0 = call_module["trunk_output.block1.block1-0.proj.0"]('
  expect_in trace-text "$G" '"trunk_output.block1.block1-0":"modeling_regnet_names.ResBottleneckBlock"'
  expect_in trace-text "$G" '%avg_pool = call_module["avg pool"]('
  expect_in trace-text "$G" 'call_module["trunk_output.block1.block1-1.f.b.0"]('
fi
if expect_ok trace-proto /dev/null -- trace "$MODEL" --format=proto -o "$TMP/graph.binpb"; then
  [ -s "$TMP/graph.binpb" ] || fail trace-proto "empty proto output"
fi
if expect_ok trace-dot "$TMP/graph.dot" -- trace "$MODEL" --format=dot; then
  expect_in trace-dot "$TMP/graph.dot" 'call_module[trunk_output.block1.block1-0.proj.0]'
  expect_in trace-dot "$TMP/graph.dot" 'call_module[avg pool]'
fi
if expect_ok trace-json "$TMP/trace.json" -- trace "$MODEL" --json; then
  expect_in trace-json "$TMP/trace.json" '"trunk_output.block1.block1-0.proj.0"'
  expect_in trace-json "$TMP/trace.json" '"avg pool"'
fi

# --leaf with such paths, exact and as globs.
if expect_ok leaf-path "$TMP/leaf.json" -- trace "$MODEL" --json \
  --leaf=trunk_output.block1.block1-0 --leaf="avg pool"; then
  expect_in leaf-path "$TMP/leaf.json" '"trunk_output.block1.block1-0"'
  expect_not_in leaf-path "$TMP/leaf.json" '"trunk_output.block1.block1-0.proj.0"'
  expect_in leaf-path "$TMP/leaf.json" '"trunk_output.block1.block1-1.f.a.0"'
fi
if expect_ok leaf-glob "$TMP/leaf_glob.json" -- trace "$MODEL" --json \
  --no-default-leaves --leaf='trunk_output.*.block?-*'; then
  for block in block1.block1-0 block1.block1-1 block2.block2-0; do
    expect_in leaf-glob "$TMP/leaf_glob.json" "\"trunk_output.$block\""
  done
  expect_not_in leaf-glob "$TMP/leaf_glob.json" '"trunk_output.block1.block1-0.proj.0"'
  expect_not_in leaf-glob "$TMP/leaf_glob.json" '"avg pool"'
fi

# --- partition ----------------------------------------------------------------
if expect_ok partition-type "$TMP/partition.txt" -- partition "$MODEL" \
  --targets=AnyStage --check; then
  expect_in partition-type "$TMP/partition.txt" 'trunk_output.block1'
  expect_in partition-type "$TMP/stderr.txt" 'check passed'
fi
if expect_ok partition-paths "$TMP/partition_paths.json" -- partition "$MODEL" \
  --targets='trunk_output.block1.block1-0,trunk_output.block1.block1-?,trunk_output.block2.*' \
  --ignore=trunk_output.block1.block1-1 --check --json; then
  # The ignored block1-1 starts no subgraph (its nodes join a neighbour's).
  if ! "$PYTHON" -c '
import json, sys
plan = json.load(open(sys.argv[1]))
paths = [s["module_paths"] for s in plan["subgraphs"]]
want = [[], ["trunk_output.block1.block1-0"], ["trunk_output.block2.block2-0"]]
sys.exit(0 if paths == want else "module_paths %r, expected %r" % (paths, want))
' "$TMP/partition_paths.json"; then
    fail partition-paths "unexpected subgraphs"
  fi
fi

# --- transform ----------------------------------------------------------------
OUT="$TMP/out"
mkdir -p "$OUT"
PASSES=fuse-batchnorm2d-in-conv2d,eliminate-dead-code
if expect_ok transform "$TMP/transform.json" -- transform "$MODEL" \
  --passes=$PASSES --check --json -o "$OUT/fused.pt"; then
  expect_in transform "$TMP/transform.json" '"changed": true'
  [ -s "$OUT/fused.pt" ] || fail transform "no output model"
  # The result traces again, without any BatchNorm left.
  if expect_ok transform-retrace "$TMP/fused.txt" -- trace "$OUT/fused.pt"; then
    # Fused conv+BN modules are added beside the originals.
    expect_in transform-retrace "$TMP/fused.txt" 'call_module["trunk_output.block1.block1-0.proj._0_1_fused"]('
    expect_not_in transform-retrace "$TMP/fused.txt" 'BatchNorm2d'
    expect_in transform-retrace "$TMP/fused.txt" '%avg_pool = call_module["avg pool"]('
  fi
fi
if expect_ok transform-per-subgraph /dev/null -- transform "$MODEL" \
  --passes=$PASSES --targets=AnyStage --check -o "$OUT/fused_stages.pt"; then
  [ -s "$OUT/fused_stages.pt" ] || fail transform-per-subgraph "no output model"
fi

# PyTorch loads the transformed models and they compute what the original
# does.
if [ -s "$OUT/fused.pt" ] && [ -s "$OUT/fused_stages.pt" ]; then
  cases=$((cases + 1))
  if ! "$PYTHON" - "$MODEL" "$OUT/fused.pt" "$OUT/fused_stages.pt" >"$TMP/py.txt" 2>&1 <<'EOF'; then
import sys
import torch

torch.manual_seed(0)
x = torch.randn(2, 3, 16, 16)
original = torch.jit.load(sys.argv[1])
with torch.no_grad():
    want = original(x)
    for path in sys.argv[2:]:
        model = torch.jit.load(path)
        names = [n for n, _ in model.named_modules()]
        assert "trunk_output.block1.block1-0.proj._0_1_fused" in names, names
        assert "avg pool" in names, names
        got = model(x)
        err = (got - want).abs().max().item()
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (path, err)
        print(path, "max abs error", err)
EOF
    fail python-load "$(cat "$TMP/py.txt")"
  fi
fi

echo "$cases cases, $failures failures"
[ "$failures" -eq 0 ]
