#!/bin/bash
# Bad-input matrix for the `tracecut` command line: every subcommand that
# `tracecut --help` lists gets missing, empty, truncated and non-TorchScript
# model files, a wrong-typed --config, bad recipes and calibration data (when
# `calibrate` exists) and unwritable output paths. Each case must exit
# non-zero without a signal (< 128), print exactly one non-empty line on
# stderr that names the offending file, and leave neither the -o file nor
# any stray (temp) file in the output directory.

set -u

source "$(dirname "${BASH_SOURCE[0]}")/bad_input_lib.sh"

# --- Bad model files --------------------------------------------------------
BAD="$TMP/models"
mkdir -p "$BAD"
: >"$BAD/empty.pt"
head -c 4096 "$MODEL" >"$BAD/truncated.pt"
# The zip's central directory is at the end: drop just its last bytes.
size=$(stat -c %s "$MODEL")
head -c $((size - 100)) "$MODEL" >"$BAD/truncated_tail.pt"
echo "this is not a model" >"$BAD/text.pt"
# A pickle (what torch.save writes without zip), and a zip that is not
# TorchScript.
printf '\x80\x02}q\x00.' >"$BAD/pickle.pt"
(cd "$BAD" && echo '{}' >data.pkl && zip -q notscript.zip data.pkl 2>/dev/null &&
  mv notscript.zip notscript.pt) || cp "$BAD/text.pt" "$BAD/notscript.pt"
mkdir -p "$BAD/dir.pt"
# What torch.save writes: a zip archive holding a pickle, not TorchScript.
"$PYTHON" -c "import sys, torch; torch.save({'w': torch.ones(2)}, sys.argv[1])" \
  "$BAD/torch_save.pt" 2>/dev/null || cp "$BAD/notscript.pt" "$BAD/torch_save.pt"

# Wrong-typed configs.
CFG="$TMP/configs"
mkdir -p "$CFG"
echo '{"num_hidden_layers": "two", "hidden_size": [128]}' >"$CFG/wrong_types.json"
echo '["not", "an", "object"]' >"$CFG/array.json"
echo '{"hidden_size": 128,' >"$CFG/malformed.json"
: >"$CFG/empty.json"

# Required arguments of each subcommand besides MODEL and -o.
extra_args() {
  case "$1" in
    partition) echo "--targets=LlamaDecoderLayer" ;;
    transform) echo "--passes=eliminate-dead-code" ;;
    calibrate) echo "--recipe=$RECIPE --synthetic=2" ;;
    debug) echo "--passes=eliminate-dead-code" ;;
    *) echo "" ;;
  esac
}
# Whether the subcommand takes -o.
has_output() {
  "$TRACECUT" "$1" --help 2>&1 | grep -q -- '-o\b\|--output'
}

RECIPE="$TMP/recipe_ok.textproto"
cat >"$RECIPE" <<'RECIPE_EOF'
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

subcommands=$("$TRACECUT" --help 2>&1 | awk '/^ +[a-z]+ /{print $1}' |
  grep -E '^(trace|partition|transform|calibrate|debug)$' | sort -u)
if [ -z "$subcommands" ]; then
  echo "no subcommands found in tracecut --help:"
  "$TRACECUT" --help
  exit 1
fi
echo "subcommands: $(echo $subcommands)"

for cmd in $subcommands; do
  # shellcheck disable=SC2046
  set -- $(extra_args "$cmd")
  extra=("$@")
  out=()
  outdir="$TMP/out_$cmd"
  mkdir -p "$outdir"
  outfile=""
  if has_output "$cmd"; then
    outfile="$outdir/out.bin"
    out=(-o "$outfile")
  fi

  expect_error "$cmd missing model" "$BAD/missing.pt" "$outdir" "$outfile" -- \
    "$cmd" "$BAD/missing.pt" "${extra[@]}" "${out[@]}"
  for bad in empty truncated truncated_tail text pickle notscript torch_save dir; do
    expect_error "$cmd $bad model" "$BAD/$bad.pt" "$outdir" "$outfile" -- \
      "$cmd" "$BAD/$bad.pt" "${extra[@]}" "${out[@]}"
  done

  if "$TRACECUT" "$cmd" --help 2>&1 | grep -q -- '--config'; then
    for c in wrong_types array malformed empty missing; do
      expect_error "$cmd config $c" "$CFG/$c.json" "$outdir" "$outfile" -- \
        "$cmd" "$MODEL" "--config=$CFG/$c.json" "${extra[@]}" "${out[@]}"
    done
  fi

  if [ -n "$outfile" ]; then
    # Output under a missing directory, and under a regular file (root
    # ignores permission bits, so no read-only cases).
    expect_error "$cmd output in missing dir" "$TMP/no_such_dir/out.bin" \
      "$outdir" "$TMP/no_such_dir/out.bin" -- \
      "$cmd" "$MODEL" "${extra[@]}" -o "$TMP/no_such_dir/out.bin"
    : >"$TMP/regular_file"
    expect_error "$cmd output under a file" "$TMP/regular_file/out.bin" \
      "$outdir" "" -- \
      "$cmd" "$MODEL" "${extra[@]}" -o "$TMP/regular_file/out.bin"
    # The output path is an existing directory.
    mkdir -p "$outdir/is_a_dir"
    expect_error "$cmd output is a directory" "$outdir/is_a_dir" \
      "$outdir" "" -- \
      "$cmd" "$MODEL" "${extra[@]}" -o "$outdir/is_a_dir"
    rmdir "$outdir/is_a_dir"
  fi
done

# --- calibrate: recipes and data ---------------------------------------------
if echo "$subcommands" | grep -qx calibrate; then
  outdir="$TMP/out_calibrate_data"
  mkdir -p "$outdir"
  outfile="$outdir/out.pt"
  R="$TMP/recipes"
  mkdir -p "$R"
  echo 'modifers { gptq { scheme: "W4A16" } }' >"$R/typo_field.textproto"
  echo 'this is { not textproto' >"$R/garbage.textproto"
  : >"$R/empty.textproto"
  for r in typo_field garbage missing; do
    expect_error "calibrate recipe $r" "$R/$r.textproto" "$outdir" "$outfile" -- \
      calibrate "$MODEL" "--recipe=$R/$r.textproto" --synthetic=2 -o "$outfile"
  done
  D="$TMP/data"
  mkdir -p "$D"
  "$PYTHON" - "$D" <<'PY' 2>/dev/null
import sys, torch
d = sys.argv[1]
torch.save(torch.randint(0, 256, (2, 16)).float(), f"{d}/float_ids.pt")
torch.save(torch.randint(0, 256, (2, 3, 16)), f"{d}/rank3.pt")
torch.save(torch.randint(100000, 100010, (2, 16)), f"{d}/out_of_range.pt")
torch.save(torch.randint(-5, 0, (2, 16)), f"{d}/negative.pt")
torch.save({"input_ids": "hello"}, f"{d}/string_ids.pt")
PY
  echo "not a tensor" >"$D/text.pt"
  for f in float_ids rank3 out_of_range negative string_ids text missing; do
    [ "$f" != missing ] && [ ! -f "$D/$f.pt" ] && continue
    expect_error "calibrate data $f" "$D/$f.pt" "$outdir" "$outfile" -- \
      calibrate "$MODEL" "--recipe=$RECIPE" "--data=$D/$f.pt" -o "$outfile"
  done
fi

echo "$cases cases, $failures failures"
[ "$failures" -eq 0 ]
