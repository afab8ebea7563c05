#!/bin/bash
# More of the `tracecut` bad-input matrix (bad_input_test.sh has the model,
# config, recipe and data basics for every subcommand): transform and debug
# flags, the check tolerances (--rtol, --atol), read-only output locations,
# full disks for outputs and for the intermediates cache's spill files,
# unwritable stdout, more kinds of bad calibration data (token ids, and
# images for a CNN by name, position or safetensors, with calibrate's
# --input / --example-inputs) and recipes. Same contract, checked by expect_error
# (bad_input_lib.sh): exit 1..127, one stderr line naming the offending file
# or flag, no output, temporary or spill file left behind.

set -u

source "$(dirname "${BASH_SOURCE[0]}")/bad_input_lib.sh"

OUT="$TMP/out"
mkdir -p "$OUT"
O="$OUT/out.pt"
DEC=LlamaDecoderLayer
RECIPE_OK="$TMP/recipe_ok.textproto"
cat >"$RECIPE_OK" <<'RECIPE_EOF'
modifiers {
  gptq {
    scheme { bits: 4 group_size: 128 symmetric: true }
    targets: "Linear"
    ignore: "lm_head"
  }
}
pipeline: SEQUENTIAL
sequential_targets: "LlamaDecoderLayer"
RECIPE_EOF

# --- transform and debug ----------------------------------------------------
for cmd in transform debug; do
  out=()
  [ "$cmd" = transform ] && out=(-o "$O")
  expect_error "$cmd unknown pass" "no-such-pass" "$OUT" "$O" -- \
    "$cmd" "$MODEL" --passes=eliminate-dead-code,no-such-pass "${out[@]}"
  expect_error "$cmd empty --passes" "--passes" "$OUT" "$O" -- \
    "$cmd" "$MODEL" --passes= "${out[@]}"
  expect_error "$cmd no --passes" "--passes" "$OUT" "$O" -- \
    "$cmd" "$MODEL" "${out[@]}"
  expect_error "$cmd unknown --targets" "NoSuchLayer" "$OUT" "$O" -- \
    "$cmd" "$MODEL" --passes=eliminate-dead-code --targets=NoSuchLayer "${out[@]}"
  expect_error "$cmd empty --targets" "--targets" "$OUT" "$O" -- \
    "$cmd" "$MODEL" --passes=eliminate-dead-code --targets= "${out[@]}"
  expect_error "$cmd unknown flag" "--no-such-flag" "$OUT" "$O" -- \
    "$cmd" "$MODEL" --passes=eliminate-dead-code --no-such-flag "${out[@]}"
done
expect_error "transform no -o" "-o" "$OUT" "" -- \
  transform "$MODEL" --passes=eliminate-dead-code
expect_error "transform -o -" "-o" "$OUT" "" -- \
  transform "$MODEL" --passes=eliminate-dead-code -o -
for tol in abc -1 nan; do
  expect_error "debug --tolerance=$tol" "--tolerance" "$OUT" "" -- \
    debug "$MODEL" --passes=eliminate-dead-code "--tolerance=$tol"
done
expect_error "debug --tolerance with --rtol" "--tolerance" "$OUT" "" -- \
  debug "$MODEL" --passes=eliminate-dead-code --tolerance=1e-3 --rtol=1e-3

# --- Check tolerances (partition --check, transform --check, debug) ----------
for cmd in partition transform debug; do
  case $cmd in
    partition) args=(partition "$MODEL" --targets=$DEC --check -o "$OUT/plan.txt") ;;
    transform) args=(transform "$MODEL" --passes=eliminate-dead-code --check -o "$O") ;;
    debug) args=(debug "$MODEL" --passes=eliminate-dead-code --targets=$DEC) ;;
  esac
  for flag in --rtol=-1 --atol=abc --rtol=nan --atol=inf --rtol=; do
    expect_error "$cmd $flag" "${flag%%=*}" "$OUT" "$O" -- "${args[@]}" "$flag"
  done
