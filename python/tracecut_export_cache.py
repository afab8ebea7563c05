"""The export cache: a --meta export depends on the checkpoint's config,
custom code and safetensors layout (names, dtypes, shapes), on the exporter
and on the Python packages, never on the weights. An export of the same
inputs is kept under $TRACECUT_CACHE_DIR/export (default
${XDG_CACHE_HOME:-~/.cache}/tracecut/export), named by the SHA-256 of them,
and copied instead of importing torch and transformers again: a re-export,
or the export of another fine-tune of the same base model, takes
milliseconds. Errors are never cached: an export that fails leaves nothing.
Nothing here imports torch."""

import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import struct
import sys

from tracecut_export_errors import ExportError
from tracecut_export_layout import resolve_inside

_FORMAT = b"tracecut export cache 1\n"
_MAX_HEADER = 100_000_000  # checkpoint/safetensors_header.h's bound.


def cache_dir():
  root = os.environ.get("TRACECUT_CACHE_DIR")
  if not root:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    root = os.path.join(base, "tracecut")
  return os.path.join(root, "export")


def _add(h, label, data):
  """A labelled, length-prefixed field: no two inputs hash alike by
  shifting bytes from one field to the next."""
  if isinstance(data, str):
    data = data.encode()
  h.update(struct.pack("<Q", len(label)) + label.encode())
  h.update(struct.pack("<Q", len(data)) + data)


def _read_inside(source, name):
  path = resolve_inside(source, name, f"'{name}'")
  with open(path, "rb") as f:
    return f.read()


def _safetensors_header(source, name):
  path = resolve_inside(source, name, f"'{name}'")
  with open(path, "rb") as f:
    size = f.read(8)
    if len(size) != 8:
      raise ValueError("truncated")
    (n,) = struct.unpack("<Q", size)
    if n > _MAX_HEADER:
      raise ValueError("header too large")
    header = f.read(n)
    if len(header) != n:
      raise ValueError("truncated")
  return header


def _package(h, name):
  try:
    version = importlib.metadata.version(name)
    origin = importlib.util.find_spec(name).origin
    st = os.stat(origin)
  except Exception:  # pylint: disable=broad-except
    version, origin, st = "absent", "", None
  _add(h, f"package {name}", f"{version} {origin} "
       f"{st.st_size if st else 0} {st.st_mtime_ns if st else 0}")


def cache_key(source, batch, seq_len, class_name, dtype="float32"):
  """The SHA-256 of everything a --meta export of checkpoint directory
  `source` reads; None when it cannot be taken (not a directory, a file
  that cannot be read or escapes it): the export then runs, and reports
  what is wrong."""
  if not os.path.isdir(source):
    return None
  h = hashlib.sha256(_FORMAT)
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    for path in sorted(glob.glob(os.path.join(here, "tracecut_export*.py"))):
      with open(path, "rb") as f:
        _add(h, "exporter " + os.path.basename(path), f.read())
    _add(h, "python", sys.version)
    for name in ("torch", "transformers", "safetensors", "huggingface_hub"):
      _package(h, name)
    _add(h, "options", f"meta batch={batch} seq_len={seq_len} "
         f"class={class_name or ''}" +
         ("" if dtype == "float32" else f" dtype={dtype}"))
    names = sorted(os.listdir(source))
    for name in names:
      if name == "config.json" or name.endswith((".py", ".index.json")):
        _add(h, "file " + name, _read_inside(source, name))
      elif name.endswith(".safetensors"):
        _add(h, "header " + name, _safetensors_header(source, name))
  except (OSError, ValueError, ExportError):
    return None
  return h.hexdigest()


def fetch(key):
  """The cached export's bytes, or None."""
  if key is None:
    return None
  try:
    with open(os.path.join(cache_dir(), key + ".pt2"), "rb") as f:
      data = f.read()
  except OSError:
    return None
  return data if data[:4] == b"PK\x03\x04" else None


def store(key, output):
  """Keeps a copy of the export `output` under `key`; True when it did. A
  cache that cannot be written only means the next export runs again."""
  if key is None:
    return False
  directory = cache_dir()
  tmp = os.path.join(directory, f".{key}.{os.getpid()}.tmp")
  try:
    os.makedirs(directory, exist_ok=True)
    with open(output, "rb") as src, open(tmp, "wb") as dst:
      dst.write(src.read())
    os.replace(tmp, os.path.join(directory, key + ".pt2"))
    return True
  except OSError:
    try:
      os.remove(tmp)
    except OSError:
      pass
    return False
