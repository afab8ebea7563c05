#!/usr/bin/env bash
# The GPU check (issue 33): GPTQ W4A16 (int4 weights, groups of 128, every
# Linear but lm_head, sequential pipeline) on one GPU, tracecut against
# llm-compressor on the same checkpoint and tokens. Runs ON the device
# machine, from the repository root, with the bundle that
# bench/gpu/bundle.sh made (bench/gpu/out/bundle): no Bazel, no network;
# Python 3.12 with torch and transformers from the image.
#
#   bash bench/gpu/run.sh                    # Llama-3.2-1B shape, 128 x 2048
#   SIZE=tiny bash bench/gpu/run.sh          # a smoke run, about a minute
#   SIZE=8b bash bench/gpu/run.sh            # Llama-3-8B shape (> 10 min)
#
# Steps, each under `timeout` with its log in $WORK/detail:
#   setup        bundle/wheels (and bench/gpu/out/wheels-extra where it
#                travelled) -> $WORK/pylib (install_wheels.py), on
#                PYTHONPATH from then on: llm-compressor, compressed-tensors
#                and what the image lacks of their dependencies
#   env          versions, GPU (report.py env)
#   model        seeded bf16 Llama checkpoint + tokenizer, calibration and
#                held-out token ids (make_model.py; on the GPU)
#   export       bundle/bin/tracecut export CKPT --meta -o CKPT/model.pt2
#   tracecut     bundle/bin/tracecut calibrate CKPT --recipe=GPTQ W4A16
#                --data=calib.pt --device=cuda, under timed.py
#   llmcompressor  llmc_run.py: oneshot, same recipe and data, under timed.py
#   quality      logit_error.py: final-logit relative error of both outputs
#                against the original on the held-out batch, on the GPU
#   table        report.py table: results.json, results.md, printed
# A tool that fails or times out leaves its row and log tail; the others
# still run. Exit status 0 when both tools and the quality step succeeded.
#
# The results directory ($OUT) gets four files, so that all of them come
# back from a device call (at most 8 files): results.md (the table),
# results.json (the numbers), run.log (this script's output) and
# detail.tar.gz (every step's log and JSON, tracecut's calibrate report,
# the recipe), rewritten after each step so a run cut short still returns
# what it did.
#
# Environment (defaults):
#   SIZE=1b|8b|tiny  NSAMPLES=128  SEQLEN=2048  HELD=8x512 (rows x tokens)
#   OUT=bench/gpu/out/results  (the four files above)
#   WHEELS_EXTRA=bench/gpu/out/wheels-extra  (see bundle.sh)
#   WORK=/tmp/tracecut-gpu-work (checkpoint, outputs, installed wheels;
#                                kept, so a rerun skips the setup and the
#                                model if unchanged)
#   BUNDLE=bench/gpu/out/bundle  PYTHON=python3
#   DEADLINE_S   the whole run's time budget in seconds (1b: 540, tiny:
#                420, 8b: 3000); each step's timeout is cut to what is left,
#                tracecut's to half of what is left for the two tools
#   LLMC_LOAD=cuda|cpu  where llm-compressor loads the model (cuda: the whole
#                model on the GPU; cpu: host memory, each layer moved to the
#                GPU by its sequential pipeline)
#   DEVICE=cuda  cpu for a smoke test without a GPU (everything on the CPU)
#   TRACECUT_DEVICE_FLAG  default --device=$DEVICE; set it empty for a
#                tracecut that has no --device flag
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"

SIZE=${SIZE:-1b}
NSAMPLES=${NSAMPLES:-128}
SEQLEN=${SEQLEN:-2048}
HELD=${HELD:-8x512}
DEVICE=${DEVICE:-cuda}
LLMC_LOAD=${LLMC_LOAD:-cuda}
if [[ $DEVICE == cpu ]]; then LLMC_LOAD=cpu; fi
PYTHON=${PYTHON:-python3}
BUNDLE=${BUNDLE:-$repo/bench/gpu/out/bundle}
WORK=${WORK:-/tmp/tracecut-gpu-work}
TRACECUT_DEVICE_FLAG=${TRACECUT_DEVICE_FLAG---device=$DEVICE}
WHEELS_EXTRA=${WHEELS_EXTRA:-$repo/bench/gpu/out/wheels-extra}
results=${OUT:-$repo/bench/gpu/out/results}

