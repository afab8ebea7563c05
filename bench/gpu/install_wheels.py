"""Installs the bundled wheels the device's Python lacks (the GPU check,
issue 33), without a network.

    install_wheels.py TARGET_DIR WHEELS_DIR [MORE_WHEELS_DIR...] [--unpack]

WHEELS_DIR is bench/gpu/out/bundle/wheels (bench/gpu/collect_wheels.py:
llm-compressor, compressed-tensors and their dependencies but torch,
transformers, triton and NVIDIA's CUDA packages; its MANIFEST.tsv lists
them all). bench/gpu/bundle.sh moves the large wheels of packages the device
image is known to have into bench/gpu/out/wheels-extra, which travels only
when carried too: a wheel is taken from whichever directory holds it.

Starting from llm-compressor and compressed-tensors at the bundled versions
(plus accelerate and datasets, which the exporter and the data need), each
requirement is looked up in the running interpreter: one the image already
satisfies is left alone (its dependencies are the image's business); one it
lacks, or holds at a version the requirement excludes, is installed from
the wheels and its own requirements followed; one no wheel here can meet is
reported as UNMET (exit status 1, after installing the rest). The chosen
wheels go into TARGET_DIR with `pip install --no-index --no-deps --target`
(or, without pip or with --unpack, unpacked as pip would), so the image's
torch and transformers stay what they are; put TARGET_DIR first on
PYTHONPATH to use them.

TARGET_DIR/.installed records what it was made from: a second run with the
same wheels does nothing. Run it without TARGET_DIR on PYTHONPATH.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOTS = ["accelerate", "datasets"]  # besides the two pinned ones below
PINNED_ROOTS = ["llmcompressor", "compressed-tensors"]


def read_manifest(dirs):
  """{name: (version, path or None where no directory holds the wheel)}."""
  rows = {}
  for line in open(os.path.join(dirs[0], "MANIFEST.tsv")):
    if line.startswith("#") or not line.strip():
      continue
    name, version, filename = line.split("\t")[:3]
    paths = [os.path.join(d, filename) for d in dirs
             if os.path.exists(os.path.join(d, filename))]
    rows[canonicalize_name(name)] = (version, paths[0] if paths else None)
  return rows


def wheel_requires(path, env=None):
  """The wheel's Requires-Dist whose markers hold in `env` (default: the
  running interpreter), extras off. bench/gpu/collect_wheels.py uses it
  with the device's environment."""
  with zipfile.ZipFile(path) as z:
    meta = next(n for n in z.namelist()
                if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
    text = z.read(meta).decode("utf-8", "replace")
  out = []
  for line in text.splitlines():
    if not line.strip():
      break  # the end of the headers
    if line.startswith("Requires-Dist:"):
      r = Requirement(line.split(":", 1)[1].strip())
      if r.marker is None or r.marker.evaluate(dict(env or {}, extra="")):
        out.append(r)
  return out


def installed_version(name):
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None


def choose(bundled):
  """(wheels to install, notes): a walk from the roots."""
  queue = [(Requirement(f"{n}=={bundled[n][0]}"), "(root)")
           for n in PINNED_ROOTS] + [(Requirement(n), "(root)") for n in ROOTS]
  chosen, notes, seen = {}, [], set()
  while queue:
    req, by = queue.pop(0)
    name = canonicalize_name(req.name)
    if name in chosen:
      if not req.specifier.contains(Version(chosen[name][0]),
                                    prereleases=True):
        notes.append(f"conflict: {name} {chosen[name][0]} (bundled) vs "
                     f"{req} from {by}")
      continue
    have = installed_version(name)
    if have is not None and req.specifier.contains(Version(have),
                                                   prereleases=True):
      if name not in seen:
        notes.append(f"image: {name} {have}")
      seen.add(name)
      continue
    if name not in bundled:
      notes.append(f"UNMET: {req} (from {by}); the image has "
                   f"{have or 'nothing'} and the bundle no wheel")
      continue
    version, path = bundled[name]
    if not req.specifier.contains(Version(version), prereleases=True):
      notes.append(f"UNMET: {req} (from {by}); bundled {version}")
      continue
    if path is None:
      notes.append(f"UNMET: {req} (from {by}); the image has "
                   f"{have or 'nothing'} and the wheel of {name} {version} "
                   "did not travel (bench/gpu/out/wheels-extra: carry it)")
      continue
    if have is not None:
      notes.append(f"replaced: the image's {name} {have} by {version} "
                   f"({req} from {by})")
    chosen[name] = (version, path)
    for r in wheel_requires(path):
      queue.append((r, name))
  return chosen, notes


def unpack(wheel, target):
  """A wheel's files into target, as `pip install --target` lays them out."""
  with zipfile.ZipFile(wheel) as z:
    z.extractall(target)
  for entry in os.listdir(target):
    if entry.endswith(".data") and os.path.isdir(os.path.join(target, entry)):
      data = os.path.join(target, entry)
      for kind in ("purelib", "platlib"):
        src = os.path.join(data, kind)
        if os.path.isdir(src):
          for f in os.listdir(src):
            shutil.move(os.path.join(src, f), os.path.join(target, f))
      shutil.rmtree(data)


def main():
  args = [a for a in sys.argv[1:] if a != "--unpack"]
  force_unpack = "--unpack" in sys.argv  # tests: the no-pip path
  target, dirs = args[0], [d for d in args[1:] if os.path.isdir(d)]
  if not dirs or not os.path.exists(os.path.join(dirs[0], "MANIFEST.tsv")):
    sys.exit(f"install_wheels: no MANIFEST.tsv in {args[1:2]}")
  manifest = open(os.path.join(dirs[0], "MANIFEST.tsv"), "rb").read()
  present = sorted(f for d in dirs for f in os.listdir(d))
  stamp = hashlib.sha256(manifest + sys.version.encode() +
                         "\n".join(present).encode()).hexdigest()
  marker = os.path.join(target, ".installed")
  if os.path.exists(marker) and json.load(open(marker)).get("stamp") == stamp:
    print(f"install_wheels: {target} is up to date")
    return 0
  bundled = read_manifest(dirs)
  chosen, notes = choose(bundled)
  for n in notes:
    print("install_wheels:", n)
  shutil.rmtree(target, ignore_errors=True)
  os.makedirs(target)
  files = [path for _, path in sorted(chosen.values(), key=lambda v: v[1])]
  print(f"install_wheels: installing {len(files)} wheels into {target}: "
        + ", ".join(f"{n} {v[0]}" for n, v in sorted(chosen.items())),
        flush=True)
  pip = subprocess.run([sys.executable, "-m", "pip", "--version"],
                       capture_output=True)
  if not files:
    pass
  elif pip.returncode == 0 and not force_unpack:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                    "--no-index", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", target]
                   + files, check=True)
  else:
    print("install_wheels: no pip; unpacking the wheels")
    for f in files:
      unpack(f, target)
  with open(marker, "w") as f:
    json.dump({"stamp": stamp, "installed": {n: v[0] for n, v in
                                             chosen.items()},
               "notes": notes}, f, indent=1)
  unmet = [n for n in notes if n.startswith("UNMET")]
  return 1 if unmet else 0


if __name__ == "__main__":
  sys.exit(main())
