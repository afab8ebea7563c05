"""GPTQ W4A16 calibration, tracecut against llm-compressor in the same run
(issue 32): wall time, peak RSS and final-logit error, interleaved.

  gptq_peer_bench.py TRACECUT OUT_DIR [--hidden=1024] [--layers=4]
      [--rounds=2] [--threads=2] [--quality-seeds=K]

One seeded bf16 LlamaForCausalLM (hidden --hidden, intermediate 2.75x,
heads of 64, half as many KV heads, vocab 8000) from a config, exported once
(`tracecut export --meta`, timed: calibrate streams the weights from the
safetensors), then exported again (timed: the export cache's copy);
32 x 128 seeded tokens. Then --rounds times, one
process after the other, each under /usr/bin/time -v with --threads intra-op
threads (OMP_NUM_THREADS and, for tracecut, --threads):
  ours: tracecut calibrate CKPT --recipe=gptq W4A16 preset (every Linear but
        lm_head, sequential pipeline) --data=TOKENS
  ours, native: the same on a copy of the checkpoint without the .pt2
        (tracecut builds the Llama from config.json: no export; its shards
        must be the bytes of ours)
  ours, bf16: the same on a copy whose .pt2 is `export --meta --dtype=auto`
        (timed, uncached): transformers' bf16 program, computing in the
        checkpoint's dtype as llm-compressor does
  ours, native bf16: the native model with --dtype=auto (its shards must be
        the bytes of "ours, bf16")
  peer: llm-compressor oneshot(GPTQModifier(targets="Linear",
        scheme="W4A16", ignore=["lm_head"]), pipeline="sequential") on the
        same tokens + save_pretrained(save_compressed=True)
--quality-seeds=K adds K calibration sets (seeds 1..K), one run of each tool
(ours in float32 and native in bf16) on each, and prints every set's errors
and their mean. Both outputs are loaded by transformers (compressed-tensors decompresses
them) and compared with the original on 4 x 64 held-out tokens (relative
Frobenius error of the final logits). Prints a markdown table.
"""

import argparse
import filecmp
import os
import re
import shutil
import subprocess
import sys

PEER = r"""
import sys, torch, transformers
from datasets import Dataset
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import GPTQModifier
import llmcompressor.pipelines.cache as cache
cache.IntermediatesCache.pin_memory = lambda self, *a, **k: None  # CPU
ckpt, data, out, threads = sys.argv[1:5]
torch.set_num_threads(int(threads))
model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
ids = torch.load(data)
ds = Dataset.from_dict({"input_ids": ids.tolist(),
                        "attention_mask": torch.ones_like(ids).tolist()})
recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
model = oneshot(model=model, dataset=ds, recipe=recipe,
                max_seq_length=ids.shape[1], num_calibration_samples=ids.shape[0],
                shuffle_calibration_samples=False, pipeline="sequential")
model.save_pretrained(out, save_compressed=True)
"""

SEEDED = r"""
import sys, torch
g = torch.Generator().manual_seed(1000 + int(sys.argv[2]))
torch.save(torch.randint(0, 8000, (32, 128), generator=g), sys.argv[1])
"""

MAKE = r"""
import sys, torch, transformers
sys.path.insert(0, sys.argv[4])
from schemes_test import save_tokenizer
hidden, layers = int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=8000, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
    num_hidden_layers=layers, num_attention_heads=hidden // 64,
    num_key_value_heads=hidden // 128, max_position_embeddings=256)
transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
save_tokenizer(sys.argv[1], 8000)
g = torch.Generator().manual_seed(0)
torch.save(torch.randint(0, 8000, (32, 128), generator=g), sys.argv[1] + "-calib.pt")
torch.save(torch.randint(0, 8000, (4, 64), generator=g), sys.argv[1] + "-held.pt")
"""

ERROR = r"""
import sys, torch, transformers
ckpt, held = sys.argv[1], torch.load(sys.argv[2])
def logits(path):
  m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
  with torch.no_grad():
    return m(input_ids=held).logits.float()
want = logits(ckpt)
for out in sys.argv[3:]:
  got = logits(out)
  print(out, ((got - want).norm() / want.norm()).item())
"""


def timed(cmd, env):
  p = subprocess.run(["/usr/bin/time", "-v"] + cmd, env=env,
                     capture_output=True, text=True)
  if p.returncode != 0:
    sys.exit(f"{cmd[0]} failed:\n{p.stderr[-3000:]}")
  wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", p.stderr).group(1)
  parts = [float(x) for x in wall.split(":")]
  seconds = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
  kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                     p.stderr).group(1))
  return seconds, kb / 1024 / 1024


