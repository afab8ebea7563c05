"""Compares data-parallel calibrated models with the single-process one.

  check_distributed.py ORIGINAL.pt SINGLE.pt NAME=DIST.pt...

For each DIST: the integer codes of every quantized weight (round(W / scale)
+ zero point, through g_idx with act order) against SINGLE's: the fraction
that differ is printed and must stay below 1 % (a rounding tie decided the
other way by fp32 summation order); scales, zero points, g_idx and the
observers' input scales within 1e-5 relative; and the model's output error
against ORIGINAL on held-out tokens within 1 % (relative) of SINGLE's.
"""

import sys
import warnings

import torch

warnings.filterwarnings("ignore")


def load(path):
    return torch.jit.load(path, map_location="cpu")


def codes(w, scale, zero, g_idx):
    if g_idx is not None:
        s = scale[:, g_idx.long()]
        z = zero[:, g_idx.long()]
    else:
        g = w.shape[1] // scale.shape[1]
        s = scale.repeat_interleave(g, 1)
        z = zero.repeat_interleave(g, 1)
    return torch.round(w / s) + z


def rel_error(model, original, tokens):
    with torch.no_grad():
        mask = torch.ones_like(tokens)
        ref = original(tokens, mask)
        out = model(tokens, mask)
    ref = ref[0] if isinstance(ref, tuple) else ref
    out = out[0] if isinstance(out, tuple) else out
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def main():
    original = load(sys.argv[1])
    single = load(sys.argv[2])
    torch.manual_seed(1234)
    tokens = torch.randint(0, 256, (8, 16))
    e1 = rel_error(single, original, tokens)
    print(f"single process: output error vs original {e1:.6f}")
    params1 = dict(single.named_parameters())
    bufs1 = dict(single.named_buffers())
    failed = False
    for arg in sys.argv[3:]:
        name, path = arg.split("=", 1)
        model = load(path)
        params = dict(model.named_parameters())
        bufs = dict(model.named_buffers())
        differ = total = 0
        worst = 0.0
        for key, w1 in params1.items():
            mod = key[: -len(".weight")] if key.endswith(".weight") else None
            if mod is None or f"{mod}.weight_scale" not in bufs1:
                if not torch.equal(w1, params[key]):
                    print(f"{name}: unquantized {key} differs")
                    failed = True
                continue
            g1 = bufs1.get(f"{mod}.weight_g_idx")
            g = bufs.get(f"{mod}.weight_g_idx")
            if (g1 is None) != (g is None) or (g1 is not None and not torch.equal(g1, g)):
                print(f"{name}: {mod}.weight_g_idx differs")
                failed = True
                continue
            c1 = codes(w1, bufs1[f"{mod}.weight_scale"], bufs1[f"{mod}.weight_zero_point"], g1)
            c = codes(params[key], bufs[f"{mod}.weight_scale"], bufs[f"{mod}.weight_zero_point"], g)
            differ += (c1 != c).sum().item()
            total += c1.numel()
        for key, b1 in bufs1.items():
            if key.endswith("_scale"):
                rel = ((bufs[key] - b1).abs() / b1.abs().clamp_min(1e-30)).max().item()
                worst = max(worst, rel)
            elif key.endswith("_zero_point") and not torch.equal(b1, bufs[key]):
                print(f"{name}: {key} differs")
                failed = True
        e = rel_error(model, original, tokens)
        frac = differ / max(total, 1)
        print(f"{name}: integer codes differing {differ}/{total} = {frac:.5%}; "
              f"max relative scale difference {worst:.2e}; output error vs "
              f"original {e:.6f} ({(e - e1) / e1:+.4%} of single process)")
        if frac > 0.01:
            print(f"{name}: FAIL: more than 1 % of the codes differ")
            failed = True
        if worst > 1e-5:
            print(f"{name}: FAIL: scales differ by more than 1e-5 relative")
            failed = True
        if abs(e - e1) > 0.01 * e1:
            print(f"{name}: FAIL: output error not within 1 % of single process")
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
