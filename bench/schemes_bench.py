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
Presets with static input activations (FP8, NVFP4) calibrate them on the
same 32 x 128 seeded tokens on both sides (tracecut --data; llm-compressor
its sequential pipeline over that dataset). Both with OMP_NUM_THREADS=1.
Prints a markdown table (wall seconds and peak RSS of the whole process,
model load included).
"""

import os
import re
import subprocess
import sys

PRESETS = ["W4A16", "W8A8", "FP8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4",
           "NVFP4A16", "MXFP4A16"]
STATIC_INPUT = {"FP8", "NVFP4"}

PEER = r"""
import sys, torch, transformers
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
ckpt, preset, out = sys.argv[1:4]
model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
recipe = QuantizationModifier(targets="Linear", scheme=preset, ignore=["lm_head"])
if len(sys.argv) > 4:  # calibration tokens
  from datasets import Dataset
  import llmcompressor.pipelines.cache as cache
  cache.IntermediatesCache.pin_memory = lambda self, *a, **k: None  # CPU
  ids = torch.load(sys.argv[4])
  ds = Dataset.from_dict({"input_ids": ids.tolist(),
                          "attention_mask": torch.ones_like(ids).tolist()})
  model = oneshot(model=model, dataset=ds, recipe=recipe,
                  max_seq_length=ids.shape[1], num_calibration_samples=ids.shape[0],
                  shuffle_calibration_samples=False, pipeline="sequential")
else:
  model = oneshot(model=model, recipe=recipe)
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
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
vocab = {f"t{i}": i for i in range(config.vocab_size)}
transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(
    WordLevel(vocab, unk_token="t0"))).save_pretrained(sys.argv[1])
torch.save(torch.randint(0, config.vocab_size, (32, 128),
                         generator=torch.Generator().manual_seed(1)),
           sys.argv[2])
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
  data = os.path.join(out, "calib.pt")
  subprocess.run([sys.executable, "-c", MAKE, ckpt, data], check=True,
                 env=env)
  subprocess.run([tracecut, "export", ckpt, "-o",
                  os.path.join(ckpt, "model.pt2")], check=True, env=env,
                 capture_output=True)
  print("| preset | tracecut s | tracecut peak RSS | llm-compressor s | "
        "llm-compressor peak RSS |")
  print("|---|---|---|---|---|")
  for preset in presets:
    calib = [data] if preset in STATIC_INPUT else []
    ours = timed([tracecut, "calibrate", ckpt, "--scheme=" + preset, "-o",
                  os.path.join(out, "tracecut-" + preset)] +
                 [f"--data={d}" for d in calib], env)
    peer = timed([sys.executable, "-c", PEER, ckpt, preset,
                  os.path.join(out, "llmcompressor-" + preset)] + calib, env)
    mib = lambda b: f"{b / 2**20:.0f} MiB"
    print(f"| {preset} | {ours[0]:.2f} | {mib(ours[1])} | {peer[0]:.2f} | "
          f"{mib(peer[1])} |", flush=True)


if __name__ == "__main__":
  main()
