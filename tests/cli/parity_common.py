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
