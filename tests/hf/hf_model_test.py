"""End to end on transformers' own modeling code (the pinned version).

    hf_model_test.py TRACECUT MODEL_NAME GPTQ_RECIPE

For MODEL_NAME (a row of MODELS): a small config with seeded random weights
is saved as a Hugging Face checkpoint, then

  1. `tracecut export DIR -o DIR/model.pt2` (torch.export of transformers'
     class);
  2. `tracecut partition DIR --check --json`: subgraphs = the model's
     decoder/encoder layers + 1, every target layer in exactly one
     subgraph, partitioned outputs equal to the whole graph's;
  3. `tracecut trace DIR --format=torchscript`: the imported graph lowered to
     TorchScript, run by Python torch on the export's example inputs, equals
     the transformers model's outputs (rtol 1e-4, atol 1e-5, fp32); the same
     for `tracecut export --meta` (no weight read at export; tracecut reads
     them from the checkpoint's safetensors by name);
  4. text models: `tracecut calibrate` with GPTQ W4 and with RTN W4 on the
     same synthetic data; on held-out tokens, GPTQ's final-output error
     against the fp32 model is below RTN's;
  5. the other models (images, audio, encoder-decoder): `tracecut calibrate
     --data` with the model's inputs saved by name or position (torch.save
     of a tensor, a tuple or a dict, or a .safetensors file), GPTQ W4 and
     RTN W4; the calibrated models load in Python and run on held-out
     inputs, and both errors are printed (GPTQ is not always below RTN on
     these tiny random models, so that is not asserted).
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

RTOL = 1e-4
ATOL = 1e-5

_LM = dict(vocab_size=128, hidden_size=32, intermediate_size=64,
           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=64)

# name: (config class, model class, config kwargs, target layers, text?)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LM, 2, True),
    "mistral": ("MistralConfig", "MistralForCausalLM", _LM, 2, True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LM, 2, True),
    # Hidden 64: at 32, GPTQ W4 and RTN W4 are within noise on Qwen3.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(_LM, hidden_size=64, intermediate_size=128, head_dim=16), 2,
              True),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_LM, head_dim=8), 2,
               True),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(_LM, pad_token_id=0), 2,
             True),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(_LM, num_local_experts=4, num_experts_per_tok=2), 2,
                True),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(_LM, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32,
                       shared_expert_intermediate_size=32), 2, True),
    # Their forward makes tensors on the parameters' device (Falcon's rotary
    # indices, GptOss's mask fill value): `export --meta` re-exports on
    # unallocated CPU parameters so these constants get values.
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_kv_heads=2,
                    new_decoder_architecture=True,
                    max_position_embeddings=64), 2, True),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(_LM, head_dim=8, num_local_experts=4,
                     num_experts_per_tok=2,
                     layer_types=["sliding_attention", "full_attention"]), 2,
                True),
    # Its gated delta rule loops over 64-token chunks of the sequence.
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                dict(_LM, hidden_size=64, intermediate_size=128, head_dim=16,
                     layer_types=["linear_attention", "full_attention"],
                     linear_key_head_dim=16, linear_value_head_dim=16,
                     linear_num_key_heads=2, linear_num_value_heads=4,
                     linear_conv_kernel_dim=4), 2, True),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(vocab_size=128, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=64), 2, True),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(vocab_size=128, hidden_size=32, ffn_dim=64,
                 num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64, word_embed_proj_dim=32), 2, True),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=128, n_embd=32, n_layer=2, n_head=4,
                  n_positions=64), 2, True),
    "bert": ("BertConfig", "BertModel",
             dict(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=64,
                  max_position_embeddings=64), 2, False),
    "t5": ("T5Config", "T5ForConditionalGeneration",
           dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                num_decoder_layers=2, num_heads=4, decoder_start_token_id=0),
           4, False),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration",
                dict(vocab_size=128, pad_token_id=0, bos_token_id=1,
                     eos_token_id=2, decoder_start_token_id=3,
                     suppress_tokens=None, begin_suppress_tokens=None,
                     d_model=32, encoder_layers=2,
                     decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64,
                     decoder_ffn_dim=64, num_mel_bins=16,
                     max_source_positions=32, max_target_positions=64), 4,
                False),
    "vit": ("ViTConfig", "ViTModel",
            dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, image_size=32, patch_size=8), 2,
            False),
    "clip": ("CLIPConfig", "CLIPModel",
             dict(text_config=dict(vocab_size=128, hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4,
                                   max_position_embeddings=64),
                  vision_config=dict(hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=2,
                                     num_attention_heads=4, image_size=32,
                                     patch_size=8)), 4, False),
}


# Models whose checkpoints store MoE experts fused (3-D parameters).
FUSED_EXPERTS = {"gpt_oss"}
# Models whose export at 16 tokens is valid for some lengths only, and
# what the refusal of 64 tokens names.
LENGTH_BOUND = {"qwen3_5": "valid for sequence lengths 1-63 only"}


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
  return p


def make_inputs(specs, seed, batch=None):
  g = torch.Generator().manual_seed(seed)
  out = {}
  for s in specs:
    dtype = getattr(torch, s["dtype"])
    shape = list(s["shape"])
    if batch is not None:
      shape[0] = batch
    if s["kind"] == "tokens":
      out[s["name"]] = torch.randint(0, s["high"], shape, generator=g,
                                     dtype=dtype)
    else:
      out[s["name"]] = torch.randn(shape, generator=g, dtype=dtype)
  return out


# How step 5 saves each model's calibration data (every format once).
DATA_FORMAT = {"vit": "tensor", "whisper": "dict", "t5": "safetensors",
               "clip": "tuple", "bert": "dict"}


def save_data(inputs, names, fmt, path):
  """Writes `inputs` (by name) the way users would; returns the path."""
  if fmt == "safetensors":
    from safetensors.torch import save_file
    path += ".safetensors"
    save_file({n: inputs[n].contiguous() for n in names}, path)
    return path
  path += ".pt"
  if fmt == "tensor":
    assert len(names) == 1, names
    torch.save(inputs[names[0]], path)
  elif fmt == "tuple":
    torch.save(tuple(inputs[n] for n in names), path)
  else:
    torch.save({n: inputs[n] for n in names}, path)
  return path


def calibrate_and_compare(tracecut, d, ckpt, gptq, rtn, spec, model, extra,
                          name):
  """GPTQ W4 and RTN W4 with `extra` data flags; relative output errors on
  held-out inputs against the fp32 model, by recipe."""
  errors = {}
  held_out = make_inputs(spec["inputs"], seed=99)
  ref = flat_outputs(model, held_out, spec["outputs"])[0]
  for recipe_name, recipe in (("gptq", gptq), ("rtn", rtn)):
    recipe_path = os.path.join(d, f"{recipe_name}.textproto")
    with open(recipe_path, "w") as f:
      f.write(recipe)
    out = os.path.join(d, f"{recipe_name}.pt")
    report = os.path.join(d, f"{recipe_name}.json")
    run([tracecut, "calibrate", ckpt, f"--recipe={recipe_path}", "-o", out,
         f"--report={report}"] + extra)
    q = torch.jit.load(out)
    with torch.no_grad():
      y = q(*[held_out[s["name"]] for s in spec["inputs"]])
    y = y if isinstance(y, torch.Tensor) else y[0]
    if not bool(torch.isfinite(y).all()):
      raise AssertionError(f"{name}: {recipe_name} output is not finite")
    errors[recipe_name] = ((y - ref).norm() / ref.norm()).item()
    with open(report) as f:
      full = json.load(f)
      data = full["data"]
    # Experts the checkpoint stores fused (3-D) stay unquantized, and the
    # run says so; experts stored one Linear per expert are quantized.
    fused = [w for w in full.get("warnings", [])
             if "fused 3-D parameters" in w]
    if bool(fused) != (name in FUSED_EXPERTS):
      raise AssertionError(f"{name}: {recipe_name} warnings {full.get('warnings')}")
  print(f"{name}: W4 relative output error GPTQ {errors['gptq']:.4f}, "
        f"RTN {errors['rtn']:.4f}")
  return errors, data


def flat_outputs(model, inputs, names):
  with torch.no_grad():
    kwargs = dict(inputs)
    if "use_cache" in model.forward.__code__.co_varnames:
      kwargs["use_cache"] = False
    out = model(**kwargs)
  if isinstance(out, torch.Tensor):
    return [out]
  # torch.export's flat order (transformers registers ModelOutput with
  # pytree), nested outputs included.
  from torch.utils import _pytree
  flat = [t for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
  if len(flat) != len(names):
    raise AssertionError(f"transformers returns {len(flat)} tensors, the "
                         f"export recorded {len(names)}: {names}")
  return flat


def check_close(name, got, want):
  if got.shape != want.shape:
    raise AssertionError(f"{name}: shape {tuple(got.shape)} != "
                         f"{tuple(want.shape)}")
  err = (got - want).abs()
  bound = ATOL + RTOL * want.abs()
  if not bool((err <= bound).all()):
    raise AssertionError(f"{name}: max abs error {err.max().item():.3g} "
                         f"exceeds atol {ATOL} + rtol {RTOL}·|want|")
  return err.max().item()


def main():
  tracecut, name, recipe_file = sys.argv[1], sys.argv[2], sys.argv[3]
  with open(recipe_file) as f:
    gptq = f.read()
  rtn = gptq.replace("gptq {", "rtn {")
  config_cls, model_cls, kwargs, layers, text = MODELS[name]
  torch.manual_seed(0)
  config = getattr(transformers, config_cls)(**kwargs)
  model = getattr(transformers, model_cls)(config).eval()
  with tempfile.TemporaryDirectory() as d:
    ckpt = os.path.join(d, name)
    model.save_pretrained(ckpt)

    # 1. export.
    run([tracecut, "export", ckpt, "-o", os.path.join(ckpt, "model.pt2")])

    # 2. partition --check at the default targets.
    p = run([tracecut, "partition", ckpt, "--check", "--json"])
    summary = json.loads(p.stdout)
    subgraphs = summary["subgraphs"]
    if len(subgraphs) != layers + 1:
      raise AssertionError(f"{len(subgraphs)} subgraphs, want {layers} + 1:"
                           f"\n{p.stdout}")
    seen = []
    for sg in subgraphs:
      seen += sg["module_paths"]
    if len(seen) != len(set(seen)) or len(seen) != layers:
      raise AssertionError(f"target layers {seen}: want {layers} distinct")
    if not summary["check"]["passed"]:
      raise AssertionError(f"partition --check failed:\n{p.stdout}")

    # 3. the imported graph, lowered, against transformers.
    traced = os.path.join(d, "traced.pt")
    run([tracecut, "trace", ckpt, "--format=torchscript", "-o", traced])
    files = {"tracecut_inputs.json": ""}
    m = torch.jit.load(traced, _extra_files=files)
    spec = json.loads(files["tracecut_inputs.json"])
    inputs = make_inputs(spec["inputs"], seed=7)
    want = flat_outputs(model, inputs, spec["outputs"])
    with torch.no_grad():
      got = m(*[inputs[s["name"]] for s in spec["inputs"]])
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    if len(got) != len(want):
      raise AssertionError(f"{len(got)} outputs, want {len(want)} "
                           f"({spec['outputs']})")
    errs = [check_close(f"output {n}", g, w)
            for n, g, w in zip(spec["outputs"], got, want)]
    print(f"{name}: {len(subgraphs)} subgraphs; outputs match transformers "
          f"(max abs error {max(errs):.3g})")

    # 3b. a meta-device export (no weight read) with the weights read from
    # the checkpoint's safetensors gives the same outputs. Checkpoints that
    # store tensors under other names than the model's (transformers
    # converts them at load) must be refused with one clear error.
    meta = os.path.join(ckpt, "meta.pt2")
    p = subprocess.run([tracecut, "export", ckpt, "--meta", "-o", meta],
                       capture_output=True, text=True)
    if p.returncode != 0:
      if "under other names" not in p.stderr or os.path.exists(meta):
        raise AssertionError(f"export --meta failed unexpectedly:\n"
                             f"{p.stderr[-3000:]}")
      print(f"{name}: --meta refused (checkpoint names differ from the "
            "model's), as it should be")
    else:
      meta_traced = os.path.join(d, "meta.pt")
      run([tracecut, "trace", meta, "--format=torchscript", "-o",
           meta_traced])
      with torch.no_grad():
        got = torch.jit.load(meta_traced)(
            *[inputs[s["name"]] for s in spec["inputs"]])
      got = [got] if isinstance(got, torch.Tensor) else list(got)
      for n, g, w in zip(spec["outputs"], got, want):
        check_close(f"--meta output {n}", g, w)
      os.remove(meta)
      print(f"{name}: --meta export with safetensors weights matches too")

    # 4. GPTQ W4 vs RTN W4 (text models).
    if text:
      errors, _ = calibrate_and_compare(
          tracecut, d, ckpt, gptq, rtn, spec, model,
          ["--synthetic=128", "--seq-len=16"], name)
      if not errors["gptq"] < errors["rtn"]:
        raise AssertionError(f"GPTQ error {errors['gptq']} is not below "
                             f"RTN's {errors['rtn']}")
      # A program unrolled for its example's length refuses other lengths
      # (tracecut_inputs.json's seq_lens), rather than computing wrong
      # activations; every other model takes them.
      p = subprocess.run(
          [tracecut, "calibrate", ckpt, "--recipe=" + os.path.join(
              d, "gptq.textproto"), "-o", os.path.join(d, "long.pt"),
           "--synthetic=2", "--seq-len=64"], capture_output=True, text=True)
      if name in LENGTH_BOUND:
        if p.returncode == 0 or LENGTH_BOUND[name] not in p.stderr:
          raise AssertionError(f"{name}: 64 tokens not refused:\n{p.stderr}")
        print(f"{name}: 64-token calibration refused ({LENGTH_BOUND[name]})")
      elif p.returncode != 0:
        raise AssertionError(f"{name}: 64 tokens failed:\n{p.stderr}")

    # 5. Calibration data for any modality: the inputs saved to a file.
    fmt = DATA_FORMAT.get(name)
    if fmt is not None:
      names = [s["name"] for s in spec["inputs"]]
      calib = make_inputs(spec["inputs"], seed=11, batch=16)
      data_file = save_data(calib, names, fmt, os.path.join(d, "calib"))
      errors, data = calibrate_and_compare(
          tracecut, d, ckpt, gptq, rtn, spec, model,
          [f"--data={data_file}", "--batch-size=4"], name)
      if data["samples"] != 16 or data["batches"] != 4:
        raise AssertionError(f"report data section: {data}")
      described = [i.split(":")[0] for i in data["inputs"]]
      if described != names:
        raise AssertionError(f"report inputs {data['inputs']}, want {names}")
      # A loose bound: W4 of these tiny random models is coarse (CLIP's
      # logits are scaled by exp(logit_scale) = 14), but a broken
      # calibration (wrong inputs, garbage weights) is far off.
      for recipe_name, e in errors.items():
        if not e < 1.0:
          raise AssertionError(f"{name}: {recipe_name} W4 error {e} >= 1")
      print(f"{name}: calibrated from {fmt} data ({', '.join(data['inputs'])})")

if __name__ == "__main__":
  main()
