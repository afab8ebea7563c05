"""The schemes people ship, end to end, against llm-compressor (issue 30).

A seeded bf16 transformers Llama (from a config) is saved with a small
word-level tokenizer and exported with `tracecut export`. For each preset
below, `tracecut calibrate CKPT --scheme=PRESET -o OUT` (round-to-nearest,
every Linear but lm_head) and llm-compressor's `oneshot` with
QuantizationModifier(targets="Linear", scheme=PRESET, ignore=["lm_head"])
on the same checkpoint write compressed-tensors checkpoints. Then:

* every tensor llm-compressor stores, tracecut stores too, bit for bit
  (weights, packed codes, scales, global scales; the fraction that differs
  is printed and must be 0);
* the quantization_config is llm-compressor's (less its "version"), and its
  format is what compressed-tensors' own infer_model_format gives for the
  model transformers loads from it;
* transformers loads both with from_pretrained (compressed-tensors
  decompresses), the logits are finite, and tracecut's relative logit error
  against the original model is within 10 % of llm-compressor's.

    schemes_test.py TRACECUT [PRESET...]
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

# Weight schemes (RTN) whose activations, if any, are dynamic.
PRESETS = ["W4A16", "W4A16_ASYM", "W8A16", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK",
           "NVFP4A16", "MXFP4A16", "MXFP4"]
# GPTQ on one preset per grid (int groups, fp8 channels, fp8 blocks, NVFP4,
# MX): each takes a minute of llm-compressor's time.
GPTQ_PRESETS = ["W4A16", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16"]


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}:\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
  return p


def save_tokenizer(ckpt, vocab_size):
  from tokenizers import Tokenizer
  from tokenizers.models import WordLevel
  vocab = {f"t{i}": i for i in range(vocab_size)}
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")))
  tok.save_pretrained(ckpt)


def llmcompressor_output(ckpt, preset, out):
  from llmcompressor import oneshot
  from llmcompressor.modifiers.quantization import QuantizationModifier
  model = transformers.AutoModelForCausalLM.from_pretrained(
      ckpt, dtype=torch.bfloat16)
  model = oneshot(model=model, recipe=QuantizationModifier(
      targets="Linear", scheme=preset, ignore=["lm_head"]))
  model.save_pretrained(out, save_compressed=True)


def llmcompressor_gptq(ckpt, preset, ids, out):
  from datasets import Dataset
  from llmcompressor import oneshot
  from llmcompressor.modifiers.quantization import GPTQModifier
  import llmcompressor.pipelines.cache as cache
  cache.IntermediatesCache.pin_memory = lambda self, *a, **k: None  # CPU
  model = transformers.AutoModelForCausalLM.from_pretrained(
      ckpt, dtype=torch.bfloat16)
  ds = Dataset.from_dict({"input_ids": ids.tolist(),
                          "attention_mask": torch.ones_like(ids).tolist()})
  model = oneshot(
      model=model, dataset=ds,
      recipe=GPTQModifier(targets="Linear", scheme=preset, ignore=["lm_head"]),
      max_seq_length=ids.shape[1], num_calibration_samples=ids.shape[0],
      shuffle_calibration_samples=False, pipeline="sequential")
  model.save_pretrained(out, save_compressed=True)


def logits(path, ids):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.bfloat16).eval()
  with torch.no_grad():
    out = model(input_ids=ids).logits.float()
  return model, out


def relative_error(got, want):
  return ((got - want).norm() / want.norm()).item()


def compare_tensors(ours_dir, theirs_dir, preset):
  ours = load_file(os.path.join(ours_dir, "model.safetensors"))
  theirs = load_file(os.path.join(theirs_dir, "model.safetensors"))
  assert sorted(ours) == sorted(theirs), (
      preset, sorted(set(ours) ^ set(theirs))[:10])
  total = differ = 0
  for key, want in theirs.items():
    got = ours[key]
    assert got.dtype == want.dtype and got.shape == want.shape, (
        preset, key, got.dtype, want.dtype, got.shape, want.shape)
    a = got.contiguous().view(torch.uint8)
    b = want.contiguous().view(torch.uint8)
    n = int((a.view(-1, got.element_size()) !=
             b.view(-1, want.element_size())).any(dim=1).sum())
    total += want.numel()
    differ += n
  print(f"{preset}: {differ} of {total} stored elements differ from "
        f"llm-compressor's ({100.0 * differ / max(total, 1):.4f} %)")
  assert differ == 0, preset


def compare_config(ours_dir, theirs_dir, model, preset):
  from compressed_tensors.compressors.format import infer_model_format
  with open(os.path.join(ours_dir, "config.json")) as f:
    ours = json.load(f)["quantization_config"]
  with open(os.path.join(theirs_dir, "config.json")) as f:
    theirs = json.load(f)["quantization_config"]
  theirs.pop("version", None)
  ours.pop("version", None)
  assert ours == theirs, (preset, json.dumps(ours, indent=1),
                          json.dumps(theirs, indent=1))
  inferred = infer_model_format(model)
  inferred = getattr(inferred, "value", inferred)
  assert ours["format"] == inferred, (preset, ours["format"], inferred)


def main():
  tracecut = sys.argv[1]
  presets = sys.argv[2:] or PRESETS
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=256, hidden_size=128, intermediate_size=256,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=64)
  model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
  ids = torch.randint(0, 256, (2, 12),
                      generator=torch.Generator().manual_seed(3))
  with tempfile.TemporaryDirectory() as d:
    ckpt = os.path.join(d, "llama")
    model.save_pretrained(ckpt)
    save_tokenizer(ckpt, config.vocab_size)
    run([tracecut, "export", ckpt, "-o", os.path.join(ckpt, "model.pt2")])
    _, want = logits(ckpt, ids)

    for preset in presets:
      ours = os.path.join(d, "tracecut-" + preset)
      theirs = os.path.join(d, "llmcompressor-" + preset)
      run([tracecut, "calibrate", ckpt, "--scheme=" + preset, "-o", ours,
           "--synthetic=4", "--seq-len=16"])
      llmcompressor_output(ckpt, preset, theirs)
      compare_tensors(ours, theirs, preset)
      loaded, got = logits(ours, ids)
      compare_config(ours, theirs, loaded, preset)
      _, peer = logits(theirs, ids)
      assert torch.isfinite(got).all(), preset
      err, peer_err = relative_error(got, want), relative_error(peer, want)
      print(f"{preset}: relative logit error tracecut {err:.4g}, "
            f"llm-compressor {peer_err:.4g}")
      assert err <= 1.1 * peer_err + 1e-6, (preset, err, peer_err)

    # GPTQ (a recipe naming the preset) on the same tokens: the logit error
    # within 10 % of llm-compressor's GPTQModifier, the same config.
    calib = torch.randint(0, 256, (8, 16),
                          generator=torch.Generator().manual_seed(5))
    data = os.path.join(d, "calib.pt")
    torch.save(calib, data)
    for preset in [p for p in GPTQ_PRESETS if p in presets]:
      recipe = os.path.join(d, f"gptq-{preset}.textproto")
      with open(recipe, "w") as f:
        f.write(f'modifiers {{ gptq {{ scheme {{ preset: "{preset}" }} '
                'targets: "Linear" ignore: "lm_head" } }\n')
      ours = os.path.join(d, "tracecut-gptq-" + preset)
      theirs = os.path.join(d, "llmcompressor-gptq-" + preset)
      run([tracecut, "calibrate", ckpt, "--recipe=" + recipe,
           "--data=" + data, "-o", ours])
      llmcompressor_gptq(ckpt, preset, calib, theirs)
      loaded, got = logits(ours, ids)
      compare_config(ours, theirs, loaded, preset)
      _, peer = logits(theirs, ids)
      assert torch.isfinite(got).all(), preset
      err, peer_err = relative_error(got, want), relative_error(peer, want)
      print(f"GPTQ {preset}: relative logit error tracecut {err:.4g}, "
            f"llm-compressor {peer_err:.4g}")
      assert err <= 1.1 * peer_err + 1e-6, ("GPTQ", preset, err, peer_err)


if __name__ == "__main__":
  main()
