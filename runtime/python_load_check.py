"""Loads a TorchScript archive in Python torch and checks its outputs.

    python_load_check.py MODEL.pt SPEC.json

SPEC.json: {"inputs": [TENSOR...], "expected": [TENSOR...],
            "extra_files": {NAME: CONTENT}}, TENSOR = {"shape": [...],
"dtype": "float32", "values": [...]} (values flattened, row-major). The
model's output (a tensor or a tuple of tensors, flattened in order) must
match "expected" within 1e-6. Exits non-zero with one line per problem.
"""

import json
import sys

import torch


def tensor(spec):
    dtype = getattr(torch, spec["dtype"])
    return torch.tensor(spec["values"], dtype=dtype).reshape(spec["shape"])


def flatten(value):
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten(v)]
    return [value]


def main(model_path, spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    extra = {name: "" for name in spec["extra_files"]}
    model = torch.jit.load(model_path, _extra_files=extra)
    problems = []
    for name, content in spec["extra_files"].items():
        got = extra[name]
        if isinstance(got, bytes):
            got = got.decode()
        if got != content:
            problems.append("extra file %s: got %r, want %r" % (name, got, content))
    with torch.no_grad():
        outputs = flatten(model(*[tensor(t) for t in spec["inputs"]]))
    expected = [tensor(t) for t in spec["expected"]]
    if len(outputs) != len(expected):
        problems.append("%d outputs, want %d" % (len(outputs), len(expected)))
    for i, (got, want) in enumerate(zip(outputs, expected)):
        if got.dtype != want.dtype or got.shape != want.shape:
            problems.append("output %d: %s%s, want %s%s" % (
                i, got.dtype, list(got.shape), want.dtype, list(want.shape)))
        elif not torch.allclose(got, want, rtol=1e-6, atol=1e-6):
            problems.append("output %d differs by %g" % (
                i, (got - want).abs().max().item()))
    if problems:
        print(model.code)
        for p in problems:
            print("python_load_check: " + p)
        return 1
    print("python_load_check: ok (%d outputs)" % len(outputs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