def copy_checkpoint(src, dst):
  """`dst`: a copy of checkpoint `src`'s config and safetensors."""
  if not os.path.isdir(dst):
    os.makedirs(dst)
    for name in os.listdir(src):
      if name.endswith((".json", ".safetensors")):
        shutil.copy(os.path.join(src, name), dst)
  return dst


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("tracecut")
  ap.add_argument("out_dir")
  ap.add_argument("--hidden", type=int, default=1024)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--threads", type=int, default=2)
  # One calibration set says little about quality, GPTQ's result moves with
  # its data: K more sets, one run of each tool on each (--rounds=0: only
  # those).
  ap.add_argument("--quality-seeds", type=int, default=0)
  a = ap.parse_args()
  py = sys.executable
  here = os.path.dirname(os.path.abspath(__file__))
  tests_hf = os.path.join(os.path.dirname(here), "tests", "hf")
  os.makedirs(a.out_dir, exist_ok=True)
  ckpt = os.path.join(a.out_dir, f"llama-h{a.hidden}-l{a.layers}")
  env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), HF_HUB_OFFLINE="1",
             TRANSFORMERS_VERBOSITY="error")
  if not os.path.isdir(ckpt):
    subprocess.run([py, "-c", MAKE, ckpt, str(a.hidden), str(a.layers),
                    tests_hf], check=True, env=env)
  # --meta, as the README's flow: the .pt2 holds the graph and calibrate
  # streams each decoder layer's weights from the safetensors.
  export_s, export_gib = timed(
      [a.tracecut, "export", ckpt, "--meta", "-o",
       os.path.join(ckpt, "model.pt2")], env)
  # Again: the export cache's copy (a re-export, or another checkpoint of
  # the same config and layout).
  cached_s, _ = timed(
      [a.tracecut, "export", ckpt, "--meta", "-o",
       os.path.join(ckpt, "model.pt2")], env)
  # The checkpoint with a bf16 program (`export --dtype=auto`), timed.
  bf16_ckpt = copy_checkpoint(ckpt, ckpt + "-bf16")
  bf16_export_s, _ = timed(
      [a.tracecut, "export", bf16_ckpt, "--meta", "--dtype=auto",
       "--no-cache", "-o", os.path.join(bf16_ckpt, "model.pt2")], env)
  # The checkpoint as transformers wrote it, without a .pt2: tracecut builds
  # its Llama from config.json (tracer/native_model.h), no export at all.
  native = copy_checkpoint(ckpt, ckpt + "-native")
  recipe = os.path.join(a.out_dir, "gptq_w4a16.textproto")
  with open(recipe, "w") as f:
    f.write('modifiers { gptq { scheme { preset: "W4A16" } targets: "Linear" '
            'ignore: "lm_head" } }\n')
  rows = []
  for r in range(a.rounds):
    ours = os.path.join(a.out_dir, f"tracecut-{r}")
    peer = os.path.join(a.out_dir, f"llmcompressor-{r}")
    rows.append(("tracecut", r) + timed(
        [a.tracecut, "calibrate", ckpt, "--recipe=" + recipe,
         "--data=" + ckpt + "-calib.pt", f"--threads={a.threads}",
         "-o", ours], env))
    rows.append(("tracecut native", r) + timed(
        [a.tracecut, "calibrate", native, "--recipe=" + recipe,
         "--data=" + ckpt + "-calib.pt", f"--threads={a.threads}",
         "-o", ours + "-native"], env))
    # As llm-compressor computes: in the checkpoint's dtype (bfloat16).
    rows.append(("tracecut native bf16", r) + timed(
        [a.tracecut, "calibrate", native, "--recipe=" + recipe,
         "--data=" + ckpt + "-calib.pt", f"--threads={a.threads}",
         "--dtype=auto", "-o", ours + "-native-bf16"], env))
    rows.append(("tracecut bf16", r) + timed(
        [a.tracecut, "calibrate", bf16_ckpt, "--recipe=" + recipe,
         "--data=" + ckpt + "-calib.pt", f"--threads={a.threads}",
         "-o", ours + "-bf16"], env))
    rows.append(("llm-compressor", r) + timed(
        [py, "-W", "ignore", "-c", PEER, ckpt, ckpt + "-calib.pt", peer,
         str(a.threads)], env))
  sets = ([("tracecut-0", "llmcompressor-0", "tracecut-0-native-bf16")]
          if a.rounds else [])
  if a.rounds:
    # The native build must calibrate to the export's bytes, in float32 and
    # in bf16.
    for got, want in (("tracecut-0-native", "tracecut-0"),
                      ("tracecut-0-native-bf16", "tracecut-0-bf16")):
      for name in os.listdir(os.path.join(a.out_dir, want)):
        if name.endswith(".safetensors") and not filecmp.cmp(
            os.path.join(a.out_dir, want, name),
            os.path.join(a.out_dir, got, name), shallow=False):
          sys.exit(f"{got} differs from {want} in {name}")
  for seed in range(1, a.quality_seeds + 1):
    data = os.path.join(a.out_dir, f"calib-seed{seed}.pt")
    subprocess.run([py, "-c", SEEDED, data, str(seed)], check=True, env=env)
    three = (f"tracecut-seed{seed}", f"llmcompressor-seed{seed}",
             f"tracecut-bf16-seed{seed}")
    timed([a.tracecut, "calibrate", ckpt, "--recipe=" + recipe,
           "--data=" + data, f"--threads={a.threads}", "-o",
           os.path.join(a.out_dir, three[0])], env)
    timed([py, "-W", "ignore", "-c", PEER, ckpt, data,
           os.path.join(a.out_dir, three[1]), str(a.threads)], env)
    timed([a.tracecut, "calibrate", native, "--recipe=" + recipe,
           "--data=" + data, f"--threads={a.threads}", "--dtype=auto", "-o",
           os.path.join(a.out_dir, three[2])], env)
    sets.append(three)
  p = subprocess.run(
      [py, "-W", "ignore", "-c", ERROR, ckpt, ckpt + "-held.pt"] +
      [os.path.join(a.out_dir, d) for three in sets for d in three],
      check=True, env=env, capture_output=True, text=True)
  errors = [float(line.split()[-1])
            for line in p.stdout.splitlines()[-3 * len(sets):]]
  load = os.getloadavg()
  print(f"hidden {a.hidden}, {a.layers} layers, bf16; 32 x 128 tokens; "
        f"{a.threads} threads each; load average at the end "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
  print(f"tracecut export: {export_s:.1f} s, {export_gib:.2f} GiB; again "
        f"(from the export cache): {cached_s:.2f} s")
  if a.rounds:
    print_times(rows, export_s, cached_s, bf16_export_s, errors)
  if len(sets) > 1 or not a.rounds:
    print("| calibration tokens | tracecut | llm-compressor | tracecut bf16 |")
    print("|---|---|---|---|")
    for i, three in enumerate(sets):
      print(f"| {three[0].split('-', 1)[1]} | {errors[3 * i]:.4f} "
            f"| {errors[3 * i + 1]:.4f} | {errors[3 * i + 2]:.4f} |")
    n = len(sets)
    print(f"| mean | {sum(errors[0::3]) / n:.4f} | "
          f"{sum(errors[1::3]) / n:.4f} | {sum(errors[2::3]) / n:.4f} |")


def print_times(rows, export_s, cached_s, bf16_export_s, errors):
  print("| tool | round | wall s | peak RSS GiB |")
  print("|---|---|---|---|")
  for tool, r, s, gib in rows:
    print(f"| {tool} | {r} | {s:.1f} | {gib:.2f} |")
  ours = [s for t, _, s, _ in rows if t == "tracecut"]
  native = [s for t, _, s, _ in rows if t == "tracecut native"]
  theirs = [s for t, _, s, _ in rows if t == "llm-compressor"]
  ours_gib = max(g for t, _, _, g in rows if t == "tracecut")
  native_gib = max(g for t, _, _, g in rows if t == "tracecut native")
  bf16 = [s for t, _, s, _ in rows if t == "tracecut native bf16"]
  bf16_gib = max(g for t, _, _, g in rows if t == "tracecut native bf16")
  theirs_gib = max(g for t, _, _, g in rows if t == "llm-compressor")
  print(f"wall ratio (mean): {sum(ours) / sum(theirs):.2f}; with export: "
        f"{(sum(ours) + export_s * len(ours)) / sum(theirs):.2f} (the "
        f"export cached: {(sum(ours) + cached_s * len(ours)) / sum(theirs):.2f}"
        f"); peak RSS ratio: {ours_gib / theirs_gib:.2f}")
  print(f"native (the checkpoint directory, no export): wall ratio "
        f"{sum(native) / sum(theirs):.2f}, peak RSS ratio "
        f"{native_gib / theirs_gib:.2f}")
  exp16 = [s for t, _, s, _ in rows if t == "tracecut bf16"]
  exp16_gib = max(g for t, _, _, g in rows if t == "tracecut bf16")
  with_export = (sum(exp16) + bf16_export_s * len(exp16)) / sum(theirs)
  print(f"bf16 program (export --dtype=auto, {bf16_export_s:.1f} s uncached, "
        f"llm-compressor's dtype): wall ratio {sum(exp16) / sum(theirs):.2f}, "
        f"with the export {with_export:.2f}; peak RSS ratio "
        f"{exp16_gib / theirs_gib:.2f}")
  print(f"native in bf16 (--dtype=auto, no export): wall "
        f"ratio {sum(bf16) / sum(theirs):.2f}, peak RSS ratio "
        f"{bf16_gib / theirs_gib:.2f}")
  print(f"final-logit relative error: tracecut {errors[0]:.4f}, "
        f"llm-compressor {errors[1]:.4f}, tracecut bf16 {errors[2]:.4f}")


if __name__ == "__main__":
  main()
