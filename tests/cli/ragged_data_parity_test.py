"""Calibration samples of different lengths, against llm-compressor.

A tokenizer without padding gives samples of different lengths, which is
what llm-compressor's users calibrate on (its default batch size is 1, so
every sample runs at its own length). The seeded Llama of parity_common (fp32)
is calibrated with GPTQ W4A16 on 12 such samples (8 to 48 tokens) by both
tools: llm-compressor's `oneshot` over a datasets.Dataset of the token
lists, and `tracecut calibrate` with the recipe.yaml llm-compressor writes
and the same samples as JSON lines, then as a torch.save'd dict (a
tokenizer's output: input_ids and an attention_mask of ones, as lists).
Both write compressed-tensors checkpoints; every tensor (packed codes,
scales) must agree to within 0.1 % of elements (the Hessians differ only in
floating-point summation order), and both outputs' logit errors against the
original model (transformers loads them) within 10 % of each other.

    ragged_data_parity_test.py TRACECUT
"""

import json
import os
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

from parity_common import VOCAB, make_model, run, save_tokenizer

SAMPLES = 12
MAX_LEN = 48


def ragged_ids():
  g = torch.Generator().manual_seed(5)
  lengths = torch.randint(8, MAX_LEN + 1, (SAMPLES,), generator=g).tolist()
  return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def tensors(directory):
  out = {}
  for f in sorted(os.listdir(directory)):
    if f.endswith(".safetensors"):
      out.update(load_file(os.path.join(directory, f)))
  return out


def logit_error(model, directory, held_out):
  quantized = transformers.AutoModelForCausalLM.from_pretrained(
      directory, dtype=torch.float32).eval()
  with torch.no_grad():
    want = model(input_ids=held_out).logits
    got = quantized(input_ids=held_out).logits
  return ((got - want).norm() / want.norm()).item()


def main():
  tracecut = sys.argv[1]
  torch.set_num_threads(2)
  model = make_model(kv_heads=2)
  samples = ragged_ids()
  assert len({len(s) for s in samples}) > 1, "the samples must differ"
  from datasets import Dataset
  from llmcompressor import oneshot
  from llmcompressor.modifiers.quantization import GPTQModifier
  from llmcompressor.recipe import Recipe
  with tempfile.TemporaryDirectory() as d:
    ckpt = os.path.join(d, "llama")
    model.save_pretrained(ckpt)
    save_tokenizer(ckpt)
    run([tracecut, "export", ckpt, "-o", os.path.join(ckpt, "model.pt2")])
    jsonl = os.path.join(d, "ragged.jsonl")
    with open(jsonl, "w") as f:
      f.writelines(json.dumps(s) + "\n" for s in samples)
    as_dict = os.path.join(d, "ragged.pt")
    torch.save({"input_ids": samples,
                "attention_mask": [[1] * len(s) for s in samples]}, as_dict)

    modifier = GPTQModifier(targets="Linear", scheme="W4A16",
                            ignore=["lm_head"])
    recipe = os.path.join(d, "recipe.yaml")
    Recipe.from_modifiers([modifier]).yaml(file_path=recipe)
    theirs_dir = os.path.join(d, "llmcompressor")
    ds = Dataset.from_dict({"input_ids": samples,
                           "attention_mask": [[1] * len(s) for s in samples]})
    peer = oneshot(model=ckpt, dataset=ds, recipe=recipe,
                   max_seq_length=MAX_LEN, num_calibration_samples=SAMPLES,
                   shuffle_calibration_samples=False, pipeline="sequential")
    peer.save_pretrained(theirs_dir, save_compressed=True)
    theirs = tensors(theirs_dir)

    held_out = torch.randint(0, VOCAB, (4, 32),
                             generator=torch.Generator().manual_seed(11))
    theirs_err = logit_error(model, theirs_dir, held_out)
    for data in (jsonl, as_dict):
      ours_dir = os.path.join(d, "tracecut-" + data.rsplit(".", 1)[1])
      p = run([tracecut, "calibrate", ckpt, "--recipe=" + recipe,
               "--data=" + data, "--batch-size=1", "-o", ours_dir])
      assert f"{SAMPLES} samples x " in p.stderr + p.stdout, p.stderr[-2000:]
      ours = tensors(ours_dir)
      assert sorted(ours) == sorted(theirs), (sorted(ours), sorted(theirs))
      total = differ = 0
      for name, t in theirs.items():
        o = ours[name]
        assert o.shape == t.shape and o.dtype == t.dtype, name
        total += t.numel()
        differ += (o != t).sum().item()
      share = differ / total
      ours_err = logit_error(model, ours_dir, held_out)
      print(f"{os.path.basename(data)}: {differ} of {total} stored elements "
            f"differ from llm-compressor's ({100 * share:.4f} %); logit "
            f"error {ours_err:.4f} vs llm-compressor's {theirs_err:.4f}")
      assert share <= 1e-3, f"{share:.4%} of the elements differ"
      assert ours_err <= 1.1 * theirs_err, (ours_err, theirs_err)
  print("ragged calibration samples: tracecut matches llm-compressor")


if __name__ == "__main__":
  main()
