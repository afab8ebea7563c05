"""Final-logit error of quantized checkpoints against the original (the GPU
check, issue 33), as bench/gptq_peer_bench.py measures it on the CPU.

    logit_error.py CKPT HELD.pt RESULT.json NAME=OUT_DIR... [--device=cuda]

Each model is loaded by transformers (bf16; compressed-tensors decompresses
the quantized ones) onto --device, one at a time, and run on the held-out
token ids one row at a time. The error of a model is the relative Frobenius
norm over all rows: ||logits - logits_original|| / ||logits_original||,
logits in fp32. A NAME whose OUT_DIR is missing or fails to load gets an
"error" entry instead; the others are still measured.
"""

import argparse
import json
import os
import sys
import time
import traceback


def load(path, device):
  import torch
  import transformers
  kwargs = {"dtype": torch.bfloat16}
  if device != "cpu":
    kwargs["device_map"] = device
  return transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()


def logits_rows(model, held, device):
  import torch
  with torch.no_grad():
    for row in held:
      yield model(input_ids=row[None].to(device)).logits[0].float()


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("ckpt")
  ap.add_argument("held")
  ap.add_argument("result")
  ap.add_argument("outputs", nargs="+", metavar="NAME=OUT_DIR")
  ap.add_argument("--device", default="cuda")
  a = ap.parse_args()

  import torch
  held = torch.load(a.held)
  result = {"held": list(held.shape), "device": a.device, "models": {}}
  t0 = time.perf_counter()
  model = load(a.ckpt, a.device)
  # The original's logits stay on the device: rows x cols x vocab fp32
  # (8 x 512 x 128256 x 4 B = 2.1 GB for the default shapes).
  want = list(logits_rows(model, held, a.device))
  want_norm2 = sum(float((w * w).sum()) for w in want)
  del model
  result["original_s"] = time.perf_counter() - t0
  for spec in a.outputs:
    name, path = spec.split("=", 1)
    entry = {"path": path}
    t0 = time.perf_counter()
    try:
      if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"no checkpoint at {path}")
      model = load(path, a.device)
      diff2 = 0.0
      finite = True
      for w, got in zip(want, logits_rows(model, held, a.device)):
        finite = finite and bool(torch.isfinite(got).all())
        diff2 += float(((got - w) ** 2).sum())
      del model
      entry["relative_error"] = (diff2 / want_norm2) ** 0.5
      entry["finite"] = finite
    except Exception as e:  # one output's failure must not hide the other's
      entry["error"] = f"{type(e).__name__}: {e}"
      traceback.print_exc()
    entry["seconds"] = time.perf_counter() - t0
    result["models"][name] = entry
    if a.device.startswith("cuda"):
      torch.cuda.empty_cache()
  with open(a.result, "w") as f:
    json.dump(result, f, indent=1)
  print("logit_error:", json.dumps(result))
  return 0 if all("error" not in e for e in result["models"].values()) else 1


if __name__ == "__main__":
  sys.exit(main())
