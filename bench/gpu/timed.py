"""Runs one command and measures it (the GPU check, issue 33).

    timed.py --json FILE [--gpu=INDEX] -- COMMAND [ARG...]

Writes FILE (JSON) with the command, its exit status and:
  wall_s          wall-clock seconds (time.perf_counter around the child);
  peak_rss_bytes  the child's maximum resident set size: /usr/bin/time -v's
                  "Maximum resident set size" when /usr/bin/time exists,
                  else ru_maxrss of os.wait4 (the same kernel counter);
  rss_source      "/usr/bin/time -v" or "wait4";
  gpu             with --gpu and nvidia-smi on PATH: memory.used (MiB) and
                  utilization.gpu (%) sampled every 0.5 s while the command
                  runs (`nvidia-smi -lms 500`): before_mib (one reading just
                  before the start), peak_mib, peak_over_before_bytes, and
                  mean_util_pct over the samples.
The command's stdout and stderr are the caller's (run.sh sends them to the
step's log). FILE is written before the start (status "running") and again
at the end, so a step killed by `timeout` leaves what it knew. Exits with
the command's status.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def nvidia_smi_used(gpu):
  p = subprocess.run(
      ["nvidia-smi", f"--id={gpu}", "--query-gpu=memory.used",
       "--format=csv,noheader,nounits"], capture_output=True, text=True,
      timeout=20)
  return int(p.stdout.strip().splitlines()[0]) if p.returncode == 0 else None


class GpuSampler:
  """memory.used and utilization.gpu every 0.5 s from one nvidia-smi."""

  def __init__(self, gpu):
    self.samples = []  # (memory MiB, utilization %)
    self.before = nvidia_smi_used(gpu)
    self.proc = subprocess.Popen(
        ["nvidia-smi", f"--id={gpu}",
         "--query-gpu=memory.used,utilization.gpu",
         "--format=csv,noheader,nounits", "-lms", "500"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    self.thread = threading.Thread(target=self._read, daemon=True)
    self.thread.start()

  def _read(self):
    for line in self.proc.stdout:
      parts = [x.strip() for x in line.split(",")]
      try:
        self.samples.append((int(parts[0]), int(parts[1])))
      except (ValueError, IndexError):
        pass

  def stop(self):
    self.proc.terminate()
    try:
      self.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self.proc.kill()
    self.thread.join(timeout=5)
    if not self.samples:
      return {"before_mib": self.before, "samples": 0}
    peak = max(m for m, _ in self.samples)
    return {
        "before_mib": self.before,
        "peak_mib": peak,
        "peak_bytes": peak * 2**20,
        "peak_over_before_bytes": (peak - (self.before or 0)) * 2**20,
        "mean_util_pct": sum(u for _, u in self.samples) / len(self.samples),
        "samples": len(self.samples),
    }


def parse_time_v(text):
  rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
  return int(rss.group(1)) * 1024 if rss else None


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--json", required=True)
  ap.add_argument("--gpu", default=None)
  ap.add_argument("command", nargs=argparse.REMAINDER)
  a = ap.parse_args()
  cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
  if not cmd:
    ap.error("no command")

  result = {"command": cmd, "status": "running", "started": time.time()}

  def write():
    tmp = a.json + ".tmp"
    with open(tmp, "w") as f:
      json.dump(result, f, indent=1)
    os.replace(tmp, a.json)

  write()
  sampler = None
  if a.gpu is not None and shutil.which("nvidia-smi"):
    try:
      sampler = GpuSampler(a.gpu)
    except (OSError, subprocess.SubprocessError) as e:
      result["gpu_error"] = str(e)

  time_bin = "/usr/bin/time"
  use_time = os.access(time_bin, os.X_OK)
  time_out = None
  full = cmd
  if use_time:
    fd, time_out = tempfile.mkstemp(suffix=".time")
    os.close(fd)
    full = [time_bin, "-v", "-o", time_out] + cmd
  t0 = time.perf_counter()
  try:
    proc = subprocess.Popen(full)
  except OSError as e:
    result.update(status="failed", exit_code=127, error=str(e))
    write()
    return 127
  _, wait_status, usage = os.wait4(proc.pid, 0)
  proc.returncode = os.waitstatus_to_exitcode(wait_status)
  wall = time.perf_counter() - t0
  code = proc.returncode
  rss = None
  if use_time:
    text = open(time_out).read()
    os.remove(time_out)
    rss = parse_time_v(text)
    # time -v reports a child killed by a signal as "Command terminated by
    # signal N" and exits 128+N itself.
  if rss is None:
    rss = usage.ru_maxrss * 1024
    result["rss_source"] = "wait4"
  else:
    result["rss_source"] = "/usr/bin/time -v"
  result.update(status="ok" if code == 0 else "failed", exit_code=code,
                wall_s=wall, peak_rss_bytes=rss)
  if sampler:
    result["gpu"] = sampler.stop()
  write()
  return code if code >= 0 else 128 - code


if __name__ == "__main__":
  sys.exit(main())