done
expect_error "partition --rtol without --check" "--check" "$OUT" "$OUT/plan.txt" -- \
  partition "$MODEL" --targets=$DEC --rtol=1e-3 -o "$OUT/plan.txt"
expect_error "transform --atol without --check" "--check" "$OUT" "$O" -- \
  transform "$MODEL" --passes=eliminate-dead-code --atol=1e-3 -o "$O"
expect_error "transform --tolerance (debug only)" "--tolerance" "$OUT" "$O" -- \
  transform "$MODEL" --passes=eliminate-dead-code --check --tolerance=1e-3 -o "$O"

# --- Read-only output locations ---------------------------------------------
# Tests run as root, which chmod does not stop: /proc and /sys refuse new
# files whatever the permission bits say, so they stand in for read-only
# directories.
for ro in /proc /sys; do
  [ -d "$ro" ] || continue
  f="$ro/tracecut_bad_input_out"
  expect_error "trace -o in $ro" "$f" "$OUT" "$f" -- trace "$MODEL" -o "$f"
  expect_error "partition -o in $ro" "$f" "$OUT" "$f" -- \
    partition "$MODEL" --targets=$DEC --json -o "$f"
  expect_error "transform -o in $ro" "$f" "$OUT" "$f" -- \
    transform "$MODEL" --passes=eliminate-dead-code -o "$f"
  expect_error "calibrate -o in $ro" "$f" "$OUT" "$f" -- \
    calibrate "$MODEL" "--recipe=$RECIPE_OK" --synthetic=2 -o "$f"
  expect_error "calibrate --report in $ro" "$f" "$OUT" "$O" -- \
    calibrate "$MODEL" "--recipe=$RECIPE_OK" --synthetic=2 -o "$O" \
    "--report=$f"
done

# An existing FIFO as the output: outputs are renamed into place, which
# would replace the node (for /dev/null or /dev/full, as root, the device
# itself; a FIFO in the test's directory is the harmless stand-in).
FIFO="$TMP/fifo_dir/out.fifo"
mkdir -p "$(dirname "$FIFO")"
mkfifo "$FIFO"
for cmd in trace partition transform calibrate; do
  case $cmd in
    trace) args=(trace "$MODEL") ;;
    partition) args=(partition "$MODEL" --targets=$DEC) ;;
    transform) args=(transform "$MODEL" --passes=eliminate-dead-code) ;;
    calibrate) args=(calibrate "$MODEL" "--recipe=$RECIPE_OK" --synthetic=2) ;;
  esac
  expect_error "$cmd -o FIFO" "$FIFO" "$(dirname "$FIFO")" "" -- \
    "${args[@]}" -o "$FIFO"
  if [ ! -p "$FIFO" ]; then
    fail "$cmd -o FIFO" "the FIFO was replaced"
    rm -f "$FIFO"
    mkfifo "$FIFO"
  fi
done

# --- Full disk ----------------------------------------------------------------
# FILE_LIMIT_KB runs tracecut under `ulimit -f` with SIGXFSZ ignored: writes
# past the limit fail with EFBIG, as on a full disk, for that process only.
FILE_LIMIT_KB=1 expect_error "trace -o, disk full" "$O" "$OUT" "$O" -- \
  trace "$MODEL" -o "$O"
FILE_LIMIT_KB=1 expect_error "partition -o, disk full" "$OUT/plan.json" \
  "$OUT" "$OUT/plan.json" -- \
  partition "$MODEL" --targets=$DEC --format=json -o "$OUT/plan.json"
FILE_LIMIT_KB=16 expect_error "transform -o, disk full" "$O" "$OUT" "$O" -- \
  transform "$MODEL" --passes=eliminate-dead-code -o "$O"
# The checkpoints in OUT.pt.run/ or the model itself hit the limit; nothing
# of either may stay.
FILE_LIMIT_KB=64 ALLOW_PROGRESS=1 expect_error "calibrate -o, disk full" "$O" \
  "$OUT" "$O" -- calibrate "$MODEL" "--recipe=$RECIPE_OK" --synthetic=2 -o "$O"

