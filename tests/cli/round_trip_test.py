"""Round trips (GitHub issue 19): tracecut's outputs are tracecut inputs.

1. Every subcommand that writes a model (`trace --format=torchscript`,
   `calibrate`, `transform`) writes one that keeps the module tree: tracing
   it again gives the same module scopes, and `partition --check` at the
   original sequential targets gives the same subgraphs and passes. The
   calibrated model is calibrated again.
2. torchvision RegNet, DenseNet, EfficientNet, ConvNeXt and ResNet (scripted,
   seeded random weights): `trace`, `transform --check` with the fusion
   passes and `partition --check` succeed; the transformed model loads in
   Python torch and matches the original (rtol 1e-4, atol 1e-5), and
   partitions at the same targets into the same subgraphs.

    round_trip_test.py TRACECUT LLAMA.pt RECIPE.textproto
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
import torchvision

FUSION = ("--passes=fuse-batchnorm2d-in-conv2d,fuse-batchnorm1d-in-linear,"
          "fuse-bias-in-linear")


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}:\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
  return p


def scopes(tracecut, model, flags):
  """The distinct module stacks (paths and types) of the traced graph."""
  graph = json.loads(run([tracecut, "trace", model, "--format=json", "-o", "-"]
                         + flags).stdout)
  return {tuple((e["path"], e["type"].split(".")[-1]) for e in n["scope"])
          for n in graph["nodes"]}


def partition(tracecut, model, target, flags):
  """Each subgraph's module paths; fails unless --check passes."""
  p = run([tracecut, "partition", model, "--targets=" + target, "--check",
           "--json"] + flags)
  assert "check passed" in p.stderr, p.stderr
  return [s["module_paths"] for s in json.loads(p.stdout)["subgraphs"]]


def check_same_tree(tracecut, name, original, output, target, flags,
                    same_scopes=True):
  want = partition(tracecut, original, target, flags)
  got = partition(tracecut, output, target, flags)
  assert len(want) > 2 and got == want, (name, want, got)
  if same_scopes:
    before, after = scopes(tracecut, original, flags), scopes(tracecut, output,
                                                              flags)
    assert before == after, (name, sorted(before ^ after)[:10])
  print(f"{name}: traces again to the same module tree; partitions at "
        f"{target} into the same {len(got)} subgraphs, check passed")


def llama_outputs(tracecut, llama, recipe, d):
  target = "LlamaDecoderLayer"
  traced = os.path.join(d, "llama.traced.pt")
  run([tracecut, "trace", llama, "--format=torchscript", "-o", traced])
  check_same_tree(tracecut, "trace --format=torchscript", llama, traced,
                  target, [])

  calibrated = os.path.join(d, "llama.gptq.pt")
  run([tracecut, "calibrate", llama, "--recipe=" + recipe, "--synthetic=8",
       "-o", calibrated])
  check_same_tree(tracecut, "calibrate", llama, calibrated, target, [])
  again = os.path.join(d, "llama.gptq2.pt")
  run([tracecut, "calibrate", calibrated, "--recipe=" + recipe,
       "--synthetic=8", "-o", again])
  check_same_tree(tracecut, "calibrate (a second time)", llama, again, target,
                  [])

  transformed = os.path.join(d, "llama.transformed.pt")
  run([tracecut, "transform", llama, "--passes=change-truediv-to-mul-by-inverse",
       "--targets=" + target, "--check", "-o", transformed])
  check_same_tree(tracecut, "transform", llama, transformed, target, [])


def flatten(value):
  if isinstance(value, (tuple, list)):
    return [t for v in value for t in flatten(v)]
  return [value]


def torchvision_matrix(tracecut, d):
  flags = ["--input=x:float32[1,3,64,64]"]
  x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
  for name, target in (("regnet_y_400mf", "ResBottleneckBlock"),
                       ("densenet121", "_DenseLayer"),
                       ("efficientnet_b0", "MBConv"),
                       ("convnext_tiny", "CNBlock"),
                       ("resnet18", "BasicBlock")):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)().eval()
    original = os.path.join(d, name + ".pt")
    torch.jit.save(torch.jit.script(model), original)
    run([tracecut, "trace", original, "-o", original + ".txt"] + flags)
    fused = os.path.join(d, name + ".fused.pt")
    run([tracecut, "transform", original, FUSION, "--check", "-o", fused]
        + flags)
    with torch.no_grad():
      want = flatten(model(x))
      got = flatten(torch.jit.load(fused).eval()(x))
    assert len(got) == len(want), name
    for g, w in zip(got, want):
      torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    # Fusion replaces modules, so scopes differ; the layers must not.
    check_same_tree(tracecut, f"{name} fused", original, fused, target, flags,
                    same_scopes=False)
    for path in (original, fused):
      os.remove(path)


def main():
  tracecut, llama, recipe = sys.argv[1:4]
  torch.manual_seed(0)
  with tempfile.TemporaryDirectory() as d:
    llama_outputs(tracecut, llama, recipe, d)
    torchvision_matrix(tracecut, d)


if __name__ == "__main__":
  main()
