#!/bin/bash
# Hostile files and careless paths (GitHub issue 35), with the bad-input
# contract (bad_input_lib.sh: exit 1..127, one stderr line naming the file,
# field or flag, no output or temporary left): a checkpoint whose index names
# files outside it, special files or malformed safetensors; outputs that
# would overwrite, replace or land inside an input; loaders fed a few bytes
# that ask for gigabytes; the exporter's errors. Every input's checksum is
# the same afterwards, the decoy files outside the checkpoint are never
# opened (strace), and the crafted-allocation cases run under `ulimit -v`.
# All crafted files are made here, by Python and the shell.

set -u

source "$(dirname "${BASH_SOURCE[0]}")/bad_input_lib.sh"

# LibTorch (with its CUDA libraries mapped) starts at about 1.5 GB of
# address space; every case below must stay under this.
MEMORY_BOUND_KB=$((4 * 1024 * 1024))

W="$TMP/hostile"
rm -rf "$W"
mkdir -p "$W"
CK="$W/ckpt"
OUT="$W/out"
mkdir -p "$OUT"

# --- A small checkpoint, exported --meta, and its crafted variants -----------
"$PYTHON" - "$CK" <<'PY' 2>"$W/gen.err"
import sys, torch, transformers
cfg = transformers.LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).save_pretrained(sys.argv[1])
PY
if [ ! -f "$CK/model.safetensors" ]; then
  echo "cannot make the checkpoint:"
  cat "$W/gen.err"
  exit 1
fi
if ! "$TRACECUT" export "$CK" --meta -o "$CK/model.pt2" 2>"$W/export.err"; then
  echo "cannot export the checkpoint: $(cat "$W/export.err")"
  exit 1
fi

RECIPE="$W/recipe.textproto"
cat >"$RECIPE" <<'EOF'
modifiers {
  rtn {
    scheme { bits: 4 group_size: 16 symmetric: true }
    targets: "Linear"
    ignore: "lm_head"
  }
}
pipeline: SEQUENTIAL
EOF

# Decoys outside the checkpoint: a valid safetensors copy of the weights
# (what a silent success would read) and a secret.
DECOY="$W/outside"
mkdir -p "$DECOY"
cp "$CK/model.safetensors" "$DECOY/weights.safetensors"
echo "secret" >"$DECOY/secret.txt"

# variant NAME: a copy of the checkpoint in $W/NAME whose weights are named
# by an index (model.safetensors renamed to part.safetensors) that the
# Python snippet on stdin may change; prints the directory.
variant() {
  local d="$W/$1"
  rm -rf "$d"
  mkdir -p "$d"
  cp "$CK/config.json" "$CK/model.pt2" "$d/"
  cp "$CK/model.safetensors" "$d/part.safetensors"
  "$PYTHON" - "$d" "$DECOY" 2>>"$W/gen.err"
  echo "$d"
}
INDEX_PY='
import json, sys
from safetensors import safe_open
d, decoy = sys.argv[1], sys.argv[2]
with safe_open(f"{d}/part.safetensors", "pt") as f:
  names = sorted(f.keys())
def write(target):
  wm = {n: "part.safetensors" for n in names}
  wm[names[0]] = target
  json.dump({"metadata": {}, "weight_map": wm},
            open(f"{d}/model.safetensors.index.json", "w"))
'