# The intermediates cache spilling to a full disk: a budget of 0 bytes
# sends every activation to a spill file, the first write fails.
SPILL="$TMP/spill"
mkdir -p "$SPILL"
spill_recipe() {
  sed '/^cache/d' "$RECIPE_OK"
  echo "cache { memory_budget_bytes: $1 spill_dir: \"$2\" }"
}
spill_recipe 0 "$SPILL" >"$TMP/recipe_spill.textproto"
FILE_LIMIT_KB=1 ALLOW_PROGRESS=1 ALSO_EMPTY="$SPILL" expect_error \
  "calibrate spill, disk full" "$SPILL/" "$OUT" "$O" -- \
  calibrate "$MODEL" "--recipe=$TMP/recipe_spill.textproto" --synthetic=2 -o "$O"
# A spill directory that cannot be created.
spill_recipe 0 /proc/tracecut_spill >"$TMP/recipe_spill_proc.textproto"
ALLOW_PROGRESS=1 expect_error "calibrate spill dir in /proc" \
  "/proc/tracecut_spill" "$OUT" "$O" -- \
  calibrate "$MODEL" "--recipe=$TMP/recipe_spill_proc.textproto" \
  --synthetic=2 -o "$O"

# Stdout on a full disk (/dev/full opened for writing, never replaced).
if [ -c /dev/full ]; then
  STDOUT_TO=/dev/full expect_error "trace to stdout, disk full" \
    "standard output" "$OUT" "" -- trace "$MODEL"
  STDOUT_TO=/dev/full expect_error "partition --json to stdout, disk full" \
    "standard output" "$OUT" "" -- partition "$MODEL" --targets=$DEC --json
  STDOUT_TO=/dev/full expect_error "debug to stdout, disk full" \
    "standard output" "$OUT" "" -- \
    debug "$MODEL" --passes=eliminate-dead-code --targets=$DEC
fi

# --- Calibration data ---------------------------------------------------------
D="$TMP/data"
mkdir -p "$D"
"$PYTHON" - "$D" <<'PY' 2>/dev/null
import sys, torch
d = sys.argv[1]
torch.save(torch.zeros(0, 16, dtype=torch.int64), f"{d}/zero_samples.pt")
torch.save(torch.zeros(2, 0, dtype=torch.int64), f"{d}/zero_length.pt")
torch.save(torch.tensor(5), f"{d}/scalar.pt")
torch.save(torch.full((2, 16), float("nan")), f"{d}/nan.pt")
torch.save(torch.full((2, 16), float("inf")), f"{d}/inf.pt")
torch.save(torch.randint(0, 256, (2, 16)).to(torch.int8), f"{d}/int8_wraps.pt")
torch.save(torch.randint(0, 2, (2, 16)).bool(), f"{d}/bool.pt")
torch.save(torch.randint(0, 256, (2, 100)), f"{d}/too_long.pt")
torch.save([], f"{d}/empty_list.pt")
PY
: >"$D/empty.jsonl"
printf '\n\n' >"$D/blank_lines.jsonl"
echo '[]' >"$D/empty_row.jsonl"
printf '[1, 2.5, 3]\n' >"$D/fraction.jsonl"
printf '[1, NaN]\n' >"$D/nan.jsonl"
printf '[1, 1e400]\n' >"$D/huge.jsonl"
printf '{"ids": [1, 2]}\n' >"$D/no_input_ids.jsonl"
mkdir -p "$D/directory.pt"
for f in zero_samples.pt zero_length.pt scalar.pt nan.pt inf.pt \
  int8_wraps.pt bool.pt too_long.pt empty_list.pt empty.jsonl \
  blank_lines.jsonl empty_row.jsonl fraction.jsonl nan.jsonl huge.jsonl \
  no_input_ids.jsonl directory.pt; do
  [ -e "$D/$f" ] || { fail "calibrate data $f" "the Python generator did not write it"; continue; }
  expect_error "calibrate data $f" "$D/$f" "$OUT" "$O" -- \
    calibrate "$MODEL" "--recipe=$RECIPE_OK" "--data=$D/$f" -o "$O"
