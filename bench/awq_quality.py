"""AWQ's effect on quality: final-logit error of RTN, AWQ + RTN, GPTQ and
AWQ + GPTQ (W4 asymmetric, groups of 128) on the seeded Llama of the
parity tests (tests/cli/parity_common.py: 2 layers, hidden 128, outlier
channels), 32 calibration samples of 64 tokens, 8 held-out samples;
each output is a compressed-tensors checkpoint loaded by transformers.

    bazel build //tools:tracecut
    tools/python bench/awq_quality.py bazel-bin/tools/tracecut
"""

import os
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "cli"))
from parity_common import make_model, run, VOCAB  # noqa: E402

SCHEME = ('scheme { bits: 4 symmetric: false group_size: 128 } '
          'targets: "Linear" ignore: "lm_head"')
RECIPES = {
    "RTN": f"modifiers {{ rtn {{ {SCHEME} }} }}",
    "AWQ + RTN": f"modifiers {{ awq {{}} }} modifiers {{ rtn {{ {SCHEME} }} }}",
    "GPTQ": f"modifiers {{ gptq {{ {SCHEME} }} }}",
    "AWQ + GPTQ":
        f"modifiers {{ awq {{}} }} modifiers {{ gptq {{ {SCHEME} }} }}",
}


def main():
  tracecut = os.path.abspath(sys.argv[1])
  torch.set_num_threads(2)
  model = make_model(kv_heads=4)
  ids = torch.randint(0, VOCAB, (32, 64),
                      generator=torch.Generator().manual_seed(3))
  held = torch.randint(0, VOCAB, (8, 64),
                       generator=torch.Generator().manual_seed(4))
  with torch.no_grad():
    want = model(input_ids=held).logits
  with tempfile.TemporaryDirectory() as d:
    ckpt = os.path.join(d, "llama")
    model.save_pretrained(ckpt)
    run([tracecut, "export", ckpt, "-o", os.path.join(ckpt, "model.pt2")])
    data = os.path.join(d, "ids.pt")
    torch.save(ids, data)
    for name, recipe in RECIPES.items():
      path = os.path.join(d, "recipe.textproto")
      with open(path, "w") as f:
        f.write(recipe + '\nsequential_targets: "LlamaDecoderLayer"\n')
      out = os.path.join(d, "out")
      run([tracecut, "calibrate", ckpt, "--recipe=" + path, "--data=" + data,
           "-o", out, "--overwrite"])
      m = transformers.AutoModelForCausalLM.from_pretrained(
          out, dtype=torch.float32).eval()
      with torch.no_grad():
        got = m(input_ids=held).logits
      err = ((got - want).norm() / want.norm()).item()
      print(f"| {name} | {err:.4f} |")


if __name__ == "__main__":
  main()