V_ABS=$(variant abs <<<"$INDEX_PY
write('/etc/passwd')")
V_ABS2=$(variant abs_decoy <<<"$INDEX_PY
write(decoy + '/weights.safetensors')")
V_DOTDOT=$(variant dotdot <<<"$INDEX_PY
write('../outside/weights.safetensors')")
V_LINK=$(variant link <<<"$INDEX_PY
import os
os.symlink(decoy + '/weights.safetensors', d + '/link.safetensors')
write('link.safetensors')")
V_FIFO=$(variant fifo <<<"$INDEX_PY
import os
os.mkfifo(d + '/fifo.safetensors')
write('fifo.safetensors')")
V_DIR=$(variant dir <<<"$INDEX_PY
import os
os.mkdir(d + '/sub.safetensors')
write('sub.safetensors')")

# Malformed safetensors headers (the file renamed; data kept).
HEADER_PY='
import json, struct, sys
d = sys.argv[1]
raw = open(f"{d}/part.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
def save(text, data=data, length=None):
  text = text.encode()
  length = len(text) if length is None else length
  open(f"{d}/model.safetensors", "wb").write(
      struct.pack("<Q", length) + text + data)
'
single() {
  local v
  v=$(variant "$1" </dev/null)
  "$PYTHON" - "$v" 2>>"$W/gen.err"
  rm -f "$v/part.safetensors" "$v/model.safetensors.index.json"
  echo "$v"
}
# o_proj reading q_proj's bytes: two tensors over the same range.
V_OVERLAP=$(single overlap <<<"$HEADER_PY
names = sorted(k for k in header if k != '__metadata__')
q = [k for k in names if k.endswith('q_proj.weight')][0]
o = [k for k in names if k.endswith('o_proj.weight')][0]
header[o]['data_offsets'] = header[q]['data_offsets']
save(json.dumps(header))")
# A name given twice (JSON keeps the last; safetensors refuses).
V_DUP=$(single duplicate <<<"$HEADER_PY
text = json.dumps(header)
k = sorted(x for x in header if x != '__metadata__')[0]
entry = json.dumps({k: header[k]})[1:-1]
save(text[:-1] + ', ' + entry + '}')")
# A header length of 2^40: over the 100 MB limit.
V_HUGE=$(single huge_header <<<"$HEADER_PY
save(json.dumps(header), length=1 << 40)")
# Trailing bytes after the last tensor.
V_TRAIL=$(single trailing <<<"$HEADER_PY
save(json.dumps(header), data=data + b'x' * 64)")

# A tokenizer file linking to a secret outside: never copied into the output.
TOK="$W/tokenizer_link"
cp -r "$CK" "$TOK"
ln -s "$DECOY/secret.txt" "$TOK/tokenizer.json"
# Calibration data whose attention_mask (ones, which a model traced without
# one would drop) covers other samples than its input_ids.
"$PYTHON" - "$W/mask.pt" <<'PY' 2>>"$W/gen.err"
import sys, torch
torch.save({"input_ids": torch.randint(0, 64, (4, 16)),
            "attention_mask": torch.ones(3, 16, dtype=torch.long)}, sys.argv[1])
PY

# The exported program's archive, rebuilt: a deflated member that inflates to
# 200 MB, and example inputs asking for 10^12 elements.
ARCHIVE_PY='
import json, sys, zipfile
src, out, what = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(src) as z, zipfile.ZipFile(out, "w") as w:
  for info in z.infolist():
    data = z.read(info.filename)
    if what == "bomb" and info.filename.endswith("extra/config.json"):
      data = data + b" " * (200 << 20)
      w.writestr(info.filename, data, compress_type=zipfile.ZIP_DEFLATED)
      continue
    if what == "inputs" and info.filename.endswith("extra/tracecut_inputs.json"):
      j = json.loads(data)
      j["inputs"][0]["shape"] = [1000000, 1000000]
      data = json.dumps(j).encode()
    w.writestr(info, data)
'
for what in bomb inputs; do
  mkdir -p "$W/$what"
  cp "$CK/config.json" "$CK/model.safetensors" "$W/$what/"
  "$PYTHON" -c "$ARCHIVE_PY" "$CK/model.pt2" "$W/$what/model.pt2" "$what" \
    2>>"$W/gen.err"
done
[ "$(stat -c %s "$W/bomb/model.pt2")" -lt $((5 << 20)) ] ||
  fail "bomb archive" "the crafted .pt2 is not small"

# Every file above, and the decoys, must stay as they are.
find "$W" -path "$OUT" -prune -o -type f -print0 | sort -z >"$TMP/inputs.list"
checksums() { xargs -0 cksum <"$TMP/inputs.list" 2>&1; }
checksums >"$TMP/sums_before.txt"

# --- 1. The checkpoint is a closed world -------------------------------------
for v in abs abs_decoy dotdot link fifo dir; do
  d="$W/$v"
  case $v in
    abs) why="an absolute path" ;;
    abs_decoy) why="an absolute path" ;;
    dotdot) why="'..'" ;;
    link) why="outside" ;;
    fifo) why="it is a FIFO" ;;
    dir) why="it is a directory" ;;
  esac
  TIMEOUT_S=120 TRACE_OPENS="$TMP/opens_$v.txt" \
    expect_error "trace index entry $v" "weight_map entry" "$OUT" "" -- \
    trace "$d"
  grep -qF -- "$why" "$TMP/stderr.txt" ||
    fail "trace index entry $v" "does not say '$why': $(cat "$TMP/stderr.txt")"
  expect_not_opened "trace index entry $v: nothing outside" \
    "$TMP/opens_$v.txt" /etc/passwd "$DECOY/weights.safetensors" \
    "$d/link.safetensors" "$d/fifo.safetensors"
done
TIMEOUT_S=120 ALLOW_PROGRESS=1 expect_error "calibrate index entry outside" \
  "weight_map entry" "$OUT" "$OUT/q" -- \
  calibrate "$V_ABS2" "--recipe=$RECIPE" --synthetic=2 -o "$OUT/q"

TIMEOUT_S=120 ALLOW_PROGRESS=1 TRACE_OPENS="$TMP/opens_tok.txt" \
  expect_error "calibrate tokenizer.json link outside" \
  "tokenizer.json (copied into the output)" "$OUT" "$OUT/q" -- \
  calibrate "$TOK" "--recipe=$RECIPE" --synthetic=2 -o "$OUT/q"
expect_not_opened "calibrate tokenizer.json link outside: nothing outside" \
  "$TMP/opens_tok.txt" "$DECOY/secret.txt"
expect_error "calibrate attention_mask for other samples" \
  "'attention_mask' has shape [3, 16], but 'input_ids' has [4, 16]" \
  "$OUT" "$OUT/q" -- calibrate "$CK" "--recipe=$RECIPE" "--data=$W/mask.pt" \
  -o "$OUT/q"

for v in overlap duplicate huge_header trailing; do
  case $v in
    overlap) why="overlap" ;;
    duplicate) why="twice" ;;
    huge_header) why="100000000-byte limit" ;;
    trailing) why="trailing bytes" ;;
  esac
  MEMORY_LIMIT_KB=$MEMORY_BOUND_KB expect_error "trace safetensors $v" \
    "$W/$v/model.safetensors" "$OUT" "" -- trace "$W/$v"
  grep -qF -- "$why" "$TMP/stderr.txt" ||
    fail "trace safetensors $v" "does not say '$why': $(cat "$TMP/stderr.txt")"
done

# --- 3. Bounded loaders -------------------------------------------------------
MEMORY_LIMIT_KB=$MEMORY_BOUND_KB expect_error ".pt2 member bomb" \
  "extra/config.json: inflates to" "$OUT" "" -- trace "$W/bomb/model.pt2"
MEMORY_LIMIT_KB=$MEMORY_BOUND_KB expect_error "tracecut_inputs.json 10^12 elements" \
  "tracecut_inputs.json" "$OUT" "" -- trace "$W/inputs/model.pt2"
grep -qF "elements" "$TMP/stderr.txt" ||
  fail "tracecut_inputs.json 10^12 elements" "$(cat "$TMP/stderr.txt")"
FIFO="$W/data.fifo"
mkfifo "$FIFO"
for flag in --data --recipe; do
  for f in /dev/zero "$FIFO"; do
    args=(calibrate "$CK" --synthetic=2 -o "$OUT/q")
    [ "$flag" = --data ] && args=(calibrate "$CK" "--recipe=$RECIPE" -o "$OUT/q")
    TIMEOUT_S=120 MEMORY_LIMIT_KB=$MEMORY_BOUND_KB expect_error \
      "calibrate $flag=$f" "$flag: '$f' is a" "$OUT" "$OUT/q" -- \
      "${args[@]}" "$flag=$f"
  done
done
# A 5 GiB --data file (sparse): refused by its size, not read.
truncate -s 5G "$W/huge_data.pt"
MEMORY_LIMIT_KB=$MEMORY_BOUND_KB expect_error "calibrate --data of 5 GiB" \
  "5368709120 bytes, more than" "$OUT" "$OUT/q" -- \
  calibrate "$CK" "--recipe=$RECIPE" "--data=$W/huge_data.pt" -o "$OUT/q"
rm -f "$W/huge_data.pt"
# Config values out of range, in a --config and in the checkpoint itself.
"$PYTHON" - "$CK/config.json" "$W/configs" <<'PY' 2>>"$W/gen.err"
import json, os, sys
c = json.load(open(sys.argv[1]))
os.makedirs(sys.argv[2], exist_ok=True)
for name, key, value in [("layers", "num_hidden_layers", 100000),
                         ("heads", "num_attention_heads", 0),
                         ("hidden", "hidden_size", -64),
                         ("vocab", "vocab_size", 1 << 40)]:
  json.dump({**c, key: value}, open(f"{sys.argv[2]}/{name}.json", "w"))
PY
for c in layers heads hidden vocab; do
  case $c in
    layers) key=num_hidden_layers ;;
    heads) key=num_attention_heads ;;
    hidden) key=hidden_size ;;
    vocab) key=vocab_size ;;
  esac
  expect_error "calibrate --config $c" "\"$key\" must be" "$OUT" "$OUT/q" -- \
    calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 \
    "--config=$W/configs/$c.json" -o "$OUT/q"
  # The exporter checks the same before building anything.
  E="$W/export_$c"
  rm -rf "$E"
  mkdir -p "$E"
  cp "$W/configs/$c.json" "$E/config.json"
  cp "$CK/model.safetensors" "$E/"
  MEMORY_LIMIT_KB=$MEMORY_BOUND_KB expect_error "export config $c" \
    "\"$key\" must be" "$E" "$E/model.pt2" -- \
    export "$E" --meta -o "$E/model.pt2"
