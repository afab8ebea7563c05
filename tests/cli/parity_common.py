"""What the tests that run llm-compressor beside tracecut share: a seeded
transformers Llama with outlier channels, the word-level tokenizer
llm-compressor needs to take a dataset, and the comparisons."""

import os
import subprocess

import torch
import transformers

VOCAB = 256
HIDDEN = 128


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}:\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
  return p


def save_tokenizer(ckpt):
  """llm-compressor needs a processor even for tokenized data."""
  import tokenizers
  vocab = {f"t{i}": i for i in range(VOCAB)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2",
      pad_token="t0").save_pretrained(ckpt)


def export_checkpoint(tracecut, model, d, name, ids):
  """Saves `model` with the tokenizer under d/name, exports it there with
  `tracecut export` and saves the calibration `ids`; returns (checkpoint
  directory, data file)."""
  ckpt = os.path.join(d, name)
  model.save_pretrained(ckpt)
  save_tokenizer(ckpt)
  run([tracecut, "export", ckpt, "-o", os.path.join(ckpt, "model.pt2")])
  data = os.path.join(d, "ids.pt")
  torch.save(ids, data)
  return ckpt, data


def make_model(kv_heads):
  """2 layers, hidden 128, 4 heads; norms and three embedding channels
  scaled, so the activations have outlier channels to smooth."""
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
      num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=kv_heads, max_position_embeddings=64)
  model = transformers.LlamaForCausalLM(config).eval()
  g = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for layer in model.model.layers:
      for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.copy_(0.5 + torch.rand(HIDDEN, generator=g))
    model.model.embed_tokens.weight[:, [3, 40, 77]] *= 20
  return model


def relative(a, b):
  """max |a - b| / max |b|."""
  return ((a.double() - b.double()).abs().max() /
          b.double().abs().max()).item()


def smoothed_drift(model, smoothed, ids):
  """Relative error of the smoothed TorchScript model's logits against the
  original transformers model's on `ids`."""
  with torch.no_grad():
    want = model(input_ids=ids).logits
    got = smoothed(ids)
  got = got if isinstance(got, torch.Tensor) else got[0]
  return ((got - want).norm() / want.norm()).item()


def check_gemma2(tracecut, ids, modifier, label):
  """Gemma 2: its norms compute x * (1 + weight), and its MLP reads
  pre_feedforward_layernorm. `modifier` (a recipe modifier, run alone, with
  tracecut's defaults for Gemma 2) must smooth both norms of each layer as
  (1 + weight) norms, 1 + w' = (1 + w) / s, so that the smoothed model
  computes what the original does."""
  import json
  import tempfile
  torch.manual_seed(0)
  config = transformers.Gemma2Config(
      vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      head_dim=32, max_position_embeddings=64)
  model = transformers.Gemma2ForCausalLM(config).eval()
  g = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for layer in model.model.layers:
      for norm in (layer.input_layernorm, layer.pre_feedforward_layernorm):
        norm.weight.add_(torch.randn(norm.weight.shape, generator=g) * 0.5)
    model.model.embed_tokens.weight[:, [3, 40, 77]] *= 20
  with tempfile.TemporaryDirectory() as d:
    ckpt, data = export_checkpoint(tracecut, model, d, "gemma2", ids)
    recipe = os.path.join(d, "alone.textproto")
    with open(recipe, "w") as f:
      f.write(f"modifiers {{ {modifier} }}\n")
    out = os.path.join(d, "smoothed.pt")
    report = os.path.join(d, "report.json")
    run([tracecut, "calibrate", ckpt, "--recipe=" + recipe, "--data=" + data,
         "--format=torchscript", "--report=" + report, "-o", out])
    smoothed = torch.jit.load(out).eval()
    ours = dict(smoothed.state_dict())
    original = model.state_dict()
    for layer in range(2):
      for name in ("input_layernorm", "pre_feedforward_layernorm"):
        key = f"model.layers.{layer}.{name}.weight"
        assert not torch.equal(ours[key], original[key]), (label, key)
    with open(report) as f:
      notes = json.dumps(json.load(f)).count("(1 + weight) norm")
    assert notes == 4, f"{label} on Gemma 2: {notes} (1 + weight) norms"
    err = smoothed_drift(model, smoothed, ids[:2])
    assert err <= 1e-5, f"{label} on Gemma 2 changed the logits: {err:.3g}"
    print(f"{label} on Gemma 2: 4 (1 + weight) norms smoothed; logits "
          f"unchanged ({err:.3g})")
