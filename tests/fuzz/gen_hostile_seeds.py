"""Writes the seed corpora of the hostile-input fuzz targets (issue 35): the
crafted files of tests/cli/hostile_input_test.sh, small.

  python3 gen_hostile_seeds.py OUT_DIR

OUT_DIR/safetensors/*: one mode byte (0: a safetensors file, 1: an index)
then the bytes, for safetensors_fuzzer.cc. OUT_DIR/pt2/*.pt2: a small
exported program and variants, for pt2_archive_fuzzer.cc.
OUT_DIR/inputs/*.json: tracecut_inputs.json texts, for inputs_json_fuzzer.cc.
Deterministic: fixed seed, one thread.
"""

import io
import json
import os
import struct
import sys
import zipfile

import torch
from safetensors.torch import save


def image(header, data):
  text = json.dumps(header).encode() if not isinstance(header, bytes) else header
  return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds(out):
  os.makedirs(out, exist_ok=True)
  def put(name, data, mode=0):
    with open(os.path.join(out, name), "wb") as f:
      f.write(bytes([mode]) + data)
  good = save({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
               "b": torch.ones(4, dtype=torch.bfloat16),
               "e": torch.zeros(0, 3, dtype=torch.int64)},
              metadata={"format": "pt"})
  put("valid", good)
  f32 = {"dtype": "F32", "shape": [2]}
  put("overlap", image({"q": {**f32, "data_offsets": [0, 8]},
                        "o": {**f32, "data_offsets": [0, 8]}}, b"x" * 8))
  put("gap", image({"q": {**f32, "data_offsets": [4, 12]}}, b"x" * 12))
  put("duplicate", image(b'{"q": {"dtype": "F32", "shape": [2], '
                         b'"data_offsets": [0, 8]}, "q": {"dtype": "F32", '
                         b'"shape": [2], "data_offsets": [8, 16]}}', b"x" * 16))
  put("huge_header", struct.pack("<Q", 1 << 40) + b"{}")
  put("trailing", image({"q": {**f32, "data_offsets": [0, 8]}}, b"x" * 9))
  put("negative", image({"q": {"dtype": "F32", "shape": [-2],
                               "data_offsets": [0, 8]}}, b"x" * 8))
  put("overflow", image({"q": {"dtype": "F64", "shape": [1 << 32, 1 << 32],
                               "data_offsets": [0, 8]}}, b"x" * 8))
  put("unknown_dtype", image({"q": {"dtype": "Q4", "shape": [2],
                                    "data_offsets": [0, 8]}}, b"x" * 8))
  put("metadata", image({"__metadata__": {"n": 1}}, b""))
  put("deep", image(b"[" * 2000 + b"]" * 2000, b""))
  index = {"metadata": {}, "weight_map": {"a": "model.safetensors",
                                          "b": "sub/part.safetensors"}}
  put("index_valid", json.dumps(index).encode(), mode=1)
  for i, name in enumerate(["/etc/passwd", "../secret", "out_link", "in_link",
                            "fifo", "sub", "up/secret", "", "a\0b",
                            "./sub/../model.safetensors"]):
    put(f"index_{i}", json.dumps({"weight_map": {"w": name}}).encode(), mode=1)


class Small(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.fc = torch.nn.Linear(4, 3)

  def forward(self, x):
    return torch.relu(self.fc(x))


def pt2_seeds(out):
  os.makedirs(out, exist_ok=True)
  torch.manual_seed(0)
  torch.set_num_threads(1)
  inputs = {"inputs": [{"name": "x", "shape": [2, 4], "dtype": "float32",
                        "kind": "normal"}], "outputs": ["output"]}
  ep = torch.export.export(Small().eval(), (torch.randn(2, 4),))
  buffer = io.BytesIO()
  torch.export.save(ep, buffer, extra_files={
      "config.json": json.dumps({"model_type": "small", "hidden_size": 4}),
      "tracecut_inputs.json": json.dumps(inputs)})
  good = buffer.getvalue()
  with open(os.path.join(out, "small.pt2"), "wb") as f:
    f.write(good)
  with open(os.path.join(out, "truncated.pt2"), "wb") as f:
    f.write(good[:len(good) // 2])

  def rewrite(name, change):
    with zipfile.ZipFile(io.BytesIO(good)) as z, zipfile.ZipFile(
        os.path.join(out, name), "w") as w:
      for info in z.infolist():
        data, kind = change(info.filename, z.read(info.filename))
        if kind is None:
          w.writestr(info, data)
        else:  # A fixed time: the same seeds every run.
          fixed = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0,
                                                            0))
          w.writestr(fixed, data, compress_type=kind)
  # A deflated member inflating far past the archive (1 MiB here; the test
  # uses 200 MB against the 64 MiB allowance).
  rewrite("deflated.pt2", lambda n, d: (d + b" " * (1 << 20),
                                        zipfile.ZIP_DEFLATED)
          if n.endswith("extra/config.json") else (d, None))
  # Regression seeds for the weights' tensor_meta (a fuzzed archive with
  # fewer strides than sizes once read past the strides: a SIGSEGV).
  def tensor_meta(change):
    def walk(j):
      if isinstance(j, dict):
        if "sizes" in j and "strides" in j and len(j["sizes"]) >= 2:
          change(j)
        for v in j.values():
          walk(v)
      elif isinstance(j, list):
        for v in j:
          walk(v)

    def edit(name, data):
      if not name.endswith("model_weights_config.json"):
        return data, None
      j = json.loads(data)
      walk(j)
      return json.dumps(j).encode(), None
    return edit
  rewrite("short_strides.pt2",
          tensor_meta(lambda m: m.update(strides=m["strides"][:1])))
  rewrite("negative_stride.pt2",
          tensor_meta(lambda m: m.update(strides=[{"as_int": -1}] * len(
              m["strides"]))))
  rewrite("overflow_sizes.pt2",
          tensor_meta(lambda m: m.update(sizes=[{"as_int": 1 << 62}] * len(
              m["sizes"]))))
  big = dict(inputs, inputs=[dict(inputs["inputs"][0], shape=[1000000,
                                                              1000000])])
  rewrite("huge_inputs.pt2", lambda n, d: (json.dumps(big).encode(), None)
          if n.endswith("extra/tracecut_inputs.json") else (d, None))


def inputs_seeds(out):
  os.makedirs(out, exist_ok=True)
  seeds = {
      "tokens": {"inputs": [{"name": "input_ids", "shape": [2, 16],
                             "dtype": "int64", "kind": "tokens",
                             "high": 256},
                            {"name": "attention_mask", "shape": [2, 16],
                             "dtype": "int64", "kind": "ones"}],
                 "outputs": ["logits"]},
      "image": {"inputs": [{"name": "pixel_values", "shape": [2, 3, 224, 224],
                            "dtype": "float32", "kind": "normal"}]},
      "huge": {"inputs": [{"name": "x", "shape": [1000000, 1000000]}]},
      "many": {"inputs": [{"name": f"x{i}", "shape": [1 << 20]}
                          for i in range(80)]},
      "empty_dim": {"inputs": [{"name": "x", "shape": [1 << 40, 0]}]},
  }
  for name, j in seeds.items():
    with open(os.path.join(out, name + ".json"), "w") as f:
      json.dump(j, f)


def main():
  out = sys.argv[1]
  safetensors_seeds(os.path.join(out, "safetensors"))
  pt2_seeds(os.path.join(out, "pt2"))
  inputs_seeds(os.path.join(out, "inputs"))


if __name__ == "__main__":
  main()
