"""llm-compressor's side of the GPU check (issue 33): GPTQ W4A16 with
`oneshot` on the same checkpoint and calibration tokens as tracecut.

    llmc_run.py CKPT CALIB.pt OUT_DIR RESULT.json [--device=cuda]
        [--load=cuda|cpu]

The recipe is bench/gptq_peer_bench.py's: GPTQModifier(targets="Linear",
scheme="W4A16", ignore=["lm_head"]) (int4 weights, groups of 128,
symmetric), the sequential pipeline, every sample in order (no shuffle),
max_seq_length = the samples' length; the output is saved compressed
(compressed-tensors pack-quantized). The token ids are handed over as a
datasets.Dataset of input_ids/attention_mask, as in that script.

--load=cuda loads the whole model onto the GPU first (device_map); --load=cpu
loads it into host memory and lets the sequential pipeline move each layer
to the GPU while it runs (llm-compressor's sequential onloading). Either
way the calibration runs on the first GPU; the intermediate activations are
offloaded to host memory between layers (sequential_offload_device's
default). --device=cpu (a smoke test without a GPU) keeps everything on the
CPU.

RESULT.json: oneshot_s, save_s, load_s, and on CUDA the allocator's peaks
(torch.cuda.max_memory_allocated / max_memory_reserved, bytes).
"""

import argparse
import json
import sys
import time


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("ckpt")
  ap.add_argument("calib")
  ap.add_argument("out")
  ap.add_argument("result")
  ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
  ap.add_argument("--load", default="cuda", choices=["cuda", "cpu"])
  a = ap.parse_args()

  t0 = time.perf_counter()
  import torch
  import transformers
  from datasets import Dataset
  from llmcompressor import oneshot
  from llmcompressor.modifiers.quantization import GPTQModifier
  import llmcompressor
  result = {"llmcompressor": llmcompressor.__version__,
            "device": a.device, "load": a.load if a.device == "cuda" else "cpu",
            "import_s": time.perf_counter() - t0}
  if a.device == "cpu":
    # Pinned host memory needs a GPU.
    import llmcompressor.pipelines.cache as cache
    cache.IntermediatesCache.pin_memory = lambda self, *args, **kw: None
  elif not torch.cuda.is_available():
    sys.exit("llmc_run: --device=cuda but torch.cuda.is_available() is False")

  t0 = time.perf_counter()
  kwargs = {"dtype": torch.bfloat16}
  if a.device == "cuda" and a.load == "cuda":
    kwargs["device_map"] = "cuda"
  model = transformers.AutoModelForCausalLM.from_pretrained(a.ckpt, **kwargs)
  if a.device == "cuda":
    torch.cuda.synchronize()
  result["load_s"] = time.perf_counter() - t0

  ids = torch.load(a.calib)
  ds = Dataset.from_dict({"input_ids": ids.tolist(),
                          "attention_mask": torch.ones_like(ids).tolist()})
  recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
  t0 = time.perf_counter()
  model = oneshot(model=model, dataset=ds, recipe=recipe,
                  max_seq_length=ids.shape[1],
                  num_calibration_samples=ids.shape[0],
                  shuffle_calibration_samples=False, pipeline="sequential")
  if a.device == "cuda":
    torch.cuda.synchronize()
  result["oneshot_s"] = time.perf_counter() - t0
  t0 = time.perf_counter()
  model.save_pretrained(a.out, save_compressed=True)
  result["save_s"] = time.perf_counter() - t0
  if a.device == "cuda":
    result["device_peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    result["device_peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    result["device_name"] = torch.cuda.get_device_name()
  with open(a.result, "w") as f:
    json.dump(result, f, indent=1)
  print("llmc_run:", json.dumps(result))


if __name__ == "__main__":
  main()
