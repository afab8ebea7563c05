"""Calibration that streams weights from a checkpoint (GitHub issue 15).

For Llama, Qwen3 (also with tied embeddings), Mistral, Mixtral and Qwen2-MoE configs (seeded transformers models saved as
checkpoint directories, exported with `tracecut export --meta`, so the .pt2
holds no weights), `tracecut calibrate CKPT -o OUT_DIR` reads each
subgraph's weights when it runs and writes them shard by shard. Checked by
the real consumers, per model and scheme:

* the shards hold exactly the tensors, bit for bit, that the same
  calibration writes with the whole model loaded (--stream-weights=false);
* transformers + compressed-tensors `from_pretrained(OUT_DIR)` give the
  logits of tracecut's own fake-quantized TorchScript model of the same
  calibration (relative error <= 1e-5);
* every tensor of the source checkpoint is in the output under its own
  name (a quantized weight as its compressed tensors), the unquantized
  ones bit for bit; MoE experts, which transformers fuses on load, are
  quantized as the per-expert Linears its checkpoints hold;
* a rerun, and a run stopped after subgraph 1 and resumed, write
  byte-identical files; nothing is left beside OUT_DIR.

For the MoE models also: the --meta export reads the fused experts from
their pieces, so calibrating it to TorchScript gives exactly the model
calibrated from an export holding transformers' own loaded weights.

    streaming_test.py TRACECUT
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import safetensors.torch
import torch
import transformers

_LM = dict(vocab_size=256, hidden_size=128, intermediate_size=256,
           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=64)

# name: (config class, model class, config kwargs, schemes)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LM,
              ["w4g128_sym", "w4g128_asym", "w8_channel", "w4g128_actorder"]),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_LM, head_dim=32),
              ["w4g128_sym", "w8_channel"]),
    "mistral": ("MistralConfig", "MistralForCausalLM", _LM, ["w4g128_sym"]),
    # Tied embeddings (Qwen3 0.6B, Gemma, Llama 3.2 1B): the checkpoint holds
    # embed_tokens.weight only, and lm_head reads it.
    "qwen3_tied": ("Qwen3Config", "Qwen3ForCausalLM",
                   dict(_LM, head_dim=32, tie_word_embeddings=True),
                   ["w4g128_sym"]),
    # MoE: transformers 5 saves the experts one by one (block_sparse_moe.
    # experts.E.w1/w2/w3) and fuses them into 3-D parameters when it loads;
    # the export's checkpoint_layout maps them both ways, and the experts are
    # quantized as those per-expert Linears.
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(_LM, num_local_experts=4, num_experts_per_tok=2),
                ["w4g128_sym", "w8_channel"]),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(_LM, moe_intermediate_size=128,
                       shared_expert_intermediate_size=256, num_experts=4,
                       num_experts_per_tok=2),
                  ["w4g128_sym"]),
}

SCHEMES = {
    "w4g128_sym": "scheme { bits: 4 symmetric: true group_size: 128 }",
    "w4g128_asym": "scheme { bits: 4 symmetric: false group_size: 128 }",
    "w8_channel": "scheme { bits: 8 symmetric: true }",
    "w4g128_actorder": ("scheme { bits: 4 symmetric: true group_size: 128 }\n"
                        "    actorder: true static_groups: true"),
}


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}:\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
  return p


def recipe(scheme):
  return f"""modifiers {{
  gptq {{
    {scheme}
    targets: "Linear"
    ignore: "lm_head"
  }}
}}
pipeline: SEQUENTIAL
"""


def tensors(directory):
  """Every tensor of a checkpoint directory, by name."""
  out = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".safetensors"):
      for key, value in safetensors.torch.load_file(
          os.path.join(directory, name)).items():
        assert key not in out, (directory, key)
        out[key] = value
  return out


def files(directory):
  return {f: open(os.path.join(directory, f), "rb").read()
          for f in sorted(os.listdir(directory))}


def check_model(tracecut, d, name, spec):
  config_class, model_class, kwargs, schemes = spec
  torch.manual_seed(0)
  config = getattr(transformers, config_class)(**kwargs)
  model = getattr(transformers, model_class)(config).eval()
  ckpt = os.path.join(d, name)
  model.save_pretrained(ckpt)
  with open(os.path.join(ckpt, "tokenizer_config.json"), "w") as f:
    f.write('{"model_max_length": 64}\n')
  run([tracecut, "export", ckpt, "--meta", "-o",
       os.path.join(ckpt, "model.pt2")])
  ids = torch.randint(0, 256, (2, 12),
                      generator=torch.Generator().manual_seed(3))

  for scheme in schemes:
    recipe_path = os.path.join(d, f"{name}-{scheme}.textproto")
    with open(recipe_path, "w") as f:
      f.write(recipe(SCHEMES[scheme]))
    flags = ["--recipe=" + recipe_path, "--synthetic=16", "--seq-len=16"]
    streamed = os.path.join(d, f"{name}-{scheme}-streamed")
    whole = os.path.join(d, f"{name}-{scheme}-whole")
    pt = os.path.join(d, f"{name}-{scheme}.pt")
    p = run([tracecut, "calibrate", ckpt, "-o", streamed] + flags)
    assert "weights streamed" in p.stderr, p.stderr
    p = run([tracecut, "calibrate", ckpt, "-o", whole,
             "--stream-weights=false"] + flags)
    assert "weights streamed" not in p.stderr, p.stderr
    run([tracecut, "calibrate", ckpt, "--format=torchscript", "-o", pt]
        + flags)

    # One shard per subgraph that finished tensors, and an index.
    names = sorted(os.listdir(streamed))
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) >= config.num_hidden_layers, names
    assert "model.safetensors.index.json" in names, names
    with open(os.path.join(streamed, "model.safetensors.index.json")) as f:
      weight_map = json.load(f)["weight_map"]
    got, want = tensors(streamed), tensors(whole)
    assert sorted(weight_map) == sorted(got), "index and shards disagree"
    assert sorted(got) == sorted(want), (
        sorted(set(got) ^ set(want)))
    for key in want:
      assert got[key].dtype == want[key].dtype, key
      assert torch.equal(got[key], want[key]), key
    for key, value in tensors(ckpt).items():
      module = key[:-len(".weight")] if key.endswith(".weight") else None
      if module is not None and module + ".weight_scale" in got:
        assert module + ".weight_packed" in got or key in got, key
      else:
        assert key in got and torch.equal(got[key], value), key
    with open(os.path.join(streamed, "config.json")) as f:
      qc = json.load(f)["quantization_config"]
    with open(os.path.join(whole, "config.json")) as f:
      assert qc == json.load(f)["quantization_config"]
    assert open(os.path.join(streamed, "tokenizer_config.json")).read() == (
        '{"model_max_length": 64}\n')

    fake = torch.jit.load(pt).eval()
    with torch.no_grad():
      reference = fake(ids)
    reference = reference if isinstance(reference, torch.Tensor) else reference[0]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        streamed,
        quantization_config=transformers.CompressedTensorsConfig(
            run_compressed=False)).eval()
    with torch.no_grad():
      logits = loaded(input_ids=ids).logits
    err = ((logits - reference).norm() / reference.norm()).item()
    assert err <= 1e-5, (name, scheme, err)
    print(f"{name} {scheme}: streamed output = whole-model output "
          f"({len(want)} tensors, {len(shards)} shards); transformers logits "
          f"vs tracecut's fake-quantized model: relative error {err:.2g}")

  # Rerun and resume give the same bytes.
  scheme = schemes[0]
  flags = ["--recipe=" + os.path.join(d, f"{name}-{scheme}.textproto"),
           "--synthetic=16", "--seq-len=16"]
  first = files(os.path.join(d, f"{name}-{scheme}-streamed"))
  again = os.path.join(d, f"{name}-again")
  run([tracecut, "calibrate", ckpt, "-o", again] + flags)
  assert files(again) == first, "a rerun wrote different bytes"
  resumed = os.path.join(d, f"{name}-resumed")
  run([tracecut, "calibrate", ckpt, "-o", resumed, "--stop-after=1"] + flags)
  assert not os.path.exists(resumed), "a stopped run wrote its output"
  parts = os.listdir(resumed + ".run/output")
  assert len(parts) == 2, parts  # Shards of the subgraphs done.
  run([tracecut, "calibrate", ckpt, "-o", resumed, "--resume"] + flags)
  assert files(resumed) == first, "a resumed run wrote different bytes"
  assert not os.path.exists(resumed + ".run"), os.listdir(d)
  leftovers = [f for f in os.listdir(d) if ".tmp." in f or ".old." in f]
  assert not leftovers, leftovers
  print(f"{name}: rerun and stop-after-1 + resume wrote byte-identical files")


def check_moe_pieces(tracecut, d, name):
  ckpt = os.path.join(d, name)
  full = os.path.join(d, f"{name}-full.pt2")
  run([tracecut, "export", ckpt, "-o", full])
  flags = ["--recipe=" + os.path.join(d, f"{name}-w4g128_sym.textproto"),
           "--synthetic=16", "--seq-len=16", "--format=torchscript"]
  from_pieces = os.path.join(d, f"{name}-pieces.pt")
  from_full = os.path.join(d, f"{name}-full.pt")
  run([tracecut, "calibrate", ckpt, "-o", from_pieces] + flags)
  run([tracecut, "calibrate", full, "-o", from_full] + flags)
  ids = torch.randint(0, 256, (2, 12),
                      generator=torch.Generator().manual_seed(3))
  with torch.no_grad():
    a = torch.jit.load(from_pieces).eval()(ids)
    b = torch.jit.load(from_full).eval()(ids)
  a = a if isinstance(a, torch.Tensor) else a[0]
  b = b if isinstance(b, torch.Tensor) else b[0]
  assert torch.equal(a, b), (name, (a - b).abs().max())
  print(f"{name}: experts read from the checkpoint's pieces calibrate to "
        "exactly the model of transformers' own loaded weights")

  # By default (calibrate_all_experts, as llm-compressor) every expert's
  # Linears see all the tokens of their block; with it off only the routed
  # ones, which gives other codes, and the output still loads exactly.
  out = os.path.join(d, f"{name}-routed")
  flags = flags[:3] + ["--calibrate-all-experts=false"]
  run([tracecut, "calibrate", ckpt, "-o", out] + flags)
  run([tracecut, "calibrate", ckpt, "-o", out + ".pt",
       "--format=torchscript"] + flags)
  all_tokens = tensors(os.path.join(d, f"{name}-w4g128_sym-streamed"))
  got = tensors(out)
  experts = [k for k in got if ".experts." in k and k.endswith("_packed")]
  assert experts and any(not torch.equal(got[k], all_tokens[k])
                         for k in experts), "all tokens changed no expert"
  with torch.no_grad():
    reference = torch.jit.load(out + ".pt").eval()(ids)
  reference = reference if isinstance(reference, torch.Tensor) else (
      reference[0])
  loaded = transformers.AutoModelForCausalLM.from_pretrained(
      out, quantization_config=transformers.CompressedTensorsConfig(
          run_compressed=False)).eval()
  with torch.no_grad():
    logits = loaded(input_ids=ids).logits
  err = ((logits - reference).norm() / reference.norm()).item()
  assert err <= 1e-5, (name, "routed", err)
  print(f"{name}: calibrating experts on the routed tokens only changes "
        f"their codes and loads with relative error {err:.2g}")


def main():
  tracecut = sys.argv[1]
  with tempfile.TemporaryDirectory() as d:
    for name, spec in MODELS.items():
      check_model(tracecut, d, name, spec)
      if name in ("mixtral", "qwen2_moe"):
        check_moe_pieces(tracecut, d, name)


if __name__ == "__main__":
  main()
