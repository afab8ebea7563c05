"""What the tests that run llm-compressor beside tracecut share: a seeded
transformers Llama with outlier channels, the word-level tokenizer
llm-compressor needs to take a dataset, and the comparisons."""

import contextlib
import json
import os
import re
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
  return add_outliers(transformers.LlamaForCausalLM(config).eval())


def add_outliers(model, per_layer=None):
  """Scales each decoder layer's two norms (seeded) and three embedding
  channels, so the activations have outlier channels to smooth; then
  `per_layer(layer, generator)` on each layer, from the same generator."""
  g = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for layer in model.model.layers:
      for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.copy_(0.5 + torch.rand(HIDDEN, generator=g))
      if per_layer is not None:
        per_layer(layer, g)
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


@contextlib.contextmanager
def causal_eager_attention(*modeling_modules):
  """llm-compressor 0.14 runs some models' attention with the eager kernel
  and no attention mask (Qwen3-MoE's and Phi-3's masks are None under sdpa,
  which is causal by itself; eager with no mask is not), so its activations
  and AWQ losses come from a non-causal model (Qwen3-MoE's first attention
  output has norm 1.40 where the model's is 1.79). Inside this, the eager
  kernel of each transformers modeling module given is causal when no mask
  is given, as sdpa is."""
  originals = [m.eager_attention_forward for m in modeling_modules]

  def causal(original):
    def forward(module, query, key, value, attention_mask, **kwargs):
      if attention_mask is None and query.shape[2] > 1:
        n, m = query.shape[2], key.shape[2]
        attention_mask = torch.full(
            (n, m), float("-inf"), dtype=query.dtype).triu(1 + m - n)[None,
                                                                       None]
      return original(module, query, key, value, attention_mask, **kwargs)
    return forward

  for m, original in zip(modeling_modules, originals):
    m.eager_attention_forward = causal(original)
  try:
    yield
  finally:
    for m, original in zip(modeling_modules, originals):
      m.eager_attention_forward = original


def awq_grid(n_grid=20):
  """llm-compressor's grid for duo_scaling=True (AwqGrid in tracecut)."""
  return [(0.0, False)] + [(i / (n_grid - 2), True) for i in range(n_grid - 1)]


@contextlib.contextmanager
def recorded_awq_searches(searches):
  """Fills `searches` with {smooth name: (ratio, initial loss, best loss)}
  of every grid search llm-compressor's AWQModifier runs inside this."""
  from llmcompressor.modifiers.transform import AWQModifier
  original_search = AWQModifier._compute_best_scale
  original_loss = AWQModifier._compute_loss
  current = []

  def search(self, mapping, *args, **kwargs):
    current.clear()
    scales = original_search(self, mapping, *args, **kwargs)
    losses = list(current)
    best = min(range(len(losses)), key=lambda i: (losses[i], i))
    searches[mapping.smooth_name] = (awq_grid()[best][0], losses[0],
                                     losses[best])
    return scales

  def loss(self, *args, **kwargs):
    value = original_loss(self, *args, **kwargs)
    current.append(value)
    return value

  AWQModifier._compute_best_scale = search
  AWQModifier._compute_loss = loss
  try:
    yield
  finally:
    AWQModifier._compute_best_scale = original_search
    AWQModifier._compute_loss = original_loss


_NOTE = re.compile(r"^awq: scales for (.*) from ratio ([0-9.e+-]+)"
                   r"( \(duo scaling\))?; .* error ([0-9.e+-]+) -> "
                   r"([0-9.e+-]+)")


def tracecut_awq_searches(report):
  """{smooth path: (ratio, initial loss, best loss)} from the notes of a
  tracecut JSON report."""
  out = {}
  with open(report) as f:
    modules = json.load(f)["modules"]
  for m in modules:
    for note in m.get("notes", []):
      match = _NOTE.match(note)
      if match:
        out[m["path"]] = (float(match.group(2)), float(match.group(4)),
                          float(match.group(5)))
  return out


def compare_awq_searches(ours, theirs, name):
  """Prints both tools' searches; returns (share of mappings whose grid
  ratio agrees, largest relative difference of the best losses)."""
  assert sorted(ours) == sorted(theirs), (
      f"{name}: mappings differ:\n tracecut {sorted(ours)}\n llm-compressor "
      f"{sorted(theirs)}")
  same = 0
  worst = 0.0
  for k, (ratio, initial, best) in sorted(ours.items()):
    t_ratio, t_initial, t_best = theirs[k]
    print(f"{name} {k}: ratio {ratio:.4f} vs {t_ratio:.4f}; loss "
          f"{initial:.4g} -> {best:.4g} vs {t_initial:.4g} -> {t_best:.4g}")
    # The report prints 4 digits; grid points are 1/18 apart.
    same += abs(ratio - t_ratio) < 1e-3
    worst = max(worst, abs(best - t_best) / t_best)
  share = same / len(ours)
  print(f"{name}: {same} of {len(ours)} mappings pick llm-compressor's grid "
        f"ratio ({share:.0%}; bound 90 %); best losses within {worst:.3%}")
  return share, worst


def llmcompressor_awq(ckpt, ids, out, scheme, ignore, searches, patch=(),
                      **oneshot_args):
  """Runs llm-compressor 0.14's oneshot with [AWQModifier(),
  QuantizationModifier(scheme, targets Linear, ignore)] on CPU (its
  IntermediatesCache.pin_memory a no-op, as PEERS.md says), sequential, no
  shuffling, and saves it compressed to `out`. Fills `searches`
  (recorded_awq_searches); `patch`: modeling modules whose eager attention
  is made causal without a mask (causal_eager_attention). Returns the
  weights of each layer as its AWQ smoothing left them."""
  from datasets import Dataset
  from llmcompressor import oneshot
  from llmcompressor.modifiers.quantization import QuantizationModifier
  from llmcompressor.modifiers.transform import AWQModifier
  import llmcompressor.pipelines.cache as cache

  cache.IntermediatesCache.pin_memory = lambda self, *a, **k: None  # CPU
  smoothed = {}
  original_apply = AWQModifier._apply_smoothing

  def apply_and_record(self, model):
    layers = {name.split(".")[2] for name in self._smooth_activation_stats}
    original_apply(self, model)
    for key, value in model.state_dict().items():
      parts = key.split(".")
      if key.startswith("model.layers.") and parts[2] in layers:
        smoothed[key] = value.detach().clone()

  AWQModifier._apply_smoothing = apply_and_record
  try:
    with causal_eager_attention(*patch), recorded_awq_searches(searches):
      ds = Dataset.from_dict({"input_ids": ids.tolist(),
                             "attention_mask": torch.ones_like(ids).tolist()})
      model = oneshot(
          model=ckpt, dataset=ds,
          recipe=[AWQModifier(),
                  QuantizationModifier(scheme=scheme, targets=["Linear"],
                                       ignore=ignore)],
          max_seq_length=ids.shape[1], num_calibration_samples=ids.shape[0],
          shuffle_calibration_samples=False, pipeline="sequential",
          **oneshot_args)
      model.save_pretrained(out, save_compressed=True)
  finally:
    AWQModifier._apply_smoothing = original_apply
  return smoothed


def logit_error(path, want, ids):
  """Relative error of the logits of the checkpoint at `path`, loaded by
  transformers, against `want` on `ids`."""
  m = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval()
  with torch.no_grad():
    got = m(input_ids=ids).logits
  return ((got - want).norm() / want.norm()).item()
