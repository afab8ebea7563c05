"""compressed-tensors output, checked by its real consumers (GitHub issue 15).

A tiny transformers Llama (seeded, from a config) is saved as a checkpoint
directory with tokenizer files and exported with `tracecut export`. For
each scheme (int4 g128 symmetric, int4 g128 asymmetric, int8 per-channel,
with act order: int4 g128 with static groups, int8 per-channel), `tracecut calibrate CKPT -o OUT_DIR` writes a
compressed-tensors checkpoint and `--format=torchscript -o OUT.pt` the same
calibration as a fake-quantized TorchScript model. Then, with the pinned
transformers and compressed-tensors:

* `from_pretrained(OUT_DIR)` gives the same logits as OUT.pt (relative
  error <= 1e-5), compressed (the packed Linear modules) and decompressed;
* the decompressed weights equal OUT.pt's, bit for bit;
* the tokenizer files are copied through, and nothing else is left behind;
* a second run over the same OUT_DIR writes byte-identical files.

    compressed_tensors_test.py TRACECUT
"""

import filecmp
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

SCHEMES = {
    "w4g128_sym": "scheme { bits: 4 symmetric: true group_size: 128 }",
    "w4g128_asym": "scheme { bits: 4 symmetric: false group_size: 128 }",
    "w8_channel": "scheme { bits: 8 symmetric: true }",
    "w4g128_actorder": ("scheme { bits: 4 symmetric: true group_size: 128 }\n"
                        "    actorder: true static_groups: true"),
    "w8_channel_actorder": "scheme { bits: 8 symmetric: true } actorder: true",
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


def relative_error(got, want):
  return ((got - want).norm() / want.norm()).item()


def main():
  tracecut = sys.argv[1]
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=256, hidden_size=128, intermediate_size=256,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=64)
  model = transformers.LlamaForCausalLM(config).eval()
  ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
  with tempfile.TemporaryDirectory() as d:
    ckpt = os.path.join(d, "llama")
    model.save_pretrained(ckpt)
    extras = {"tokenizer_config.json": '{"model_max_length": 64}\n',
              "special_tokens_map.json": "{}\n"}
    for name, text in extras.items():
      with open(os.path.join(ckpt, name), "w") as f:
        f.write(text)
    # Other frameworks' copies of the weights stay out of the output.
    for name in ("tf_model.h5", "flax_model.msgpack", "model.gguf"):
      with open(os.path.join(ckpt, name), "wb") as f:
        f.write(b"\0" * 64)
    run([tracecut, "export", ckpt, "-o", os.path.join(ckpt, "model.pt2")])

    for name, scheme in SCHEMES.items():
      recipe_path = os.path.join(d, name + ".textproto")
      with open(recipe_path, "w") as f:
        f.write(recipe(scheme))
      out = os.path.join(d, name)
      pt = os.path.join(d, name + ".pt")
      flags = ["--recipe=" + recipe_path, "--synthetic=16", "--seq-len=16"]
      run([tracecut, "calibrate", ckpt, "-o", out] + flags)
      run([tracecut, "calibrate", ckpt, "--format=torchscript", "-o", pt]
          + flags)

      files = sorted(os.listdir(out))
      want_files = sorted([".tracecut-output", "config.json",
                           "model.safetensors", "generation_config.json",
                           "recipe.yaml"] + list(extras))
      assert files == want_files, (name, files)
      for extra in extras:
        assert filecmp.cmp(os.path.join(ckpt, extra), os.path.join(out, extra),
                           shallow=False), extra
      leftovers = [f for f in os.listdir(d) if ".tmp." in f or ".old." in f]
      assert not leftovers, leftovers
      with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
      qc = written["quantization_config"]
      assert qc["quant_method"] == "compressed-tensors", qc
      # The export turns the KV cache off; the output keeps the source's.
      with open(os.path.join(ckpt, "config.json")) as f:
        want_cache = json.load(f).get("use_cache", True)
      assert written.get("use_cache") == want_cache, written.get("use_cache")

      fake = torch.jit.load(pt).eval()
      with torch.no_grad():
        want = fake(ids)
      want = want if isinstance(want, torch.Tensor) else want[0]
      fake_state = {k: v for k, v in fake.state_dict().items()}

      for run_compressed in (True, False):
        qconfig = transformers.CompressedTensorsConfig(
            run_compressed=run_compressed)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            out, quantization_config=qconfig).eval()
        with torch.no_grad():
          got = loaded(input_ids=ids).logits
        err = relative_error(got, want)
        assert err <= 1e-5, (name, run_compressed, err)
        if not run_compressed:
          state = loaded.state_dict()
          checked = 0
          for key, tensor in fake_state.items():
            if not key.endswith("_proj.weight"):
              continue
            assert torch.equal(state[key], tensor), (name, key)
            checked += 1
          assert checked == 14, (name, checked)
        print(f"{name}: transformers + compressed-tensors "
              f"(run_compressed={run_compressed}) logits relative error "
              f"{err:.2g} against tracecut's fake-quantized model")
      print(f"{name}: decompressed weights of 14 Linear modules are "
            "bit-identical to tracecut's")

    # Act order with dynamic groups (a g_idx) has no compressed-tensors form:
    # one clear error, nothing written.
    dynamic = os.path.join(d, "dynamic.textproto")
    with open(dynamic, "w") as f:
      f.write(recipe("scheme { bits: 4 symmetric: true group_size: 128 }\n"
                     "    actorder: true"))
    out = os.path.join(d, "dynamic")
    p = subprocess.run([tracecut, "calibrate", ckpt, "-o", out,
                        "--recipe=" + dynamic, "--synthetic=16",
                        "--seq-len=16"], capture_output=True, text=True)
    assert p.returncode == 1 and "static_groups: true" in p.stderr, p.stderr
    assert not os.path.exists(out), os.listdir(d)
    print("act order with dynamic groups: refused, nothing written")

    # A second run over an earlier output replaces it with the same bytes.
    name = "w4g128_sym"
    out = os.path.join(d, name)
    first = {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)}
    run([tracecut, "calibrate", ckpt, "-o", out, "--synthetic=16",
         "--seq-len=16", "--recipe=" + os.path.join(d, name + ".textproto")])
    second = {f: open(os.path.join(out, f), "rb").read()
              for f in os.listdir(out)}
    assert first == second, "a second run wrote different bytes"
    print("a second run over the same output wrote byte-identical files")

    # A run stopped after its first subgraph and resumed finishes with the
    # same bytes too.
    resumed = os.path.join(d, "resumed")
    flags = ["--synthetic=16", "--seq-len=16",
             "--recipe=" + os.path.join(d, name + ".textproto")]
    run([tracecut, "calibrate", ckpt, "-o", resumed, "--stop-after=0"] + flags)
    assert not os.path.exists(resumed), "a stopped run wrote its output"
    run([tracecut, "calibrate", ckpt, "-o", resumed, "--resume"] + flags)
    third = {f: open(os.path.join(resumed, f), "rb").read()
             for f in os.listdir(resumed)}
    assert first == third, "a resumed run wrote different bytes"
    print("a run stopped after subgraph 0 and resumed wrote byte-identical "
          "files")


if __name__ == "__main__":
  main()