# Timeouts (seconds) per step: setup env model export tracecut llmc quality.
case $SIZE in
  tiny) caps=(150 60 120 120 150 180 120) deadline=420 reserve=60 ;;
  1b) caps=(150 60 150 150 300 300 150) deadline=540 reserve=90 ;;
  8b) caps=(150 60 300 200 1200 1200 400) deadline=3000 reserve=300 ;;
  *) echo "run.sh: SIZE must be tiny, 1b or 8b (got $SIZE)" >&2; exit 2 ;;
esac
DEADLINE_S=${DEADLINE_S:-$deadline}

mkdir -p "$results" "$WORK"
results=$(cd "$results" && pwd)
WORK=$(cd "$WORK" && pwd)
detail=$WORK/detail
rm -rf "$detail"
mkdir -p "$detail"
rm -f "$results/results.md" "$results/results.json" "$results/detail.tar.gz"
exec > >(tee "$results/run.log") 2>&1
BUNDLE=$(cd "$BUNDLE" 2>/dev/null && pwd) || {
  echo "run.sh: no bundle at ${BUNDLE}: run bash bench/gpu/bundle.sh on the" \
    "build machine first" >&2
  exit 2
}
here=$repo/bench/gpu
tracecut=$BUNDLE/bin/tracecut
ckpt=$WORK/model
printf 'step\trc\tseconds\ttimeout_s\tnote\n' >"$detail/steps.tsv"

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
export HF_HOME=$WORK/hf PYTHONUNBUFFERED=1
gpu_args=()
if [[ $DEVICE == cpu ]]; then
  export CUDA_VISIBLE_DEVICES=""
else
  # nvidia-smi's index (or UUID) of the GPU the tools see first.
  first_gpu=${CUDA_VISIBLE_DEVICES:-0}
  first_gpu=${first_gpu%%,*}
  gpu_args=("--gpu=${first_gpu:-0}")
fi

start=$SECONDS
say() { printf '[%s +%4ds] %s\n' "$(date -u +%H:%M:%S)" "$((SECONDS - start))" "$*"; }

# record NAME RC SECONDS TIMEOUT [NOTE]
# (and refreshes detail.tar.gz, so that a run cut short returns what it did)
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >>"$detail/steps.tsv"
  tar -czf "$results/detail.tar.gz" -C "$detail" . 2>/dev/null || true
}

# step NAME CAP SHARE RESERVE CMD...: runs CMD under timeout with stdout and
# stderr in $detail/NAME.log. The timeout is CAP, cut to 1/SHARE of the
# time left before the deadline less RESERVE (kept for the later steps).
step() {
  local name=$1 cap=$2 share=$3 keep=$4
  shift 4
  local left=$((DEADLINE_S - (SECONDS - start) - keep))
  local t=$((left / share))
  ((t > cap)) && t=$cap
  if ((t < 15)); then
    say "$name: skipped, the deadline (DEADLINE_S=$DEADLINE_S) is near"
    record "$name" 125 0 "$t" "skipped: deadline"
    return 125
  fi
  say "$name (timeout ${t}s): $*"
  local t0=$SECONDS rc=0
  timeout -k 15 "$t" "$@" >"$detail/$name.log" 2>&1 || rc=$?
  record "$name" "$rc" "$((SECONDS - t0))" "$t"
  if ((rc == 0)); then
    say "$name: ok, $((SECONDS - t0)) s"
  else
    if ((rc == 124 || rc == 137)); then
      say "$name: TIMED OUT after ${t}s; last lines of $detail/$name.log:"
    else
      say "$name: FAILED (exit $rc); last lines of $detail/$name.log:"
    fi
    grep -v '%|' "$detail/$name.log" | tail -n 15 | sed 's/^/    /' || true
  fi
  return "$rc"
}

# skip NAME WHY
skip() {
  say "$1: skipped ($2)"
  record "$1" 125 0 0 "skipped: $2"
}

say "GPU check: SIZE=$SIZE NSAMPLES=$NSAMPLES SEQLEN=$SEQLEN DEVICE=$DEVICE" \
  "LLMC_LOAD=$LLMC_LOAD DEADLINE_S=$DEADLINE_S; results in $results, work in $WORK"
if [[ -f $BUNDLE/BUILD_INFO.json ]]; then cp "$BUNDLE/BUILD_INFO.json" "$detail/bundle.json"; fi

# 1. Python packages (no network): only what the image lacks.
ok_setup=1
step setup "${caps[0]}" 1 "$reserve" \
  "$PYTHON" "$here/install_wheels.py" "$WORK/pylib" "$BUNDLE/wheels" "$WHEELS_EXTRA" ||
  ok_setup=0