done
for flag in --synthetic=0 --synthetic=-1 --synthetic=abc --batch-size=0 \
  --seq-len=0 --seq-len=-3 --seq-len=100000; do
  name=${flag%%=*}
  mention=${name#--}
  # Checked against the model, not the flag parser: the message names the
  # length (and the model's limit), not the flag.
  [ "$flag" = --seq-len=100000 ] && mention="100000 tokens"
  extra=(--synthetic=2)
  [ "$name" = --synthetic ] && extra=()
  expect_error "calibrate $flag" "$mention" "$OUT" "$O" -- \
    calibrate "$MODEL" "--recipe=$RECIPE_OK" "${extra[@]}" "$flag" -o "$O"
done
expect_error "calibrate --data and --synthetic" "--synthetic" "$OUT" "$O" -- \
  calibrate "$MODEL" "--recipe=$RECIPE_OK" --synthetic=2 "--data=$D/nan.pt" \
  -o "$O"

# --- Calibration data for other models (images, by name or position) --------
CNN="$FIXTURES/cnn.pt"
RECIPE_CNN="$TMP/recipe_cnn.textproto"
cat >"$RECIPE_CNN" <<'RECIPE_EOF'
modifiers { gptq { scheme { bits: 4 group_size: 32 } targets: "Linear" } }
pipeline: SEQUENTIAL
sequential_targets: "Conv2d"
RECIPE_EOF
I="$TMP/images"
mkdir -p "$I"
"$PYTHON" - "$I" <<'PY' 2>/dev/null
import sys, torch
from safetensors.torch import save_file
d = sys.argv[1]
x = torch.randn(4, 3, 16, 16)
torch.save(x, f"{d}/good.pt")
torch.save(torch.randint(0, 255, (4, 3, 16, 16)), f"{d}/int_pixels.pt")
torch.save(torch.randn(4, 16), f"{d}/rank2.pt")
y = x.clone(); y[1, 0, 0, 0] = float("nan")
torch.save(y, f"{d}/nan_pixel.pt")
torch.save(torch.randn(0, 3, 16, 16), f"{d}/no_samples.pt")
torch.save({"pixel_values": x, "labels": torch.zeros(4)}, f"{d}/extra_key.pt")
torch.save({"image": x, "label": 0}, f"{d}/wrong_key.pt")
torch.save((x, x), f"{d}/two_values.pt")
torch.save({"pixel_values": "cat.png", "n": 1}, f"{d}/string_value.pt")
torch.save([x[:2], x[:3]], f"{d}/ragged_list.pt")
save_file({"pixel_values": x.double()[:, :, :, :2].contiguous(),
           "labels": torch.zeros(4)}, f"{d}/extra_key.safetensors")
save_file({"pixel_values": x}, f"{d}/truncated.safetensors")
with open(f"{d}/truncated.safetensors", "r+b") as f:
  f.truncate(f.seek(0, 2) - 100)
PY
printf '[1, 2, 3]\n' >"$I/tokens.jsonl"
for f in int_pixels.pt rank2.pt nan_pixel.pt no_samples.pt extra_key.pt \
  wrong_key.pt two_values.pt string_value.pt ragged_list.pt \
  extra_key.safetensors truncated.safetensors tokens.jsonl; do
  [ -e "$I/$f" ] || { fail "calibrate image data $f" "the Python generator did not write it"; continue; }
  expect_error "calibrate image data $f" "$I/$f" "$OUT" "$O" -- \
    calibrate "$CNN" "--recipe=$RECIPE_CNN" "--data=$I/$f" -o "$O"
done
# --input / --example-inputs describe how calibrate traces the model.
for flag in "--input=pixel_values:float33[1,3,16,16]" "--input=pixel_values[1]" \
  "--input=:float32[1]"; do
  expect_error "calibrate $flag" "--input" "$OUT" "$O" -- \
    calibrate "$CNN" "--recipe=$RECIPE_CNN" "--data=$I/good.pt" "$flag" -o "$O"
done
expect_error "calibrate --example-inputs missing" "$I/none.pt" "$OUT" "$O" -- \
  calibrate "$CNN" "--recipe=$RECIPE_CNN" "--data=$I/good.pt" \
  "--example-inputs=$I/none.pt" -o "$O"
expect_error "calibrate --example-inputs wrong key" "$I/wrong_key.pt" "$OUT" \
  "$O" -- calibrate "$CNN" "--recipe=$RECIPE_CNN" "--data=$I/good.pt" \
  "--example-inputs=$I/wrong_key.pt" -o "$O"
expect_error "calibrate --example-inputs not tensors" "$I/tokens.jsonl" \
  "$OUT" "$O" -- calibrate "$CNN" "--recipe=$RECIPE_CNN" \
  "--data=$I/good.pt" "--example-inputs=$I/tokens.jsonl" -o "$O"
# The good file calibrates (the matrix's data is bad for one reason each).
cases=$((cases + 1))
if "$TRACECUT" calibrate "$CNN" "--recipe=$RECIPE_CNN" "--data=$I/good.pt" \
  --batch-size=2 -o "$OUT/cnn.pt" 2>"$TMP/cnn_err.txt"; then
  echo "ok [calibrate image data good.pt]"
  rm -f "$OUT/cnn.pt"
else
  fail "calibrate image data good.pt" "$(tail -1 "$TMP/cnn_err.txt")"
fi

# --- Recipes ------------------------------------------------------------------
R="$TMP/recipes"
mkdir -p "$R"
sed 's/SEQUENTIAL/SEQUENTAIL/' "$RECIPE_OK" >"$R/enum_typo.textproto"
sed 's/bits: 4/bits: 9/' "$RECIPE_OK" >"$R/bits_9.textproto"
sed 's/bits: 4/bits: "four"/' "$RECIPE_OK" >"$R/bits_string.textproto"
sed 's/targets: "Linear"//' "$RECIPE_OK" >"$R/no_targets.textproto"
spill_recipe -5 "$SPILL" >"$R/negative_budget.textproto"
sed '/^cache/d' "$RECIPE_OK" >"$R/bad_device.textproto"
echo 'cache { offload_device: "gpu" }' >>"$R/bad_device.textproto"
echo 'pipeline: BASIC' >"$R/no_modifiers.textproto"
printf 'modifiers { gptq { scheme { bits: 4 } targets: "Linear" } }\x00\xff\n' \
  >"$R/binary_junk.textproto"
mkdir -p "$R/directory.textproto"
for r in enum_typo bits_9 bits_string no_targets negative_budget bad_device \
  no_modifiers binary_junk directory; do
  expect_error "calibrate recipe $r" "$R/$r.textproto" "$OUT" "$O" -- \
    calibrate "$MODEL" "--recipe=$R/$r.textproto" --synthetic=2 -o "$O"
done

# --- Directories given as files ----------------------------------------------
# Every flag that reads a file says so when given a directory, naming it
# (not "recipe: has no modifiers" or a read error).
DIRARG="$TMP/a_directory"
mkdir -p "$DIRARG"
for flag in --recipe --data --config --example-inputs; do
  case $flag in
    --recipe) args=(calibrate "$MODEL" --synthetic=2 -o "$O") ;;
    --data) args=(calibrate "$MODEL" "--recipe=$RECIPE_OK" -o "$O") ;;
    *) args=(calibrate "$MODEL" "--recipe=$RECIPE_OK" --synthetic=2 -o "$O") ;;
  esac
  expect_error "calibrate $flag=DIR" "$flag: '$DIRARG' is a directory" \
    "$OUT" "$O" -- "${args[@]}" "$flag=$DIRARG"
