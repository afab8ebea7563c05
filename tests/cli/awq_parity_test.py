"""AWQ against llm-compressor's AWQModifier (issue 31, item 1).

A seeded transformers Llama (2 layers, hidden 128, intermediate 256, 4 heads
and 4 key/value heads so that all four of llm-compressor's default mappings
apply; its norms and a few embedding channels scaled, so activations have
outlier channels) is saved with a word-level tokenizer and exported. The
same 8 samples of 16 token ids calibrate it, in this one test run:

* llm-compressor 0.14 `oneshot` with [AWQModifier(), QuantizationModifier(
  scheme="W4A16_ASYM", targets=["Linear"], ignore=["lm_head"])] (CPU, its
  IntermediatesCache.pin_memory made a no-op as PEERS.md says, sequential
  pipeline, no shuffling), saved compressed; the weights right after each
  layer's smoothing are recorded (a wrapper around AWQModifier.
  _apply_smoothing);
* `tracecut calibrate` with AWQ alone, searching for the same scheme
  (`awq { scheme {...} }`), to a TorchScript .pt: the smoothed weights;
* `tracecut calibrate --recipe=recipe.yaml` (the YAML llm-compressor writes
  for the recipe above) into a compressed-tensors checkpoint.

Checked: every mapping picks llm-compressor's grid ratio (>= 90 % must)
with its best loss within 1 % (parity_common.compare_awq_searches, from
tracecut's report notes and llm-compressor's recorded losses); every
smoothed weight (norms, q/k/v/o, gate/up/down of each layer) equals
llm-compressor's within 1e-5 relative (max |a - b| / max |b|), and at least
one weight of each mapping moved; the smoothed model's logits equal the
original's within 1e-5; a 2-rank data-parallel run gives the same weights
within 1e-5; and transformers' final-logit error of tracecut's
compressed-tensors output is within 5 % of llm-compressor's own output's
error (both loaded by transformers, decompressed by compressed-tensors;
0.0841 both, measured 2026-11-27).

    awq_parity_test.py TRACECUT
"""

import os
import sys
import tempfile

import torch
import transformers

from parity_common import (check_gemma2, compare_awq_searches,
                           export_checkpoint, llmcompressor_awq, logit_error,
                           make_model, relative, run, smoothed_drift,
                           tracecut_awq_searches, VOCAB)

SMOOTHED = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
            "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def main():
  tracecut = sys.argv[1]
  torch.set_num_threads(2)
  model = make_model(kv_heads=4)
  original = {k: v.detach().clone() for k, v in model.state_dict().items()}
  ids = torch.randint(0, VOCAB, (8, 16),
                      generator=torch.Generator().manual_seed(3))
  held_out = torch.randint(0, VOCAB, (4, 16),
                           generator=torch.Generator().manual_seed(4))
  with tempfile.TemporaryDirectory() as d:
    ckpt, data = export_checkpoint(tracecut, model, d, "llama", ids)

    # tracecut, AWQ alone: the smoothed weights.
    alone = os.path.join(d, "awq.textproto")
    with open(alone, "w") as f:
      f.write('modifiers { awq { scheme { bits: 4 symmetric: false '
              'group_size: 128 } targets: "Linear" ignore: "lm_head" } }\n'
              'sequential_targets: "LlamaDecoderLayer"\n')
    out = os.path.join(d, "smoothed.pt")
    report = os.path.join(d, "report.json")
    run([tracecut, "calibrate", ckpt, "--recipe=" + alone, "--data=" + data,
         "--format=torchscript", "--report=" + report, "-o", out])
    ours_model = torch.jit.load(out).eval()
    ours = dict(ours_model.state_dict())

    theirs_dir = os.path.join(d, "llmcompressor-out")
    searches = {}
    theirs = llmcompressor_awq(ckpt, ids, theirs_dir, "W4A16_ASYM",
                               ["lm_head"], searches)
    share, worst_loss = compare_awq_searches(
        tracecut_awq_searches(report), searches, "Llama")
    assert share >= 0.9, f"only {share:.0%} of ratios agree"
    assert worst_loss <= 0.01, f"a best loss differs by {worst_loss:.3%}"

    worst = 0.0
    checked = 0
    for layer in range(2):
      moved = set()
      for name in SMOOTHED:
        key = f"model.layers.{layer}.{name}.weight"
        assert key in theirs, f"{key}: llm-compressor's weights not recorded"
        err = relative(ours[key], theirs[key])
        assert err <= 1e-5, f"{key}: relative difference {err:.3g}"
        worst = max(worst, err)
        checked += 1
        if not torch.equal(theirs[key], original[key]):
          moved.add(name)
      # Each mapping's balance layers moved (the identity did not win
      # everywhere, or the comparison would prove little).
      assert moved, f"layer {layer}: AWQ left every weight as it was"
    print(f"AWQ parity: {checked} weights equal llm-compressor's smoothed "
          f"ones, largest relative difference {worst:.3g} (bound 1e-5); "
          f"moved: {sorted(moved)}")

    err = smoothed_drift(model, ours_model, ids[:2])
    assert err <= 1e-5, f"logits changed by smoothing: relative {err:.3g}"
    print(f"smoothed model's logits vs the original transformers model's: "
          f"relative error {err:.3g} (bound 1e-5)")

    # Data-parallel: two ranks, activation sums and errors all-reduced.
    dp = os.path.join(d, "smoothed-dp.pt")
    run([tracecut, "calibrate", ckpt, "--recipe=" + alone, "--data=" + data,
         "--format=torchscript", "--nproc-per-node=2", "-o", dp])
    dp_state = dict(torch.jit.load(dp).state_dict())
    dp_worst = 0.0
    for layer in range(2):
      for name in SMOOTHED:
        key = f"model.layers.{layer}.{name}.weight"
        dp_worst = max(dp_worst, relative(dp_state[key], ours[key]))
    assert dp_worst <= 1e-5, f"data-parallel differs: {dp_worst:.3g}"
    print(f"data-parallel (2 ranks): smoothed weights within {dp_worst:.3g} "
          f"relative of one process's (bound 1e-5: summation order)")

    # End to end: llm-compressor's recipe.yaml, compressed-tensors out.
    recipe = os.path.join(theirs_dir, "recipe.yaml")
    ct = os.path.join(d, "tracecut-out")
    run([tracecut, "calibrate", ckpt, "--recipe=" + recipe, "--data=" + data,
         "-o", ct])
    with torch.no_grad():
      want = model(input_ids=held_out).logits
    e_ours = logit_error(ct, want, held_out)
    e_theirs = logit_error(theirs_dir, want, held_out)
    print(f"AWQ + W4A16_ASYM, loaded by transformers, final-logit relative "
          f"error on held-out tokens: tracecut {e_ours:.4f}, llm-compressor "
          f"{e_theirs:.4f}")
    assert e_ours <= 1.05 * e_theirs, (
        f"tracecut's error {e_ours:.4f} is more than 5 % above "
        f"llm-compressor's {e_theirs:.4f}")

    # recipe.yaml's `scheme: W4A16_ASYM` is compressed-tensors' preset: the
    # textproto naming it runs the same numerics.
    preset = os.path.join(d, "awq-preset.textproto")
    with open(preset, "w") as f:
      f.write('modifiers { awq {} }\nmodifiers { rtn { scheme { preset: '
              '"W4A16_ASYM" } targets: "Linear" ignore: "lm_head" } }\n')
    ct_preset = os.path.join(d, "tracecut-preset-out")
    run([tracecut, "calibrate", ckpt, "--recipe=" + preset, "--data=" + data,
         "-o", ct_preset])
    e_preset = logit_error(ct_preset, want, held_out)
    print(f"AWQ + the W4A16_ASYM preset from a textproto: tracecut "
          f"{e_preset:.4f} (recipe.yaml: {e_ours:.4f})")
    assert abs(e_preset - e_ours) <= 1e-6 * e_ours, (e_preset, e_ours)

  phi3(tracecut, ids)
  # Gemma 2's x * (1 + weight) norms; llm-compressor divides w itself there
  # (its smoothed Gemma changes the model), so no comparison with it.
  check_gemma2(tracecut, ids, 'awq { scheme { preset: "W4A16_ASYM" } '
               'targets: "Linear" ignore: "lm_head" }', "AWQ")


