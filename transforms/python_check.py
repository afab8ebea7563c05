"""Checks a model tracecut transformed and exported, in Python torch.

    python_check.py EXPORTED.pt ORIGINAL.pt INPUTS.pkl TOLERANCE

Loads both TorchScript archives, runs them on the inputs (a tuple saved
with torch::pickle_save), and compares every output tensor: the largest
error relative to the largest original magnitude must be <= TOLERANCE.
Prints one line and exits 0 on success, 1 otherwise.
"""

import sys

import torch


def flatten(value):
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flatten(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in flatten(value[k])]
    return [value] if isinstance(value, torch.Tensor) else []


def main(exported_path, original_path, inputs_path, tolerance):
    exported = torch.jit.load(exported_path)
    original = torch.jit.load(original_path)
    inputs = torch.load(inputs_path)
    with torch.no_grad():
        got = flatten(exported(*inputs))
        want = flatten(original(*inputs))
    if len(got) != len(want):
        print("python_check: %d outputs, want %d" % (len(got), len(want)))
        return 1
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            print("python_check: output %d is %s%s, want %s%s" %
                  (i, g.dtype, list(g.shape), w.dtype, list(w.shape)))
            return 1
        scale = w.double().abs().max().item() if w.numel() else 0.0
        err = (g.double() - w.double()).abs().max().item() if w.numel() else 0.0
        worst = max(worst, err / scale if scale > 0 else err)
    if not worst <= tolerance:
        print("python_check: max relative error %g > %g" % (worst, tolerance))
        return 1
    print("python_check: ok, %d outputs, max relative error %g" % (len(got), worst))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