done

# --- 2. The user's files are sacred -------------------------------------------
# An earlier output directory that now holds the input checkpoint.
P="$W/earlier_output"
rm -rf "$P"
mkdir -p "$P"
cp -r "$CK" "$P/ckpt"
expect_error "calibrate -o contains the input" "contains the input checkpoint" \
  "$P" "" -- calibrate "$P/ckpt" "--recipe=$RECIPE" --synthetic=2 -o "$P"
[ -f "$P/ckpt/model.safetensors" ] || fail "input kept" "$P/ckpt was deleted"
expect_error "calibrate --report over the weights" "--report" "$CK" "" -- \
  calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 -o "$OUT/q" \
  "--report=$CK/model.safetensors"
expect_error "calibrate -o inside the checkpoint" "lies inside the input" \
  "$CK" "" -- calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 -o "$CK/quant"
expect_error "calibrate --run-dir is the checkpoint" "run directory" "$CK" "" -- \
  calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 -o "$OUT/q" "--run-dir=$CK"
expect_error "calibrate --report is the recipe" "--recipe file" "$OUT" "" -- \
  calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 -o "$OUT/q" \
  "--report=$RECIPE"
for f in model.safetensors config.json; do
  expect_error "export -o $f of the checkpoint" "refusing" "$CK" "" -- \
    export "$CK" --meta -o "$CK/$f"
