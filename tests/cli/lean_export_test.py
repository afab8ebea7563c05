"""Lean exports (GitHub issue 16, item 6), checked in Python torch.

`tracecut transform --passes=fuse-batchnorm2d-in-conv2d` on the CNN fixtures
and on a scripted torchvision ResNet-18 writes a model that lists no
BatchNorm module, is not larger than the original file, computes what the
original does within the comparator's defaults (rtol 1e-4, atol 1e-5), and
is again a valid tracecut input (`tracecut trace` it).

    lean_export_test.py TRACECUT FIXTURE.pt...
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
import torchvision


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise AssertionError(f"{cmd}: exit {p.returncode}:\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
  return p


def example_inputs(path):
  """The fixture's embedded example inputs (tracecut_inputs.json)."""
  extra = {"tracecut_inputs.json": ""}
  torch.jit.load(path, _extra_files=extra)
  spec = json.loads(extra["tracecut_inputs.json"])
  gen = torch.Generator().manual_seed(0)
  inputs = []
  for i in spec["inputs"]:
    assert i["kind"] == "normal", i
    inputs.append(torch.randn(i["shape"], generator=gen).to(
        getattr(torch, i["dtype"])))
  return inputs


def module_types(model):
  return [m.original_name for m in model.modules()]


def flatten(value):
  if isinstance(value, (tuple, list)):
    return [t for v in value for t in flatten(v)]
  return [value]


def check(tracecut, name, original, inputs, flags):
  fused = original[:-3] + ".lean.pt"
  run([tracecut, "transform", original, "--passes=fuse-batchnorm2d-in-conv2d",
       "--check", "-o", fused] + flags)
  before = torch.jit.load(original).eval()
  after = torch.jit.load(fused).eval()
  assert any("BatchNorm" in t for t in module_types(before)), name
  types = module_types(after)
  assert not any("BatchNorm" in t for t in types), (name, types)
  original_size, fused_size = os.path.getsize(original), os.path.getsize(fused)
  assert fused_size <= original_size, (name, fused_size, original_size)
  with torch.no_grad():
    want = flatten(before(*inputs))
    got = flatten(after(*inputs))
  assert len(got) == len(want), name
  worst = 0.0
  for g, w in zip(got, want):
    torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    worst = max(worst, (g - w).abs().max().item())
  run([tracecut, "trace", fused, "-o", fused + ".txt"] + flags)
  print(f"{name}: {original_size} bytes -> {fused_size} bytes after fusion, "
        f"no BatchNorm, max abs error {worst:.3g}, traces again")


def main():
  tracecut = sys.argv[1]
  torch.manual_seed(0)
  with tempfile.TemporaryDirectory() as d:
    for fixture in sys.argv[2:]:
      stem = os.path.basename(fixture)[:-3]
      copy = os.path.join(d, stem + ".pt")
      with open(fixture, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
      check(tracecut, stem, copy, example_inputs(copy), [])

    # The model: a scripted ResNet-18 with BatchNorm statistics
    # that are not the identity, so a wrong fusion would show.
    model = torchvision.models.resnet18().eval()
    for m in model.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        m.running_mean.uniform_(-0.5, 0.5)
        m.running_var.uniform_(0.5, 2.0)
        m.weight.data.uniform_(0.5, 1.5)
        m.bias.data.uniform_(-0.5, 0.5)
    pt = os.path.join(d, "resnet18.pt")
    torch.jit.save(torch.jit.script(model), pt)
    x = torch.randn(1, 3, 64, 64)
    check(tracecut, "resnet18 (scripted)", pt, [x],
          ["--input=x:float32[1,3,64,64]"])


if __name__ == "__main__":
  main()
