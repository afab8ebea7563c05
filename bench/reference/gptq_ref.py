#!/usr/bin/env python3
"""GPTQ's fasterquant in plain torch, the peer of row 6.

    gptq_ref.py PROBLEMS.pt [--reps=3] [--bits=4] [--group=128]
                [--block=128] [--damp=0.01] [--act_order=1]

PROBLEMS.pt is what `gptq_bench solve` writes: for each Linear "<name>|W"
(weight [out, in]), "<name>|H" (the Hessian of its calibration inputs, as
tracecut accumulated it) and "<name>|Q" (tracecut's GPTQ result). This script
solves the same problems with the published algorithm (IST-DASLab/gptq,
gptq.py GPTQ.fasterquant, 2022, transcribed below step by step) and prints one
JSON object: per layer the median solve time over --reps and the largest
|Q_ref - Q_ours|.

Two deliberate departures, both so that the comparison measures the solver
and not a convention:
* the quantization grid is tracecut's (quantization/quantize.h, Note
  [Quantization convention]): symmetric = signed codes, scale = max|w| / qmax,
  zero point 0, clamp to [qmin, qmax]; the reference's Quantizer uses unsigned
  codes with scale = 2 max|w| / maxq and zero (maxq + 1) / 2, a different grid;
* act_order sorts with stable=True (ties keep index order), as tracecut does
  (quantization/gptq.h Note [GPTQ in tracecut] 2); on real Hessians ties do not
  occur.
Everything else (dead columns, damping, Cholesky / cholesky_inverse /
Cholesky upper, blocks with lazy batch updates, group parameters found when a
group's first column is reached from the weights updated by then) is the
reference's code.
"""

import argparse
import json
import sys
import time

import torch


def minmax_params(x, bits):
    """Symmetric per-row parameters of x [rows, cols] (tracecut's grid)."""
    qmax = 2 ** (bits - 1) - 1
    amax = x.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / qmax)
    return scale, torch.zeros_like(scale)


def quantize(x, scale, zero, bits):
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    q = torch.clamp(torch.round(x / scale) + zero, qmin, qmax)
    return scale * (q - zero)


def fasterquant(W, H, bits=4, blocksize=128, percdamp=0.01, groupsize=-1, actorder=False):
    """GPTQ.fasterquant with the Linear's weight W and Hessian H given."""
    W = W.clone().float()
    H = H.clone().float()
    columns = W.shape[1]
    scale, zero = minmax_params(W, bits)  # self.quantizer.find_params(W, weight=True)

    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0

    if actorder:
        perm = torch.argsort(torch.diag(H), descending=True, stable=True)
        W = W[:, perm]
        H = H[perm][:, perm]

    Losses = torch.zeros_like(W)
    Q = torch.zeros_like(W)

    damp = percdamp * torch.mean(torch.diag(H))
    diag = torch.arange(columns)
    H[diag, diag] += damp
    H = torch.linalg.cholesky(H)
    H = torch.cholesky_inverse(H)
    H = torch.linalg.cholesky(H, upper=True)
    Hinv = H

    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        count = i2 - i1

        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Losses1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]

        for i in range(count):
            w = W1[:, i]
            d = Hinv1[i, i]

            if groupsize != -1:
                if (i1 + i) % groupsize == 0:
                    scale, zero = minmax_params(W[:, (i1 + i):(i1 + i + groupsize)], bits)

            q = quantize(w.unsqueeze(1), scale, zero, bits).flatten()
            Q1[:, i] = q
            Losses1[:, i] = (w - q) ** 2 / d ** 2

            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1

        Q[:, i1:i2] = Q1
        Losses[:, i1:i2] = Losses1 / 2

        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])

    if actorder:
        invperm = torch.argsort(perm)
        Q = Q[:, invperm]
    return Q, torch.sum(Losses).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("problems")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--damp", type=float, default=0.01)
    ap.add_argument("--act_order", type=int, default=1)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    # Written by gptq_bench (LibTorch's pickle_save, whose dict type tags the
    # weights-only loader refuses): our own file, so a full unpickle.
    data = torch.load(args.problems, weights_only=False)
    names = sorted({k.rsplit("|", 1)[0] for k in data})
    layers = []
    total = 0.0
    for name in names:
        W, H, Q_ours = data[name + "|W"], data[name + "|H"], data[name + "|Q"]
        kw = dict(bits=args.bits, blocksize=args.block, percdamp=args.damp,
                  groupsize=args.group, actorder=bool(args.act_order))
        fasterquant(W, H, **kw)  # warm-up, as the C++ side does
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            Q, loss = fasterquant(W, H, **kw)
            times.append(time.perf_counter() - t)
        seconds = sorted(times)[len(times) // 2]
        total += seconds
        diff = (Q - Q_ours.float()).abs()
        # Float reassociation moves weights by ulps; a code that flips by one
        # step (a rounding tie broken differently) moves it by a whole scale.
        # Count only the latter.
        layers.append({"name": name, "rows": W.shape[0], "columns": W.shape[1], "seconds": seconds,
                       "max_weight_diff": diff.max().item(),
                       "frac_weights_differing": (diff > 1e-3 * W.abs().max()).float().mean().item(),
                       "weight_abs_max": W.abs().max().item(), "loss": loss})
    print(json.dumps({"peer": "gptq_ref.py (fasterquant)", "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "total_s": total, "layers": layers}))


if __name__ == "__main__":
    sys.exit(main())
