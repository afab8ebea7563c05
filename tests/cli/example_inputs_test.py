"""Example inputs from the command line (docs/example_inputs.md).

A torchvision ResNet-18 saved as TorchScript without tracecut_inputs.json
cannot be traced until its input is described; --input and
--example-inputs (a tensor, a tuple, a dict) describe it, and partition
--check then passes. A torch.export .pt2 of the same model needs no flag
(its own example inputs). Bad descriptions get one usage error each.

    example_inputs_test.py TRACECUT
"""

import os
import subprocess
import sys
import tempfile

import torch
import torchvision


def run(cmd, code=0):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != code:
    raise AssertionError(f"{cmd}: exit {p.returncode}, want {code}:\n"
                         f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
  return p


def main():
  tracecut = sys.argv[1]
  torch.manual_seed(0)
  with tempfile.TemporaryDirectory() as d:
    model = torchvision.models.resnet18().eval()
    pt = os.path.join(d, "r18.pt")
    torch.jit.save(torch.jit.script(model), pt)
    x = torch.randn(1, 3, 64, 64)
    files = {}
    for name, value in (("tensor", x), ("tuple", (x,)), ("dict", {"x": x}),
                        ("two", (x, x)), ("wrong_name", {"y": x})):
      files[name] = os.path.join(d, f"{name}.pt")
      torch.save(value, files[name])

    err = run([tracecut, "trace", pt], code=1).stderr
    assert "'x' (Tensor)" in err and "--input=" in err, err

    for flags in (["--input=x:float32[1,3,64,64]"],
                  ["--example-inputs=" + files["tensor"]],
                  ["--example-inputs=" + files["tuple"]],
                  ["--example-inputs=" + files["dict"]]):
      out = run([tracecut, "partition", pt, "--targets=BasicBlock", "--check"]
                + flags).stderr
      assert "check passed" in out, out
    print("TorchScript ResNet-18: --input and --example-inputs work")

    pt2 = os.path.join(d, "r18.pt2")
    torch.export.save(torch.export.export(model, (x,)), pt2)
    out = run([tracecut, "partition", pt2, "--targets=BasicBlock",
               "--check"]).stderr
    assert "check passed" in out, out
    print("torch.export ResNet-18: its own example inputs")

    for flags, message in (
        (["--input=x:float33[1]"], "unknown dtype"),
        (["--input=x[1,2]"], "not NAME:DTYPE[SHAPE]"),
        (["--input=x:float32[1,a]"], "not a dimension"),
        (["--input=x:int64[2]:tokens=0"], "tokens=HIGH"),
        (["--input=x:float32[2]:twos"], "unknown value kind"),
    ):
      err = run([tracecut, "trace", pt] + flags, code=2).stderr
      assert message in err and "--help" in err, (flags, err)
    for name, message in (("two", "takes 1"), ("wrong_name", "'y'")):
      err = run([tracecut, "trace", pt, "--example-inputs=" + files[name]],
                code=1).stderr
      assert message in err and files[name] in err, err
    err = run([tracecut, "trace", pt, "--example-inputs=" + pt + ".none"],
              code=1).stderr
    assert "cannot open" in err, err
    print("bad descriptions: one error each")


if __name__ == "__main__":
  main()
