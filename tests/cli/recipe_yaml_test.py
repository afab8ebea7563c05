"""llm-compressor's recipe.yaml in and out (GitHub issue 31, item 4).

A tiny transformers Llama (seeded, from a config) is saved as a checkpoint
directory and exported with `tracecut export`. For each recipe that
llm-compressor 0.14 itself writes (`Recipe.from_modifiers([...]).yaml()`:
GPTQ W4A16, QuantizationModifier W4A16_ASYM, GPTQ with config_groups,
SmoothQuant followed by GPTQ W8A16, AWQ followed by QuantizationModifier
W4A16_ASYM, with default and with its own settings):

* `tracecut calibrate --recipe=that.yaml` accepts it and writes OUT_DIR with
  a recipe.yaml;
* llm-compressor's `Recipe.create_instance` parses OUT_DIR/recipe.yaml, and
  its modifiers resolve to the same quantization config (per group: bits,
  type, symmetric, strategy, group size, act order), targets, ignore and
  GPTQ settings as llm-compressor reads from the recipe given;
* calibrating again with OUT_DIR/recipe.yaml reproduces OUT_DIR: the same
  bytes in every file.

An llm-compressor recipe tracecut does not run (WandaPruningModifier) is
refused with one line naming the file and key, and nothing is written.

    recipe_yaml_test.py TRACECUT
"""

import os
import subprocess
import sys
import tempfile

import torch
import transformers
from llmcompressor.modifiers.quantization import (GPTQModifier,
                                                  QuantizationModifier)
from llmcompressor.modifiers.transform import (AWQModifier,
                                               SmoothQuantModifier)
from llmcompressor.recipe import Recipe


def run(cmd, code=0):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != code:
    raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}, want {code}:"
                         f"\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
  return p