done
for cmd in trace partition transform; do
  case $cmd in
    trace) args=(trace "$MODEL" -o "$O") ;;
    partition) args=(partition "$MODEL" --targets=$DEC -o "$OUT/plan.txt") ;;
    transform) args=(transform "$MODEL" --passes=eliminate-dead-code -o "$O") ;;
  esac
  for flag in --config --example-inputs; do
    expect_error "$cmd $flag=DIR" "$flag: '$DIRARG' is a directory" \
      "$OUT" "$O" -- "${args[@]}" "$flag=$DIRARG"
  done
done

# --- A model whose embedded config.json is bad --------------------------------
# The error names the model's config once ("m.pt:config.json: ..."), not
# "m.pt: m.pt:config.json: ...".
E="$TMP/embedded"
mkdir -p "$E"
"$PYTHON" - "$MODEL" "$E" <<'PY' 2>/dev/null
import json, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
bad = {
    "wrong_types": lambda c: {**c, "vocab_size": "many", "hidden_size": [128],
                              "num_hidden_layers": "two"},
}
with zipfile.ZipFile(src) as z:
    for name, change in bad.items():
        with zipfile.ZipFile(f"{out}/{name}.pt", "w", zipfile.ZIP_STORED) as w:
            for info in z.infolist():
                data = z.read(info.filename)
                if info.filename.endswith("/extra/config.json"):
                    data = json.dumps(change(json.loads(data))).encode()
                w.writestr(info, data)
