#!/usr/bin/env python3
"""Writes calibration-data files the way users make them, with torch.save.

    make_token_files.py OUT_DIR

tokens_tensor.pt  int64 tensor [6, 16], ids in [0, 256)
tokens_dicts.pt   a list of 6 dicts {"input_ids": 1-D int64 tensor [16],
                  "attention_mask": ones}, as tokenizers return them
tokens_lists.pt   {"input_ids": [[...16 ints...] x 6], "attention_mask": ...}
tokens_single_key.pt  a list of dicts with "input_ids" only (Python pickles
                  one-key dicts with SETITEM, which LibTorch 1.13 could not read)
tokens_set.pt     a Python set of ints: opcodes LibTorch's unpickler lacks
tokens_float.pt   float32 tensor [6, 16] (wrong dtype)
tokens_3d.pt      int64 tensor [2, 3, 16] (wrong shape)
Every token file holds the same ids (seed 7).

Data for other models (the same images and pairs in each format, seed 8):
features_images.pt           float32 tensor [5, 3, 8, 8] (images)
features_images.safetensors  {"pixel_values": the same images}
features_pair.pt             {"input_features": float32 [3, 4, 10],
                              "decoder_input_ids": int64 [3, 6] in [0, 50)}
features_pair.safetensors    the same pair
"""

import os
import sys

import torch


def main(out):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (6, 16), generator=g, dtype=torch.int64)
    torch.save(ids, os.path.join(out, "tokens_tensor.pt"))
    mask = torch.ones_like(ids)
    torch.save(
        [{"input_ids": row.clone(), "attention_mask": m.clone()} for row, m in zip(ids, mask)],
        os.path.join(out, "tokens_dicts.pt"),
    )
    torch.save({"input_ids": ids.tolist(), "attention_mask": mask.tolist()}, os.path.join(out, "tokens_lists.pt"))
    torch.save([{"input_ids": row.clone()} for row in ids], os.path.join(out, "tokens_single_key.pt"))
    torch.save(ids.to(torch.float32), os.path.join(out, "tokens_float.pt"))
    torch.save(ids.view(2, 3, 16), os.path.join(out, "tokens_3d.pt"))
    torch.save({1, 2, 3}, os.path.join(out, "tokens_set.pt"))

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(8)
    images = torch.randn(5, 3, 8, 8, generator=g)
    torch.save(images, os.path.join(out, "features_images.pt"))
    save_file({"pixel_values": images}, os.path.join(out, "features_images.safetensors"))
    pair = {
        "input_features": torch.randn(3, 4, 10, generator=g),
        "decoder_input_ids": torch.randint(0, 50, (3, 6), generator=g),
    }
    torch.save(pair, os.path.join(out, "features_pair.pt"))
    save_file(pair, os.path.join(out, "features_pair.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1])