def recipes():
  groups = {"group_0": {"targets": ["Linear"], "weights": {
      "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}}}
  return {
      "gptq_w4a16": [GPTQModifier(targets="Linear", scheme="W4A16",
                                  ignore=["lm_head"])],
      "rtn_w4a16_asym": [QuantizationModifier(
          targets="Linear", scheme="W4A16_ASYM", ignore=["lm_head"])],
      "gptq_groups": [GPTQModifier(config_groups=groups, ignore=["lm_head"],
                                   actorder=None, dampening_frac=0.05,
                                   block_size=64)],
      # PEERS.md's example, with a weight-only scheme.
      "smoothquant_gptq": [SmoothQuantModifier(smoothing_strength=0.8),
                           GPTQModifier(targets="Linear", scheme="W8A16",
                                        ignore=["lm_head"])],
      # llm-compressor's examples/awq: AWQ, then the scheme it searches for.
      # (offload_device is given: the YAML of its unset default, a Python
      # sentinel object, is one llm-compressor's own reader refuses.)
      "awq_w4a16_asym": [AWQModifier(offload_device=None), QuantizationModifier(
          targets="Linear", scheme="W4A16_ASYM", ignore=["lm_head"])],
      "awq_both_mapped": [
          AWQModifier(offload_device=None, duo_scaling="both", n_grid=10,
                      mappings=[
              {"smooth_layer": "re:.*post_attention_layernorm$",
               "balance_layers": ["re:.*gate_proj$", "re:.*up_proj$"]}]),
          GPTQModifier(targets="Linear", scheme="W4A16",
                       ignore=["lm_head"])],
  }


def actorder(value):
  """"static" is an alias of "weight" (compressed-tensors' Aliasable)."""
  value = getattr(value, "value", value)
  return {"static": "weight"}.get(value, value)


def summary(recipe):
  """What a recipe makes llm-compressor compute, modifier by modifier."""
  out = []
  for m in recipe.modifiers:
    if isinstance(m, AWQModifier):
      out.append(("AWQModifier", m.duo_scaling, m.n_grid,
                  [(getattr(x, "smooth_layer", None) or x["smooth_layer"],
                    list(getattr(x, "balance_layers", None) or
                         x["balance_layers"])) for x in (m.mappings or [])]))
      continue
    if isinstance(m, SmoothQuantModifier):
      out.append(("SmoothQuantModifier", m.smoothing_strength,
                  [[list(b), s] for b, s in (m.mappings or [])],
                  sorted(m.ignore or []), m.algorithm))
      continue
    groups = []
    for g in m.resolved_config.config_groups.values():
      w = g.weights
      groups.append((sorted(g.targets), w.num_bits, str(w.type), w.symmetric,
                     str(w.strategy), w.group_size, actorder(w.actorder),
                     g.input_activations, g.output_activations))
    extra = ()
    if isinstance(m, GPTQModifier):
      extra = (m.block_size, m.dampening_frac)
    out.append((type(m).__name__, sorted(m.ignore), groups, extra))
  return out


def files(directory):
  return {f: open(os.path.join(directory, f), "rb").read()
          for f in sorted(os.listdir(directory))}


def main():
  tracecut = sys.argv[1]
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=256, hidden_size=128, intermediate_size=256,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=64)
  model = transformers.LlamaForCausalLM(config).eval()
  with tempfile.TemporaryDirectory() as d:
    ckpt = os.path.join(d, "llama")
    model.save_pretrained(ckpt)
    run([tracecut, "export", ckpt, "-o", os.path.join(ckpt, "model.pt2")])
    flags = ["--synthetic=8", "--seq-len=16"]

    for name, modifiers in recipes().items():
      path = os.path.join(d, name + ".yaml")
      Recipe.from_modifiers(modifiers).yaml(file_path=path)
      # What llm-compressor itself reads from that file (its YAML leaves
      # out None values: GPTQModifier(actorder=None) reads back as the
      # default, "static").
      given = Recipe.create_instance(path)
      out = os.path.join(d, name)
      run([tracecut, "calibrate", ckpt, "--recipe=" + path, "-o", out]
          + flags)
      written = os.path.join(out, "recipe.yaml")
      assert os.path.isfile(written), sorted(os.listdir(out))
      parsed = Recipe.create_instance(written)
      assert summary(parsed) == summary(given), (
          name, summary(parsed), summary(given), open(written).read())
      assert parsed.args.get("sequential_targets") == ["LlamaDecoderLayer"], (
          parsed.args)
      print(f"{name}: tracecut accepts llm-compressor's recipe.yaml; "
            f"llm-compressor parses tracecut's into the same "
            f"{len(parsed.modifiers)} modifier(s): {summary(parsed)}")

      again = os.path.join(d, name + "-again")
      run([tracecut, "calibrate", ckpt, "--recipe=" + written, "-o", again]
          + flags)
      first, second = files(out), files(again)
      assert sorted(first) == sorted(second), (sorted(first), sorted(second))
      for f in first:
        assert first[f] == second[f], f"{name}: {f} differs"
      print(f"{name}: calibrating with the output's recipe.yaml reproduces "
            f"all {len(first)} files byte for byte")

    # A modifier tracecut does not run is refused by name, nothing written.
    from llmcompressor.modifiers.pruning import WandaPruningModifier
    wanda = os.path.join(d, "wanda.yaml")
    Recipe.from_modifiers([WandaPruningModifier(
        sparsity=0.5, targets="__ALL_PRUNABLE__")]).yaml(file_path=wanda)
    out = os.path.join(d, "wanda-out")
    p = run([tracecut, "calibrate", ckpt, "--recipe=" + wanda, "-o", out]
            + flags, code=1)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert wanda in lines[0] and "WandaPruningModifier" in lines[0] \
        and "unsupported modifier" in lines[0], lines[0]
    assert not os.path.exists(out), os.listdir(d)
    print(f"WandaPruningModifier refused: {lines[0]}")


if __name__ == "__main__":
  main()