def phi3(tracecut, ids):
  """Phi-3's fused projections: qkv_proj and gate_up_proj are smooth layers
  whose last rows (v; up) are scaled (llm-compressor's Phi-3 mappings).
  llm-compressor 0.14 runs Phi-3's attention with the eager kernel and no
  mask, which is not causal (parity_common.causal_eager_attention; this is
  why its o_proj errors differed from tracecut's before that was found);
  with that made causal, the same checks as for Llama: grid ratios, best
  losses, every fused-layer weight, logits unchanged."""
  import transformers.models.phi3.modeling_phi3 as modeling_phi3
  torch.manual_seed(0)
  config = transformers.Phi3Config(
      vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
      max_position_embeddings=64, pad_token_id=0)
  model = transformers.Phi3ForCausalLM(config).eval()
  with torch.no_grad():
    model.model.embed_tokens.weight[:, [3, 40, 77]] *= 20
  fused = ("input_layernorm", "post_attention_layernorm", "self_attn.qkv_proj",
           "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
  with tempfile.TemporaryDirectory() as d:
    ckpt, data = export_checkpoint(tracecut, model, d, "phi3", ids)
    alone = os.path.join(d, "awq.textproto")
    with open(alone, "w") as f:
      f.write('modifiers { awq { scheme { bits: 4 symmetric: false '
              'group_size: 128 } targets: "Linear" ignore: "lm_head" } }\n')
    out = os.path.join(d, "smoothed.pt")
    report = os.path.join(d, "report.json")
    run([tracecut, "calibrate", ckpt, "--recipe=" + alone, "--data=" + data,
         "--format=torchscript", "--report=" + report, "-o", out])
    ours_model = torch.jit.load(out).eval()
    ours = dict(ours_model.state_dict())
    searches = {}
    theirs = llmcompressor_awq(ckpt, ids, os.path.join(d, "theirs"),
                               "W4A16_ASYM", ["lm_head"], searches,
                               patch=(modeling_phi3,))
    share, worst_loss = compare_awq_searches(
        tracecut_awq_searches(report), searches, "Phi-3")
    assert share >= 0.9, f"phi3: only {share:.0%} of ratios agree"
    assert worst_loss <= 0.01, f"phi3: a best loss differs by {worst_loss:.3%}"
    original = model.state_dict()
    worst = 0.0
    for layer in range(2):
      for name in fused:
        key = f"model.layers.{layer}.{name}.weight"
        assert not torch.equal(ours[key], original[key]), (
            f"phi3 {key}: not smoothed")
        err = relative(ours[key], theirs[key])
        assert err <= 1e-5, f"phi3 {key}: relative difference {err:.3g}"
        worst = max(worst, err)
    err = smoothed_drift(model, ours_model, ids[:2])
    assert err <= 1e-5, f"phi3 logits changed by smoothing: {err:.3g}"
    print(f"Phi-3 AWQ: all {2 * len(fused)} fused-layer weights smoothed and "
          f"within {worst:.3g} relative of llm-compressor's; logits unchanged "
          f"({err:.3g})")


if __name__ == "__main__":
  main()
