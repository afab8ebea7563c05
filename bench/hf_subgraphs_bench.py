"""From a transformers Llama checkpoint to sequential subgraphs: tracecut
against llm-compressor's own `trace_subgraphs`, side by side in one run.

    tools/python bench/hf_subgraphs_bench.py TRACECUT [--layers=8,32] [--repeats=3]

For each layer count, a LlamaForCausalLM (hidden 256, seeded random
weights) is saved as a checkpoint directory, then, median wall seconds of
--repeats runs each:

  ours: export+partition  `tracecut export DIR` then `tracecut partition DIR`
                          (two processes; the export is Python: transformers
                          + torch.export, including their import time)
  ours: --meta, uncached  the same with `tracecut export DIR --meta
                          --no-cache` (the graph only, weights left in the
                          safetensors: what calibrate streams from)
  ours: partition         `tracecut partition DIR` on the exported .pt2
                          (read the archive, rebuild, trace, partition)
  ours: native            `tracecut partition DIR` on the checkpoint as
                          transformers saved it, no .pt2: the Llama built
                          from config.json (tracer/native_model.h), no
                          export and no Python
  torch.export            torch.export.export as `tracecut export` calls it
                          (no_grad, dynamic batch and sequence), in this
                          process: what the export step spends in torch
  llm-compressor          llmcompressor.pipelines.sequential.helpers.
                          trace_subgraphs(model, {"input_ids"},
                          ["LlamaDecoderLayer"], its default tracing_ignore),
                          in this process (model already built and imported);
                          it traces only the skeleton around the decoder
                          layers (each layer one call), where tracecut's graph
                          has every operator inside them
  llm-compressor process  the same as a process of its own: Python start-up,
                          importing torch, transformers and llmcompressor,
                          from_pretrained(DIR), trace_subgraphs (issue 32's
                          "import + load + trace_subgraphs")

Prints a Markdown table; every cell checks its subgraph count (layers + 1).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers

TRACING_IGNORE = [
    "_update_causal_mask", "create_causal_mask", "_update_mamba_mask",
    "make_causal_mask", "get_causal_mask", "mask_interface", "mask_function",
    "_prepare_4d_causal_attention_mask", "_prepare_fsmt_decoder_inputs",
    "_prepare_4d_causal_attention_mask_with_cache_position",
    "_update_linear_attn_mask", "project_per_layer_inputs", "_apply_attn_res"
]


def timed(fn, repeats):
  times, result = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times), result


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
  return p


PEER_PROCESS = r"""
import sys, torch, transformers
from llmcompressor.pipelines.sequential.helpers import trace_subgraphs
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
ids = torch.randint(0, 1000, (2, 16))
ignore = sys.argv[2].split(",")
print(len(trace_subgraphs(model, {"input_ids": ids}, ["LlamaDecoderLayer"],
                          ignore)))
"""


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("tracecut")
  ap.add_argument("--layers", default="8,32")
  ap.add_argument("--repeats", type=int, default=3)
  a = ap.parse_args()
  from llmcompressor.pipelines.sequential.helpers import trace_subgraphs

  rows = []
  for layers in [int(n) for n in a.layers.split(",")]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512,
        num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as d:
      model.save_pretrained(d)
      pt2 = os.path.join(d, "model.pt2")
      native_dir = os.path.join(d, "native")
      os.makedirs(native_dir)
      for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(d, name), native_dir)

      def ours_all():
        run([a.tracecut, "export", d, "-o", pt2])
        return run([a.tracecut, "partition", d, "--json"]).stdout

      def ours_meta():
        run([a.tracecut, "export", d, "--meta", "--no-cache", "-o", pt2])
        return run([a.tracecut, "partition", d, "--json"]).stdout

      def llmc_process():
        return run([sys.executable, "-c", PEER_PROCESS, d,
                    ",".join(TRACING_IGNORE)]).stdout

      def ours_partition():
        return run([a.tracecut, "partition", d, "--json"]).stdout

      def ours_native():
        return run([a.tracecut, "partition", native_dir, "--json"]).stdout

      ids = torch.randint(0, 1000, (2, 16))

      auto = torch.export.Dim.AUTO

      def torch_export():
        # What `tracecut export` runs: no_grad, dynamic batch and sequence.
        with torch.no_grad():
          return torch.export.export(
              model, (), {"input_ids": ids, "use_cache": False},
              dynamic_shapes={"input_ids": {0: auto, 1: auto},
                              "use_cache": None},
              strict=False)

      def llmc():
        return trace_subgraphs(model, {"input_ids": ids},
                               ["LlamaDecoderLayer"], TRACING_IGNORE)

      t_all, out = timed(ours_all, a.repeats)
      n_ours = len(json.loads(out)["subgraphs"])
      t_meta, out = timed(ours_meta, a.repeats)
      n_meta = len(json.loads(out)["subgraphs"])
      t_process, out = timed(llmc_process, a.repeats)
      n_process = int(out.split()[-1])
      t_part, _ = timed(ours_partition, a.repeats)
      t_native, out = timed(ours_native, a.repeats)
      n_native = len(json.loads(out)["subgraphs"])
      t_export, _ = timed(torch_export, a.repeats)
      t_llmc, subgraphs = timed(llmc, a.repeats)
      n_llmc = len(subgraphs)
      for who, n in (("tracecut", n_ours), ("tracecut --meta", n_meta),
                     ("tracecut native", n_native),
                     ("llm-compressor", n_llmc),
                     ("llm-compressor process", n_process)):
        if n != layers + 1:
          raise SystemExit(f"{who}: {n} subgraphs for {layers} layers")
      rows.append((layers, t_all, t_meta, t_part, t_native, t_export, t_llmc,
                   t_process))

  print("| layers | ours: export + partition | ours: export --meta + "
        "partition | ours: partition (.pt2 in) | ours: native partition "
        "(checkpoint in) | torch.export alone "
        "| llm-compressor trace_subgraphs | partition / llm-compressor "
        "| llm-compressor process | ours --meta / llm-compressor process "
        "| ours native / llm-compressor process |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for (layers, t_all, t_meta, t_part, t_native, t_export, t_llmc,
       t_process) in rows:
    print(f"| {layers} | {t_all:.2f} s | {t_meta:.2f} s | {t_part:.2f} s "
          f"| {t_native:.2f} s | {t_export:.2f} s | {t_llmc:.2f} s "
          f"| {t_part / t_llmc:.2f} | {t_process:.2f} s "
          f"| {t_meta / t_process:.2f} | {t_native / t_process:.2f} |")


if __name__ == "__main__":
  sys.exit(main())