export PYTHONPATH=$WORK/pylib${PYTHONPATH:+:$PYTHONPATH}
# The exporter (bundle's libtorch/python) runs this Python too.
export TRACECUT_PYTHON=$PYTHON

# 2. Versions and GPU.
step env "${caps[1]}" 1 "$reserve" "$PYTHON" "$here/report.py" env "$detail" || true

# 3. The model and the data.
ok_model=1
step model "${caps[2]}" 1 "$reserve" \
  "$PYTHON" "$here/make_model.py" "$WORK" "--size=$SIZE" "--nsamples=$NSAMPLES" \
  "--seqlen=$SEQLEN" "--held=$HELD" "--device=$DEVICE" || ok_model=0
if ((ok_model)); then cp "$WORK/model.json" "$detail/model.json"; fi

# The PyTorch the bundled tracecut runs against: the image's.
if [[ -z ${TORCH_LIB:-} ]]; then
  TORCH_LIB=$("$PYTHON" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || TORCH_LIB=
fi
export TORCH_LIB

recipe=$detail/gptq_w4a16.textproto
cat >"$recipe" <<'EOF'
# bench/gpu/run.sh: GPTQ W4A16 (int4, groups of 128, symmetric) on every
# Linear but lm_head, one decoder layer at a time; llm-compressor's
# GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]).
modifiers { gptq { scheme { preset: "W4A16" } targets: "Linear" ignore: "lm_head" } }
pipeline: SEQUENTIAL
EOF

# 4-5. tracecut.
ok_ours=0
if ((!ok_model)); then
  skip export "no model"
  skip tracecut "no model"
elif step export "${caps[3]}" 1 "$reserve" \
  "$PYTHON" "$here/timed.py" --json "$detail/export.time.json" -- \
  "$tracecut" export "$ckpt" --meta -o "$ckpt/model.pt2"; then
  rm -rf "$WORK"/out_tracecut*
  device_flag=()
  if [[ -n $TRACECUT_DEVICE_FLAG ]]; then device_flag=("$TRACECUT_DEVICE_FLAG"); fi
  if step tracecut "${caps[4]}" 2 "$reserve" \
    "$PYTHON" "$here/timed.py" --json "$detail/tracecut.time.json" "${gpu_args[@]}" -- \
    "$tracecut" calibrate "$ckpt" "--recipe=$recipe" "--data=$WORK/calib.pt" \
    "${device_flag[@]}" -o "$WORK/out_tracecut" \
    "--report=$detail/tracecut_report.json"; then
    ok_ours=1
  fi
else
  skip tracecut "export failed"
fi

# 6. llm-compressor.
ok_theirs=0
if ((!ok_model)); then
  skip llmcompressor "no model"
elif ((!ok_setup)) && ! "$PYTHON" -c 'import llmcompressor' >/dev/null 2>&1; then
  skip llmcompressor "setup failed: llmcompressor does not import"
else
  rm -rf "$WORK/out_llmcompressor"
  if step llmcompressor "${caps[5]}" 1 "$reserve" \
    "$PYTHON" "$here/timed.py" --json "$detail/llmcompressor.time.json" "${gpu_args[@]}" -- \
    "$PYTHON" "$here/llmc_run.py" "$ckpt" "$WORK/calib.pt" "$WORK/out_llmcompressor" \
    "$detail/llmc_result.json" "--device=$DEVICE" "--load=$LLMC_LOAD"; then
    ok_theirs=1
  fi
fi

# 7. Quality: whichever outputs exist.
ok_quality=0
outputs=()
((ok_ours)) && outputs+=("tracecut=$WORK/out_tracecut")
((ok_theirs)) && outputs+=("llm-compressor=$WORK/out_llmcompressor")
if ((${#outputs[@]})); then
  if step quality "${caps[6]}" 1 10 \
    "$PYTHON" "$here/logit_error.py" "$ckpt" "$WORK/held.pt" "$detail/quality.json" \
    "${outputs[@]}" "--device=$DEVICE"; then
    ok_quality=1
  fi
else
  skip quality "no output to measure"
fi

# 8. The table.
say "done in $((SECONDS - start)) s; results in $results (logs: $detail)"
"$PYTHON" "$here/report.py" table "$detail" || say "report.py table failed"
cp "$detail/results.md" "$detail/results.json" "$results/" 2>/dev/null || true
tar -czf "$results/detail.tar.gz" -C "$detail" . 2>/dev/null || true
((ok_ours && ok_theirs && ok_quality))
