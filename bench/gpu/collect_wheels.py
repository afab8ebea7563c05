"""Downloads the Python wheels the GPU check installs on the device (issue 33).

    collect_wheels.py LOCK CACHE_DIR DEST_DIR

Run by bench/gpu/bundle.sh with the project's Python (it has pip and
`packaging`). The device image has CPython 3.12 with torch and transformers
but no network, so the wheels of llm-compressor and compressed-tensors and of
everything they (and tracecut's exporter) need that is not torch,
transformers, triton or NVIDIA's CUDA packages are fetched here: starting
from ROOTS, each wheel is downloaded without its dependencies (`pip download
--no-deps` for CPython 3.12 on manylinux x86_64), its METADATA's
Requires-Dist is read (markers evaluated for that platform, extras off) and
every requirement is followed in turn. A project pinned in LOCK
(third_party/python/requirements.lock) is taken at the lock's version with
the lock's hashes (`--require-hashes`); any other at the newest version pip
finds for the requirement (listed as "unpinned" in the manifest).

Wheels are cached in CACHE_DIR (a re-run downloads nothing: the choices are
remembered in CACHE_DIR/resolved.json) and copied to DEST_DIR with
MANIFEST.tsv (name, version, file, sha256, pinned|unpinned, required by).
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from install_wheels import wheel_requires

# What the exporter and the two calibrations import beyond the image's torch
# and transformers: llm-compressor pins compressed-tensors; accelerate is the
# exporter's (`tracecut export --meta`) and datasets feeds oneshot.
ROOTS = ["llmcompressor", "compressed-tensors", "accelerate", "datasets",
         "safetensors"]

# The device image provides these (torch 2.11 with its CUDA 13 runtime and
# transformers 5.17); they are never bundled. nvidia-ml-py (pynvml, which
# llm-compressor imports) is not part of the CUDA runtime and is.
SKIP_PREFIXES = ("nvidia-", "cuda-")
KEEP = {"nvidia-ml-py"}
SKIP = {"torch", "transformers", "triton", "torchvision", "torchaudio"}

# pip does not widen a --platform to the older manylinux tags it implies, so
# they are listed: glibc 2.28 (torch's own wheel needs that much) and older.
PLATFORM_ARGS = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation",
    "cp", "--abi", "cp312",
] + [a for minor in range(28, 4, -1)
     for a in ("--platform", f"manylinux_2_{minor}_x86_64")] + [
    "--platform", "manylinux2014_x86_64", "--platform",
    "manylinux2010_x86_64", "--platform", "manylinux1_x86_64",
]

# Marker environment of the device: CPython 3.12 on Linux x86_64.
MARKER_ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.0",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": "3.12.0",
    "python_version": "3.12",
    "sys_platform": "linux",
    "extra": "",
}


def normalize(name):
  return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path):
  """{normalized name: (version, [sha256, ...])} from a pip-compile lock."""
  pins, current = {}, None
  for line in open(path):
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
    if m:
      current = normalize(m.group(1))
      pins[current] = (m.group(2), [])
      continue
    h = re.search(r"--hash=sha256:([0-9a-f]{64})", line)
    if h and current:
      pins[current][1].append(h.group(1))
    elif not line.startswith(" "):
      current = None
  return pins


def sha256(path):
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def wheel_name_version(filename):
  parts = filename[:-len(".whl")].split("-")
  return normalize(parts[0]), parts[1]


def find_cached(cache, name, version):
  for f in sorted(os.listdir(cache)):
    if f.endswith(".whl") and wheel_name_version(f) == (name, version):
      return os.path.join(cache, f)
  return None


def pip_download(cache, requirement_lines, require_hashes):
  req = os.path.join(cache, ".req.txt")
  with open(req, "w") as f:
    f.write("\n".join(requirement_lines) + "\n")
  before = set(os.listdir(cache))
  cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "-d", cache, "-r", req] + PLATFORM_ARGS
  if require_hashes:
    cmd.append("--require-hashes")
  subprocess.run(cmd, check=True)
  os.remove(req)
  new = [f for f in set(os.listdir(cache)) - before if f.endswith(".whl")]
  return new


def main():
  lock_path, cache, dest = sys.argv[1:4]
  os.makedirs(cache, exist_ok=True)
  pins = read_lock(lock_path)
  resolved_path = os.path.join(cache, "resolved.json")
  resolved = (json.load(open(resolved_path))
              if os.path.exists(resolved_path) else {})
  queue = [(Requirement(r), "(root)") for r in ROOTS]
  chosen = {}  # name -> (wheel path, pinned, required by)
  while queue:
    req, by = queue.pop(0)
    name = normalize(req.name)
    if name in SKIP or (name.startswith(SKIP_PREFIXES) and name not in KEEP):
      continue
    if name in chosen:
      version = wheel_name_version(os.path.basename(chosen[name][0]))[1]
      if req.specifier and not req.specifier.contains(Version(version),
                                                      prereleases=True):
        sys.exit(f"collect_wheels: {name} {version} does not satisfy "
                 f"{req} (required by {by})")
      continue
    if name in pins:
      version, hashes = pins[name]
      if req.specifier and not req.specifier.contains(Version(version),
                                                      prereleases=True):
        sys.exit(f"collect_wheels: the lock's {name}=={version} does not "
                 f"satisfy {req} (required by {by})")
      wheel = find_cached(cache, name, version)
      if wheel is None or sha256(wheel) not in hashes:
        if wheel:
          os.remove(wheel)
        line = f"{name}=={version} " + " ".join(
            f"--hash=sha256:{h}" for h in hashes)
        pip_download(cache, [line], require_hashes=True)
        wheel = find_cached(cache, name, version)
      pinned = True
    else:
      key = f"{name}{req.specifier}"
      wheel = (os.path.join(cache, resolved[key])
               if key in resolved else None)
      if wheel is None or not os.path.exists(wheel):
        new = pip_download(cache, [f"{name}{req.specifier}"],
                           require_hashes=False)
        got = [f for f in new if wheel_name_version(f)[0] == name]
        wheel = (os.path.join(cache, got[0]) if got else None)
        if wheel is None:  # already there from an earlier run
          cands = [f for f in os.listdir(cache) if f.endswith(".whl") and
                   wheel_name_version(f)[0] == name and
                   SpecifierSet(str(req.specifier)).contains(
                       Version(wheel_name_version(f)[1]), prereleases=True)]
          wheel = os.path.join(cache, max(
              cands, key=lambda f: Version(wheel_name_version(f)[1])))
        resolved[key] = os.path.basename(wheel)
        json.dump(resolved, open(resolved_path, "w"), indent=1,
                  sort_keys=True)
      pinned = False
    if wheel is None:
      sys.exit(f"collect_wheels: no wheel for {req} (required by {by})")
    chosen[name] = (wheel, pinned, by)
    for r in wheel_requires(wheel, MARKER_ENV):
      queue.append((r, name))

  os.makedirs(dest, exist_ok=True)
  rows = []
  for name in sorted(chosen):
    wheel, pinned, by = chosen[name]
    shutil.copy2(wheel, dest)
    version = wheel_name_version(os.path.basename(wheel))[1]
    rows.append("\t".join([name, version, os.path.basename(wheel),
                           sha256(wheel), "pinned" if pinned else "unpinned",
                           by]))
  with open(os.path.join(dest, "MANIFEST.tsv"), "w") as f:
    f.write("# name\tversion\tfile\tsha256\tlock\trequired_by\n")
    f.write("\n".join(rows) + "\n")
  unpinned = [r.split("\t")[0] for r in rows if "\tunpinned\t" in r]
  print(f"collect_wheels: {len(rows)} wheels in {dest}"
        + (f" (not in the lock, newest taken: {', '.join(unpinned)})"
           if unpinned else " (all at the lock's versions)"))


if __name__ == "__main__":
  main()
