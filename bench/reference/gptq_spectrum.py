#!/usr/bin/env python3
"""Why GPTQ gains more on some models than on others: per Linear of a
`gptq_bench solve` problem file, how far the calibration Hessian is from
isotropic and the layer-output error of GPTQ's weights against
round-to-nearest's on the same grid.

    gptq_spectrum.py PROBLEMS.pt [--bits=4] [--group=128]

GPTQ minimises tr((W - Q) H (W - Q)^T), the squared error of the Linear's
output on the calibration inputs; round-to-nearest ignores H. When H is close
to a multiple of the identity (isotropic inputs) the two objectives agree and
GPTQ can only gain through error feedback between columns. Prints one JSON
object; per layer:
  iso: participation ratio of H's eigenvalues / columns
       ((sum l)^2 / sum l^2 / n; 1.0 = isotropic, small = few directions)
  diag_spread: max / mean of diag(H) (what act_order sorts by)
  out_err_gptq, out_err_rtn: tr((W - Q) H (W - Q)^T) / tr(W H W^T)
  ratio: out_err_gptq / out_err_rtn
"""

import argparse
import json
import os
import sys

import torch

# Run with python3 -P (no script directory on sys.path): the grid is gptq_ref's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gptq_ref import minmax_params, quantize  # noqa: E402


def rtn(W, bits, group):
    """Round-to-nearest per row and group on gptq_ref.py's (tracecut's) grid."""
    Q = torch.empty_like(W)
    step = group if group > 0 else W.shape[1]
    for g in range(0, W.shape[1], step):
        scale, zero = minmax_params(W[:, g:g + step], bits)
        Q[:, g:g + step] = quantize(W[:, g:g + step], scale, zero, bits)
    return Q


def out_err(W, Q, H):
    D = (W - Q).double()
    return (torch.trace(D @ H @ D.T) / torch.trace(W.double() @ H @ W.double().T)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("problems")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=128)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    # Written by gptq_bench (LibTorch's pickle_save, whose dict type tags the
    # weights-only loader refuses): our own file, so a full unpickle.
    data = torch.load(args.problems, weights_only=False)
    layers = []
    for name in sorted({k.rsplit("|", 1)[0] for k in data}):
        W = data[name + "|W"].float()
        H = data[name + "|H"].double()
        Q = data[name + "|Q"].float()
        lam = torch.linalg.eigvalsh(H).clamp(min=0)
        d = torch.diag(H)
        e_gptq, e_rtn = out_err(W, Q, H), out_err(W, rtn(W, args.bits, args.group), H)
        layers.append({"name": name, "columns": W.shape[1],
                       "iso": ((lam.sum() ** 2 / (lam ** 2).sum()) / lam.numel()).item(),
                       "diag_spread": (d.max() / d.mean()).item(),
                       "out_err_gptq": e_gptq, "out_err_rtn": e_rtn, "ratio": e_gptq / e_rtn})
    print(json.dumps({"layers": layers}))


if __name__ == "__main__":
    sys.exit(main())
