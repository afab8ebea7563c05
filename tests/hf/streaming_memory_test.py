"""Peak memory of streamed calibration does not grow with the weights
(GitHub issue 15).

Two Llama checkpoints of the same width, 4 and 16 decoder layers (seeded,
fp32, exported with `tracecut export --meta`), are calibrated with GPTQ W4
into compressed-tensors directories, each run in its own process, and the
peak resident set (wait4's ru_maxrss of that process) is compared:

* streamed: going from 4 to 16 layers adds less than 35 % of the 12
  layers' weights (what grows is the graph and one interpreter per
  subgraph, not the weights);
* whole model (--stream-weights=false), 16 layers: at least the 12 layers'
  weights more than streamed, which shows the measurement sees weights.

    streaming_memory_test.py TRACECUT
"""

import os
import subprocess
import sys
import tempfile

import torch
import transformers

RECIPE = """modifiers {
  gptq {
    scheme { bits: 4 symmetric: true group_size: 128 }
    targets: "Linear"
    ignore: "lm_head"
  }
}
pipeline: SEQUENTIAL
"""


# Runs argv[1:] as a child and prints that child's peak RSS in KiB. It runs
# in a fresh, small interpreter: Linux carries a process's peak RSS across
# exec (and a forked child starts out mapping its parent's pages), so a child
# forked from this test, which has torch and a model in memory, would report
# this test's own peak instead of tracecut's.
MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
  os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(cmd):
  """Runs `cmd`: (its peak RSS in bytes, its stderr)."""
  with open(cmd_log(cmd), "w") as log:
    result = subprocess.run([sys.executable, "-I", "-S", "-c", MEASURE] + cmd,
                            stdout=subprocess.PIPE, stderr=log, text=True)
  with open(cmd_log(cmd)) as f:
    err = f.read()
  if result.returncode != 0:
    raise AssertionError(
        f"{' '.join(cmd)}: exit {result.returncode}:\n{err[-3000:]}")
  return int(result.stdout.split()[-1]) * 1024, err


def cmd_log(cmd):
  return cmd[cmd.index("-o") + 1] + ".stderr"


def checkpoint(d, layers):
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=512, hidden_size=512, intermediate_size=1536,
      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
      max_position_embeddings=64)
  model = transformers.LlamaForCausalLM(config).eval()
  layer_bytes = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
  path = os.path.join(d, f"llama{layers}")
  model.save_pretrained(path)
  return path, layer_bytes


def main():
  tracecut = sys.argv[1]
  mib = 1 << 20
  with tempfile.TemporaryDirectory() as d:
    recipe = os.path.join(d, "w4.textproto")
    with open(recipe, "w") as f:
      f.write(RECIPE)
    flags = ["--recipe=" + recipe, "--synthetic=4", "--seq-len=16"]
    peaks = {}
    layer_bytes = 0
    for layers in (4, 16):
      ckpt, layer_bytes = checkpoint(d, layers)
      subprocess.run([tracecut, "export", ckpt, "--meta", "-o",
                      os.path.join(ckpt, "model.pt2")], check=True,
                     capture_output=True)
      peaks[layers], err = run_measured(
          [tracecut, "calibrate", ckpt, "-o", os.path.join(d, f"s{layers}")]
          + flags)
      assert "weights streamed" in err, err
    peaks["whole"], err = run_measured(
        [tracecut, "calibrate", ckpt, "-o", os.path.join(d, "whole"),
         "--stream-weights=false"] + flags)
    assert "weights streamed" not in err, err

    added = 12 * layer_bytes
    growth = peaks[16] - peaks[4]
    print(f"one decoder layer: {layer_bytes / mib:.1f} MiB of fp32 weights; "
          f"12 more layers: {added / mib:.1f} MiB")
    print(f"peak RSS streamed: 4 layers {peaks[4] / mib:.1f} MiB, 16 layers "
          f"{peaks[16] / mib:.1f} MiB (+{growth / mib:.1f} MiB, "
          f"{growth / added:.0%} of the added weights)")
    print(f"peak RSS whole model, 16 layers: {peaks['whole'] / mib:.1f} MiB")
    assert growth < 0.35 * added, (growth, added)
    assert peaks["whole"] - peaks[16] >= added, (peaks, added)


if __name__ == "__main__":
  main()
