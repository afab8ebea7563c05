"""Data-parallel calibration streaming weights from a checkpoint (issue 17).

    check_streamed.py make CKPT_DIR
        saves a seeded 3-layer Llama (transformers) as a checkpoint directory;
        the caller exports its .pt2 with `tracecut export --meta`.
    check_streamed.py same A_DIR B_DIR
        the tensors of two compressed-tensors outputs are bit-identical.
    check_streamed.py compare ONE_DIR TWO_DIR ONE_REPORT TWO_REPORT
        compares the outputs of 1 process and 2 ranks (issue 17's
        criteria): the same names, dtypes and shapes; every tensor GPTQ does
        not compute (embeddings, norms, the LM head) bit-identical; scales
        within 1e-5 relative; the first layer's integer codes equal except
        rounding ties (<= 0.1 % of its packed bytes: its Hessians differ by
        fp32 summation order only); the fraction of differing codes per
        layer printed (later layers also see the inputs those codes give);
        the mean output error of the reports within 1 % relative.
"""

import json
import os
import sys

import safetensors.torch
import torch
import transformers


def make(ckpt):
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=256, hidden_size=128, intermediate_size=256,
      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=64)
  model = transformers.LlamaForCausalLM(config).eval()
  model.save_pretrained(ckpt)
  with open(os.path.join(ckpt, "tokenizer_config.json"), "w") as f:
    f.write('{"model_max_length": 64}\n')


def tensors(directory):
  out = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".safetensors"):
      for key, value in safetensors.torch.load_file(
          os.path.join(directory, name)).items():
        assert key not in out, (directory, key)
        out[key] = value
  return out


def same(a_dir, b_dir):
  """The tensors of two outputs are equal bit for bit (shards may differ)."""
  a, b = tensors(a_dir), tensors(b_dir)
  assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
  assert a, f"no tensors in {a_dir}"
  for key in a:
    assert a[key].dtype == b[key].dtype, key
    assert torch.equal(a[key], b[key]), f"{key} differs"
  print(f"{a_dir} and {b_dir}: all {len(a)} tensors bit-identical")


def layer_of(key):
  parts = key.split(".")
  return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


def compare(one_dir, two_dir, one_report, two_report):
  one, two = tensors(one_dir), tensors(two_dir)
  assert sorted(one) == sorted(two), sorted(set(one) ^ set(two))
  assert one, f"no tensors in {one_dir}"
  equal = 0
  worst_scale = 0.0
  per_layer = {}  # layer -> [differing packed bytes, packed bytes]
  for key in sorted(one):
    a, b = one[key], two[key]
    assert a.dtype == b.dtype and a.shape == b.shape, (key, a.dtype, b.dtype,
                                                       a.shape, b.shape)
    if key.endswith("weight_packed"):
      counts = per_layer.setdefault(layer_of(key), [0, 0])
      counts[0] += int((a.view(torch.uint8) != b.view(torch.uint8)).sum())
      counts[1] += a.numel() * a.element_size()
    if torch.equal(a, b):
      equal += 1
    elif key.endswith("weight_scale"):
      rel = float(((a.float() - b.float()).abs() /
                   a.float().abs().clamp_min(1e-30)).max())
      worst_scale = max(worst_scale, rel)
      assert rel <= 1e-5, (key, rel)
    elif not key.endswith("weight_packed"):
      raise AssertionError(f"{key} differs, but GPTQ does not compute it")
  for layer, (differ, total) in sorted(per_layer.items()):
    print(f"  layer {layer}: {differ} of {total} packed code bytes differ "
          f"({differ / total:.3%})")
  # The first layer sees the same inputs in both runs: its Hessians differ
  # by fp32 summation order only, so its codes differ at ties only. Later
  # layers see inputs computed with those codes (error propagation), and
  # GPTQ's error feedback spreads each flipped code along its row.
  first = per_layer[min(k for k in per_layer if k >= 0)]
  assert first[0] <= 1e-3 * first[1], first
  with open(one_report) as f:
    e1 = json.load(f)["summary"]["mean_output_error"]
  with open(two_report) as f:
    e2 = json.load(f)["summary"]["mean_output_error"]
  rel = abs(e2 - e1) / e1
  differ = sum(d for d, _ in per_layer.values())
  total = sum(t for _, t in per_layer.values())
  print(f"1 process vs 2 ranks, streamed: {equal} of {len(one)} tensors "
        f"bit-identical; {differ} of {total} packed code bytes differ "
        f"({differ / total:.3%}); worst scale relative difference "
        f"{worst_scale:.1e}; mean output error {e1:.5f} vs {e2:.5f} "
        f"({rel:.3%} relative, limit 1%)")
  assert rel <= 0.01, (e1, e2)


def main():
  if sys.argv[1] == "make":
    make(sys.argv[2])
  elif sys.argv[1] == "same":
    same(sys.argv[2], sys.argv[3])
  elif sys.argv[1] == "compare":
    compare(*sys.argv[2:6])
  else:
    raise SystemExit(f"unknown command {sys.argv[1]}")


if __name__ == "__main__":
  main()
