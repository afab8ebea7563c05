"""Checkpoint directories calibrated without an export (tracer/native_model.h).

A transformers checkpoint directory holding no .pt2 whose architecture
tracecut builds from config.json (Llama, Mistral, Qwen2, Qwen3, Phi-3,
Granite, OLMo 2) is loaded without Python. For seeded bf16 checkpoints covering the options that
change the forward (grouped and plain KV heads, tied embeddings, attention
and MLP biases, Qwen3's q/k norms, linear and llama3 rope scaling, Mistral's
and Phi-3's sliding windows and Qwen3's mixed full/sliding layers, at a
calibration length past the window, Phi-3's fused projections and partial
rotary embeddings, Granite's multipliers, OLMo 2's norms), GPTQ W4A16 calibration of the directory must write
exactly the tensors, bit for bit, that the same calibration of its
`tracecut export --meta` program writes: the same activations reached every
Hessian. With --dtype=bfloat16 the program's logits are transformers'
bf16 forward's (relative difference <= 1e-3; bit-identical today), and
GPTQ computing in the checkpoint's bf16 (--dtype=auto, as llm-compressor
does) gives a final-logit error within 20 % of float32's, and the same
bytes as calibrating `tracecut export --meta --dtype=auto`'s bf16 program. `tracecut partition` of the directory gives one subgraph per
decoder layer plus the head. Directories it cannot build get one error
naming the cause: an architecture it does not build (with the export
command to run), a tensor the checkpoint lacks, a tensor of another shape
than config.json implies, a config.json linked to a file outside the
directory.

    native_model_test.py TRACECUT
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

_LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}

# Phi3Config's default token ids lie past a small vocabulary.
_PHI3_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)

# name: (config class, model class, config kwargs)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LM),
    "llama_tied_biases_llama3": (
        "LlamaConfig", "LlamaForCausalLM",
        dict(_LM, num_key_value_heads=4, tie_word_embeddings=True,
             attention_bias=True, mlp_bias=True, rope_parameters=_LLAMA3)),
    "llama_linear_rope": (
        "LlamaConfig", "LlamaForCausalLM",
        dict(_LM, rope_parameters={"rope_type": "linear",
                                   "rope_theta": 10000.0, "factor": 2.0})),
    "mistral_sliding": ("MistralConfig", "MistralForCausalLM",
                        dict(_LM, sliding_window=8)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LM),
    "qwen3_tied": ("Qwen3Config", "Qwen3ForCausalLM",
                   dict(_LM, head_dim=32, tie_word_embeddings=True)),
    "qwen3_mixed_layers": ("Qwen3Config", "Qwen3ForCausalLM",
                           dict(_LM, head_dim=32, use_sliding_window=True,
                                sliding_window=8, max_window_layers=1)),
    # Fused qkv_proj and gate_up_proj; Phi-4-mini's partial rotary.
    "phi3_sliding": ("Phi3Config", "Phi3ForCausalLM",
                     dict(_LM, sliding_window=8, **_PHI3_TOKENS)),
    "phi3_partial_tied": ("Phi3Config", "Phi3ForCausalLM",
                          dict(_LM, partial_rotary_factor=0.75,
                               tie_word_embeddings=True, **_PHI3_TOKENS)),
    # IBM Granite: Llama with multipliers on the embeddings, the residual
    # branches, the attention scores and the logits.
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(_LM, embedding_multiplier=12.0, residual_multiplier=0.22,
                     attention_multiplier=0.0625, logits_scaling=8.0,
                     attention_bias=True)),
    # OLMo 2: q/k norms over whole projections, norms after each branch.
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM",
              dict(_LM, attention_bias=True, pad_token_id=0, eos_token_id=2)),
}

RECIPE = ('modifiers { gptq { scheme { preset: "W4A16" } targets: "Linear" '
          'ignore: "lm_head" } }\n')


def run(args, expect_ok=True):
  p = subprocess.run(args, capture_output=True, text=True)
  if expect_ok and p.returncode != 0:
    sys.exit(f"FAIL: {' '.join(args)}\n{p.stderr}")
  return p


def save_checkpoint(path, config_cls, model_cls, kwargs):
  torch.manual_seed(0)
  config = getattr(transformers, config_cls)(**kwargs)
  model = getattr(transformers, model_cls)(config).to(torch.bfloat16)
  # Biases start at zero: make them count.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(".bias"):
        p.normal_(0, 0.05)
  model.save_pretrained(path)


def tensors(out_dir):
  result = {}
  for name in sorted(os.listdir(out_dir)):
    if name.endswith(".safetensors"):
      result.update(safetensors.torch.load_file(os.path.join(out_dir, name)))
  return result


def check_model(tracecut, work, name, spec, data, recipe):
  ckpt = os.path.join(work, name)
  save_checkpoint(ckpt, *spec)
  layers = spec[2]["num_hidden_layers"]
  # The directory as transformers wrote it: config.json and safetensors.
  p = run([tracecut, "partition", ckpt, "--json"])
  subgraphs = json.loads(p.stdout)["subgraphs"]
  if len(subgraphs) != layers + 1:
    sys.exit(f"FAIL {name}: {len(subgraphs)} subgraphs, want {layers + 1}")
  native = os.path.join(work, name + "-native")
  run([tracecut, "calibrate", ckpt, "--recipe=" + recipe, "--data=" + data,
       "--threads=1", "-o", native])
  exported = os.path.join(work, name + "-exported")
  shutil.copytree(ckpt, exported)
  run([tracecut, "export", exported, "--meta", "-o",
       os.path.join(exported, "model.pt2")])
  reference = os.path.join(work, name + "-reference")
  run([tracecut, "calibrate", exported, "--recipe=" + recipe,
       "--data=" + data, "--threads=1", "-o", reference])
  got, want = tensors(native), tensors(reference)
  if sorted(got) != sorted(want):
    sys.exit(f"FAIL {name}: tensors {sorted(set(got) ^ set(want))} in one "
             "output only")
  differ = [k for k in want if not torch.equal(got[k], want[k])]
  if differ:
    sys.exit(f"FAIL {name}: {len(differ)} of {len(want)} tensors differ "
             f"from the exported program's calibration, e.g. {differ[:3]}")
  config = json.load(open(os.path.join(native, "config.json")))
  if "quantization_config" not in config:
    sys.exit(f"FAIL {name}: no quantization_config in the output")
  print(f"{name}: {len(want)} tensors identical; {len(subgraphs)} subgraphs")
  check_bf16_forward(tracecut, work, name, ckpt)


def logits(path, ids, dtype):
  m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
  with torch.no_grad():
    return m(input_ids=ids).logits


def relative(got, want):
  return ((got.float() - want.float()).norm() / want.float().norm()).item()


def check_bf16_forward(tracecut, work, name, ckpt):
  """--dtype=bfloat16: the program computes as transformers does in bf16."""
  pt = os.path.join(work, name + "-bf16.pt")
  run([tracecut, "trace", ckpt, "--dtype=bfloat16", "--format=torchscript",
       "-o", pt])
  ids = torch.randint(0, 256, (2, 16),
                      generator=torch.Generator().manual_seed(1))
  with torch.no_grad():
    got = torch.jit.load(pt)(ids)
  want = logits(ckpt, ids, torch.bfloat16)
  if got.dtype != torch.bfloat16:
    sys.exit(f"FAIL {name}: --dtype=bfloat16 computed in {got.dtype}")
  # A cast transformers makes and the program misses (or the reverse) moves
  # the logits by ~1e-2, bfloat16's rounding.
  err = relative(got, want)
  if err > 1e-3:
    sys.exit(f"FAIL {name}: bf16 logits differ from transformers' bf16 "
             f"forward by {err:.2e} (relative; want <= 1e-3)")
  exact = "bit-identical to" if torch.equal(got, want) else f"{err:.1e} from"
  print(f"{name}: bf16 program {exact} transformers' bf16 forward")


def check_bf16_calibration(tracecut, work, data, recipe):
  """GPTQ computing in the checkpoint's bf16 (--dtype=auto), as
  llm-compressor does: loads in transformers, quantizes about as well."""
  ckpt = os.path.join(work, "llama")
  out = os.path.join(work, "llama-native-bf16")
  p = run([tracecut, "calibrate", ckpt, "--recipe=" + recipe, "--data=" + data,
           "--threads=1", "--dtype=auto", "-o", out])
  if "computing in bfloat16" not in p.stderr:
    sys.exit(f"FAIL: --dtype=auto did not say it computes in bfloat16:\n"
             f"{p.stderr}")
  f32, bf16 = tensors(os.path.join(work, "llama-native")), tensors(out)
  if sorted(f32) != sorted(bf16) or all(
      torch.equal(f32[k], bf16[k]) for k in f32):
    sys.exit("FAIL: the bf16 calibration wrote other tensor names, or the "
             "float32 calibration's bytes")
  ids = torch.randint(0, 256, (4, 24),
                      generator=torch.Generator().manual_seed(2))
  want = logits(ckpt, ids, torch.bfloat16)
  e32 = relative(logits(os.path.join(work, "llama-native"), ids,
                        torch.bfloat16), want)
  e16 = relative(logits(out, ids, torch.bfloat16), want)
  # Same algorithm, activations rounded to bf16: within 20 % of float32's.
  if not e16 <= 1.2 * e32:
    sys.exit(f"FAIL: bf16 calibration's final-logit error {e16:.4f}, "
             f"float32's {e32:.4f}")
  print(f"bf16 calibration: final-logit error {e16:.4f} (float32 {e32:.4f})")
  # The export route in bf16 (`tracecut export --dtype=auto`: transformers'
  # own bf16 program) calibrates to the same bytes.
  exported = os.path.join(work, "llama-exported-bf16")
  shutil.copytree(ckpt, exported)
  run([tracecut, "export", exported, "--meta", "--dtype=auto", "-o",
       os.path.join(exported, "model.pt2")])
  via_export = os.path.join(work, "llama-exported-bf16-out")
  run([tracecut, "calibrate", exported, "--recipe=" + recipe,
       "--data=" + data, "--threads=1", "-o", via_export])
  other = tensors(via_export)
  differ = [k for k in bf16 if not torch.equal(other[k], bf16[k])]
  if sorted(other) != sorted(bf16) or differ:
    sys.exit(f"FAIL: export --dtype=auto calibrates to other tensors than "
             f"the native bf16 model: {differ[:3]}")
  print(f"export --dtype=auto: {len(other)} tensors identical to native bf16")


def expect_error(tracecut, ckpt, *needles):
  p = run([tracecut, "partition", ckpt], expect_ok=False)
  lines = p.stderr.strip().splitlines()
  if p.returncode == 0 or len(lines) != 1:
    sys.exit(f"FAIL: partition {ckpt}: exit {p.returncode}, want one error "
             f"line:\n{p.stderr}")
  for n in needles:
    if n not in lines[0]:
      sys.exit(f"FAIL: partition {ckpt}: {n!r} not in {lines[0]!r}")
  print(f"refused: {lines[0]}")


def check_errors(tracecut, work):
  # An architecture tracecut does not build: the export it needs.
  gpt2 = os.path.join(work, "gpt2")
  torch.manual_seed(0)
  transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=256, n_embd=64, n_layer=1, n_head=2)).save_pretrained(gpt2)
  expect_error(tracecut, gpt2, "without a .pt2", "tracecut export",
               "GPT2LMHeadModel")
  base = os.path.join(work, "llama")
  # A tensor the checkpoint lacks.
  missing = os.path.join(work, "missing")
  shutil.copytree(base, missing)
  st = os.path.join(missing, "model.safetensors")
  t = safetensors.torch.load_file(st)
  del t["model.layers.1.mlp.up_proj.weight"]
  safetensors.torch.save_file(t, st, metadata={"format": "pt"})
  expect_error(tracecut, missing, "model.layers.1.mlp.up_proj.weight",
               "do not hold")
  # A config that does not match the tensors.
  wrong = os.path.join(work, "wrong")
  shutil.copytree(base, wrong)
  cfg = os.path.join(wrong, "config.json")
  c = json.load(open(cfg))
  c["intermediate_size"] = 192
  json.dump(c, open(cfg, "w"))
  expect_error(tracecut, wrong, "model.layers.0.mlp.gate_proj.weight",
               "[256, 128]", "[192, 128]")
  # config.json linked to a file outside the directory: not read.
  linked = os.path.join(work, "linked")
  shutil.copytree(base, linked)
  outside = os.path.join(work, "outside.json")
  shutil.move(os.path.join(linked, "config.json"), outside)
  os.symlink(outside, os.path.join(linked, "config.json"))
  expect_error(tracecut, linked, "config.json", "outside")
  # A dtype a model does not compute in.
  p = run([tracecut, "partition", base, "--dtype=int8"], expect_ok=False)
  if p.returncode == 0 or "dtype 'int8'" not in p.stderr:
    sys.exit(f"FAIL: --dtype=int8 not refused by name:\n{p.stderr}")


def main():
  tracecut = sys.argv[1]
  with tempfile.TemporaryDirectory() as work:
    os.environ["TRACECUT_CACHE_DIR"] = os.path.join(work, "cache")
    recipe = os.path.join(work, "gptq.textproto")
    with open(recipe, "w") as f:
      f.write(RECIPE)
    data = os.path.join(work, "tokens.pt")
    g = torch.Generator().manual_seed(0)
    # 24 tokens: past the 8-token sliding windows.
    torch.save(torch.randint(0, 256, (8, 24), generator=g), data)
    for name, spec in MODELS.items():
      check_model(tracecut, work, name, spec, data, recipe)
    check_bf16_calibration(tracecut, work, data, recipe)
    check_errors(tracecut, work)
  print("PASS")


if __name__ == "__main__":
  main()