done
echo "notes" >"$OUT/notes.pt2"
expect_error "export -o over a non-archive" "refusing to replace" "$OUT" "" -- \
  export "$CK" --meta -o "$OUT/notes.pt2"
rm -f "$OUT/notes.pt2"
# A killed export's temporary is neither a second .pt2 nor left forever.
S="$W/stale"
rm -rf "$S"
cp -r "$CK" "$S"
cp "$S/model.pt2" "$S/.model.pt2.999999.tmp.pt2"
cases=$((cases + 1))
if "$TRACECUT" trace "$S" -o "$OUT/trace.txt" 2>"$TMP/stale.err"; then
  echo "ok [stale export temporary ignored]"
else
  fail "stale export temporary ignored" "$(cat "$TMP/stale.err")"
fi
cases=$((cases + 1))
if "$TRACECUT" export "$S" --meta -o "$S/model.pt2" 2>"$TMP/stale.err" &&
  [ ! -e "$S/.model.pt2.999999.tmp.pt2" ]; then
  echo "ok [stale export temporary cleaned]"
else
  fail "stale export temporary cleaned" "$(ls -a "$S") $(cat "$TMP/stale.err")"
fi

# Replacing an earlier output removes only what tracecut wrote (its
# .tracecut-output manifest); the user's files in it stop the run, unless
# --overwrite.
Q="$W/q_out"
rm -rf "$Q"
cases=$((cases + 1))
if ALLOW_PROGRESS=1 "$TRACECUT" calibrate "$CK" "--recipe=$RECIPE" \
  --synthetic=2 -o "$Q" 2>"$TMP/q.err" && [ -f "$Q/.tracecut-output" ]; then
  echo "ok [output directory with a manifest]"
else
  fail "output directory with a manifest" "$(tail -2 "$TMP/q.err")"
fi
cases=$((cases + 1))
if "$TRACECUT" calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 -o "$Q" \
  2>"$TMP/q.err"; then
  echo "ok [an earlier output is replaced]"
else
  fail "an earlier output is replaced" "$(tail -1 "$TMP/q.err")"
fi
echo "my notes" >"$Q/notes.txt"
expect_error "calibrate -o over the user's file" "notes.txt" "$Q" "" -- \
  calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 -o "$Q"
