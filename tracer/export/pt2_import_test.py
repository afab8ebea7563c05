"""The .pt2 front end on programs with the awkward parts of torch.export:

  * a module called twice (one forward), and one called twice with
    different code (inlined the second time);
  * tied weights (a Linear reading another module's weight);
  * module names that are not identifiers ("0", "block-1");
  * ops returning lists (chunk) and tuples (max.dim), optional-tensor lists
    (index), empty int lists, dtype / layout / device arguments;
  * dynamic batch and sequence dimensions (symbolic sizes);
  * histc of integers, exported on the meta device (as transformers' MoE
    experts count tokens per expert), which LibTorch's CPU kernel refuses.

Each model is exported with torch.export, imported by `tracecut trace
--format=torchscript` and run by Python torch on fresh inputs of another
batch size; outputs must equal the eager module's (rtol 1e-5, atol 1e-6).
Bad archives get one error naming the file: truncated, not a .pt2, a
control-flow program (torch.cond) naming the node and source line.

    pt2_import_test.py TRACECUT
"""

import os
import subprocess
import sys
import tempfile

import torch


class Block(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.fc = torch.nn.Linear(8, 8)
    self.norm = torch.nn.LayerNorm(8)

  def forward(self, x):
    a, b = torch.chunk(self.fc(x), 2, dim=-1)
    return self.norm(torch.cat([b, a], dim=-1))


class Net(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.embed = torch.nn.Embedding(16, 8)
    self.layers = torch.nn.ModuleList([Block(), Block()])
    self.add_module("block-1", Block())
    self.act = torch.nn.GELU()
    self.head = torch.nn.Linear(8, 16, bias=False)
    self.head.weight = self.embed.weight  # Tied.

  def forward(self, ids):
    h = self.embed(ids)
    for layer in self.layers:
      h = self.act(layer(h))
    h = getattr(self, "block-1")(h)
    h = getattr(self, "block-1")(h * 2)  # Called twice.
    values, _ = h.max(dim=-1, keepdim=True)
    h = h - values
    rows = torch.arange(h.shape[0])
    picked = h[rows, torch.zeros_like(rows)]  # index with optional tensors.
    h = h + picked.unsqueeze(1).unsqueeze(2).to(torch.float32)
    ones = h.new_ones([])  # Empty int list.
    return self.head(h) * ones


class Hist(torch.nn.Module):

  def forward(self, x):
    ids = x.argmax(-1).int()
    return torch.cumsum(torch.histc(ids, bins=4, min=0, max=3), 0,
                        dtype=torch.int32)


class Cond(torch.nn.Module):

  def forward(self, x):
    return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))


def run(cmd, ok=True):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if ok and p.returncode != 0:
    raise AssertionError(f"{cmd} exited {p.returncode}: {p.stderr[-3000:]}")
  if not ok and p.returncode == 0:
    raise AssertionError(f"{cmd} succeeded; expected an error")
  return p


def main():
  tracecut = sys.argv[1]
  torch.manual_seed(0)
  with tempfile.TemporaryDirectory() as d:
    net = Net().eval()
    ids = torch.randint(0, 16, (2, 5))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    ep = torch.export.export(net, (ids,), dynamic_shapes={
        "ids": {0: batch, 1: seq}}).run_decompositions({})
    pt2 = os.path.join(d, "net.pt2")
    torch.export.save(ep, pt2)
    traced = os.path.join(d, "net.pt")
    run([tracecut, "trace", pt2, "--format=torchscript", "-o", traced])
    m = torch.jit.load(traced)
    for shape in [(2, 5), (3, 7)]:
      x = torch.randint(0, 16, shape)
      with torch.no_grad():
        want, got = net(x), m(x)
      torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    print("net: outputs equal eager at batch/seq (2, 5) and (3, 7)")

    # Structure: the text IR has the leaves as call_module at their paths.
    text = run([tracecut, "trace", pt2]).stdout
    for target in ("call_module[embed]", "call_module[layers.0.fc]",
                   'call_module["block-1.fc"]', "call_module[head]"):
      if target not in text:
        raise AssertionError(f"no {target} in the traced graph:\n{text}")
    print("net: leaves are call_module nodes at their module paths")
    # Source locations are the model's own lines (from stack_trace).
    if 'pt2_import_test.py":' not in text or "self.head(h)" not in text:
      raise AssertionError(f"no source location in this file:\n{text}")
    print("net: nodes carry the model's source file and line")

    # Integer histc, as a meta-device export writes it.
    hist = torch.export.export(Hist(), (torch.randn(6, 4, device="meta"),))
    hist.example_inputs = ((torch.randn(6, 4),), {})  # LibTorch reads these.
    hpt2 = os.path.join(d, "hist.pt2")
    torch.export.save(hist, hpt2)
    run([tracecut, "trace", hpt2, "--format=torchscript", "-o", traced])
    m = torch.jit.load(traced)
    x = torch.randn(6, 4)
    ids = x.argmax(-1)
    want = torch.cumsum(torch.histc(ids.double(), bins=4, min=0, max=3), 0,
                        dtype=torch.int32)
    got = m(x)
    assert got.dtype == torch.int32 and torch.equal(got, want), (got, want)
    print("hist: integer histc of a meta export counts as torch does")

    # Bad input: one error each, naming the file.
    bad = os.path.join(d, "truncated.pt2")
    with open(pt2, "rb") as f, open(bad, "wb") as g:
      g.write(f.read()[:1000])
    err = run([tracecut, "trace", bad], ok=False).stderr
    assert bad in err and "Traceback" not in err, err
    notzip = os.path.join(d, "text.pt2")
    with open(notzip, "w") as f:
      f.write("hello")
    err = run([tracecut, "trace", notzip], ok=False).stderr
    assert notzip in err and "torch.export archive" in err, err

    cond = torch.export.export(Cond(), (torch.randn(3),))
    cpt2 = os.path.join(d, "cond.pt2")
    torch.export.save(cond, cpt2)
    err = run([tracecut, "trace", cpt2], ok=False).stderr
    assert "higher-order" in err and "pt2_import_test.py" in err, err
    print("bad archives: one clear error each")


if __name__ == "__main__":
  main()
