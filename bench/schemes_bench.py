"""Time and peak RSS per compressed-tensors preset, tracecut against
llm-compressor in the same run (issue 30).

  schemes_bench.py TRACECUT OUT_DIR [PRESET...]

One seeded bf16 Llama checkpoint (4 layers, hidden 512, from a config) is
exported once; then per preset, each under /usr/bin/time -v in its own
process, one after the other:
  ours: tracecut calibrate CKPT --scheme=PRESET -o OUT (round-to-nearest,
        every Linear but lm_head, compressed-tensors output)
  peer: llm-compressor oneshot(QuantizationModifier(targets="Linear",
        scheme=PRESET, ignore=["lm_head"])) + save_pretrained(save_compressed)
Both with OMP_NUM_THREADS=1. Prints a markdown table (wall seconds and peak
RSS of the whole process, model load included).
"""

import os
import re
import subprocess
import sys

PRESETS = ["W4A16", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16",
           "MXFP4A16"]

PEER = r"""
import sys, torch, transformers
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
ckpt, preset, out = sys.argv[1:4]
model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
model = oneshot(model=model, recipe=QuantizationModifier(
    targets="Linear", scheme=preset, ignore=["lm_head"]))
model.save_pretrained(out, save_compressed=True)
"""

MAKE = r"""
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size=4096, hidden_size=512, intermediate_size=1536,
    num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
    max_position_embeddings=256)
transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""


def timed(cmd, env):
  p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True,
                     text=True, env=env)
  if p.returncode != 0:
    raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
  rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                      p.stderr).group(1)) * 1024
  h, m, s = re.search(
      r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)",
      p.stderr).groups()
  return int(h or 0) * 3600 + int(m) * 60 + float(s), rss


def main():
  tracecut, out = os.path.abspath(sys.argv[1]), sys.argv[2]
  presets = sys.argv[3:] or PRESETS
  env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
             TRANSFORMERS_VERBOSITY="error")
  ckpt = os.path.join(out, "llama")
  subprocess.run([sys.executable, "-c", MAKE, ckpt], check=True, env=env)
  subprocess.run([tracecut, "export", ckpt, "-o",
                  os.path.join(ckpt, "model.pt2")], check=True, env=env,
                 capture_output=True)
  print("| preset | tracecut s | tracecut peak RSS | llm-compressor s | "
        "llm-compressor peak RSS |")
  print("|---|---|---|---|---|")
  for preset in presets:
    ours = timed([tracecut, "calibrate", ckpt, "--scheme=" + preset, "-o",
                  os.path.join(out, "tracecut-" + preset)], env)
    peer = timed([sys.executable, "-c", PEER, ckpt, preset,
                  os.path.join(out, "llmcompressor-" + preset)], env)
    mib = lambda b: f"{b / 2**20:.0f} MiB"
    print(f"| {preset} | {ours[0]:.2f} | {mib(ours[1])} | {peer[0]:.2f} | "
          f"{mib(peer[1])} |", flush=True)


if __name__ == "__main__":
  main()