PY
for m in wrong_types; do
  f="$E/$m.pt"
  [ -e "$f" ] || { fail "embedded config $m" "the Python generator did not write it"; continue; }
  for cmd in calibrate trace; do
    case $cmd in
      calibrate) args=(calibrate "$f" "--recipe=$RECIPE_OK" --synthetic=2 -o "$O") ;;
      trace) args=(trace "$f" -o "$O") ;;
    esac
    ALLOW_PROGRESS=1 expect_error "$cmd embedded config $m" "$f:config.json" \
      "$OUT" "$O" -- "${args[@]}"
    cases=$((cases + 1))
    if grep -qF -- "$f: $f" "$TMP/stderr.txt"; then
      fail "$cmd embedded config $m" "path repeated: $(cat "$TMP/stderr.txt")"
    fi
  done
done

# --- The user's own files -----------------------------------------------------
# An output that is the input model (the same file, a symbolic or a hard
# link to it, or a file inside an input checkpoint directory) is refused
# before anything runs, and the model is left byte for byte as it was.
U="$TMP/user"
mkdir -p "$U/ckpt"
cp "$MODEL" "$U/model.pt"
ln -sf "$U/model.pt" "$U/link.pt"
ln -f "$U/model.pt" "$U/hard.pt"
cp "$MODEL" "$U/ckpt/model.pt"
sum_before="$(cksum <"$U/model.pt")"
for out in "$U/model.pt" "$U/link.pt" "$U/hard.pt"; do
  expect_error "calibrate -o input $(basename "$out")" "input model" "$U" "" -- \
    calibrate "$U/model.pt" "--recipe=$RECIPE_OK" --synthetic=2 -o "$out"
  expect_error "transform -o input $(basename "$out")" "input model" "$U" "" -- \
    transform "$U/model.pt" --passes=eliminate-dead-code -o "$out"
  expect_error "trace -o input $(basename "$out")" "input model" "$U" "" -- \
    trace "$U/model.pt" -o "$out"
done
expect_error "calibrate -o into the input directory" "input checkpoint" "$U/ckpt" "" -- \
  calibrate "$U/ckpt" "--recipe=$RECIPE_OK" --synthetic=2 -o "$U/ckpt/model.pt"
cases=$((cases + 1))
if [ "$(cksum <"$U/model.pt")" != "$sum_before" ]; then
  fail "input untouched" "$U/model.pt changed"
fi

echo "$cases cases, $failures failures"
[ "$failures" -eq 0 ]