[ "$(cat "$Q/notes.txt")" = "my notes" ] || fail "user file kept" "notes.txt changed"
mkdir -p "$W/not_ours"
echo "x" >"$W/not_ours/data.bin"
expect_error "calibrate -o over a directory without a manifest" \
  "--overwrite" "$W/not_ours" "" -- \
  calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 -o "$W/not_ours"

# --- 3b. Ranks: checked before any starts; signals reach them -----------------
expect_error "calibrate --nproc-per-node=100000" "--nproc-per-node=100000" \
  "$OUT" "$OUT/q" -- calibrate "$CK" "--recipe=$RECIPE" --synthetic=200 \
  --nproc-per-node=100000 -o "$OUT/q"
expect_error "calibrate more ranks than samples" "samples" "$OUT" "$OUT/q" -- \
  calibrate "$CK" "--recipe=$RECIPE" --synthetic=2 --nproc-per-node=3 \
  -o "$OUT/q"
# SIGTERM to the launcher: forwarded, ranks waited for, no output, no
# process left, exit 143.
cases=$((cases + 1))
"$TRACECUT" calibrate "$CK" "--recipe=$RECIPE" --synthetic=4000 --seq-len=32 \
  --nproc-per-node=2 -o "$OUT/ranks" 2>"$TMP/ranks.err" &
launcher=$!
ranks=""
for _ in $(seq 1 600); do
  ranks=$(pgrep -P "$launcher" | tr '\n' ' ')
  [ "$(echo $ranks | wc -w)" -ge 2 ] && break
  sleep 0.1
done
sleep 2
kill -TERM "$launcher"
wait "$launcher"
rc=$?
sleep 1
alive=""
for r in $ranks; do kill -0 "$r" 2>/dev/null && alive="$alive $r"; done
if [ "$rc" -ne 143 ] || [ -n "$alive" ] || [ -e "$OUT/ranks" ] ||
  [ "$(echo $ranks | wc -w)" -lt 2 ]; then
  fail "SIGTERM to the launcher" "exit $rc, ranks [$ranks], alive [$alive], $(ls "$OUT"); $(tail -2 "$TMP/ranks.err")"
  for r in $alive; do kill -KILL "$r"; done
else
  echo "ok [SIGTERM to the launcher] exit 143, ranks $ranks stopped: $(tail -1 "$TMP/ranks.err")"
fi
rm -rf "$OUT/ranks.run"

# --- 6. Outputs always load --------------------------------------------------
# Groups compressed-tensors cannot store, refused before any subgraph runs
# (the layers' in_features are 32 and 64).
for g in 3 256; do
  sed "s/group_size: 16/group_size: $g/" "$RECIPE" >"$W/recipe_g$g.textproto"
  case $g in
    3) why="does not divide the 32 input features" ;;
    256) why="is larger than the 32 input features" ;;
  esac
  ALLOW_PROGRESS=1 expect_error "calibrate group_size $g" "$why" "$OUT" \
    "$OUT/q" -- calibrate "$CK" "--recipe=$W/recipe_g$g.textproto" \
    --synthetic=2 -o "$OUT/q"
  if grep -q "subgraph" "$TMP/stderr.txt"; then
    fail "calibrate group_size $g" "refused only after work began"
  fi
done

# --- 4. The exporter: one line, never a traceback -----------------------------
for ro in /proc /sys; do
  [ -d "$ro" ] || continue
  expect_error "export -o in $ro" "$ro/model.pt2" "$OUT" "" -- \
    export "$CK" --meta -o "$ro/model.pt2"
done
FILE_LIMIT_KB=64 expect_error "export, disk full" "$OUT/full.pt2" "$OUT" \
  "$OUT/full.pt2" -- export "$CK" --meta -o "$OUT/full.pt2"
for out_err in "$TMP/stderr_raw.txt"; do
  if grep -q "Traceback\|terminate called" "$out_err"; then
    fail "export, disk full" "traceback or abort: $(head -3 "$out_err")"
  fi
done

# --- Inputs unchanged ---------------------------------------------------------
cases=$((cases + 1))
checksums >"$TMP/sums_after.txt"
if diff "$TMP/sums_before.txt" "$TMP/sums_after.txt" >"$TMP/sums.diff"; then
  echo "ok [inputs unchanged] $(wc -l <"$TMP/sums_after.txt") files"
else
  fail "inputs unchanged" "$(head -10 "$TMP/sums.diff")"
fi

echo "$cases cases, $failures failures"
[ "$failures" -eq 0 ]
