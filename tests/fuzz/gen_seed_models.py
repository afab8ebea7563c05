"""Writes the model_loader_fuzzer seed corpus: tiny TorchScript archives of
a 2-layer MLP (traced and scripted, with and without the embedded
config.json / tracecut_inputs.json) and broken variants of them.

Usage: python3 gen_seed_models.py OUT_DIR
Deterministic: fixed seed, one thread, fixed extra-file text.
"""

import json
import os
import sys

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


INPUTS = {
    "inputs": [{"dtype": "float32", "kind": "normal", "name": "x", "shape": [2, 8]}],
    "outputs": ["y"],
}
CONFIG = {"architectures": ["Mlp"], "hidden_size": 16, "model_type": "mlp"}


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Mlp().eval()
    x = torch.randn(2, 8)
    traced = torch.jit.trace(model, (x,))
    scripted = torch.jit.script(model)
    files = {
        "config.json": json.dumps(CONFIG, sort_keys=True),
        "tracecut_inputs.json": json.dumps(INPUTS, sort_keys=True),
    }
    torch.jit.save(scripted, os.path.join(out, "mlp_scripted.pt"), _extra_files=files)
    torch.jit.save(traced, os.path.join(out, "mlp_traced.pt"), _extra_files=files)
    torch.jit.save(scripted, os.path.join(out, "mlp_plain.pt"))
    with open(os.path.join(out, "mlp_scripted.pt"), "rb") as f:
        good = f.read()
    broken = {
        "truncated_head.pt": good[: len(good) // 2],
        "truncated_tail.pt": good[:-30],
        "garbage.pt": b"this is not a model\n",
        "zip_magic_only.pt": b"PK\x03\x04" + b"\x00" * 26 + b"PK\x05\x06" + b"\x00" * 18,
    }
    for name, data in broken.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    # What torch.save writes: a zip archive holding a pickle, not TorchScript.
    torch.save({"w": torch.ones(2)}, os.path.join(out, "torch_save.pt"))


if __name__ == "__main__":
    main()
