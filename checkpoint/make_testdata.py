"""Writes safetensors test files with the safetensors package:

  OUT/model.safetensors                   w (f32 [2, 3] = arange), b (bf16 [3]),
                                          ids (i64 [4])
  OUT/sharded/model.safetensors.index.json + two shards holding a and b
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

out = sys.argv[1]
os.makedirs(os.path.join(out, "sharded"), exist_ok=True)
save_file({
    "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
    "b": torch.tensor([0.5, -1.0, 2.0], dtype=torch.bfloat16),
    "ids": torch.tensor([1, 2, 3, 4], dtype=torch.int64),
}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
shards = {"model-00001-of-00002.safetensors": {"a": torch.ones(2, 2)},
          "model-00002-of-00002.safetensors": {"b": torch.full((3,), 7.0)}}
weight_map = {}
for name, tensors in shards.items():
  save_file(tensors, os.path.join(out, "sharded", name))
  weight_map.update({t: name for t in tensors})
with open(os.path.join(out, "sharded", "model.safetensors.index.json"),
          "w") as f:
  json.dump({"metadata": {}, "weight_map": weight_map}, f)
