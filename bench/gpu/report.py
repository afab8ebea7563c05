"""The GPU check's environment record and results table (issue 33).

    report.py env RESULTS_DIR        writes RESULTS_DIR/env.json
    report.py table RESULTS_DIR      writes results.json and results.md
                                     there and prints the table

`env`: Python, torch (and its CUDA), transformers, llm-compressor,
compressed-tensors (...) versions as the run's Python sees them (PYTHONPATH
included; read from the installed metadata, not imported), the GPU per torch.cuda and nvidia-smi (name, driver, memory),
CPU count and host memory.

`table` reads what bench/gpu/run.sh left in RESULTS_DIR: steps.tsv (each
step's exit status, seconds and timeout), NAME.time.json from timed.py
(wall, peak host RSS, nvidia-smi samples), tracecut's calibrate report
(tracecut_report.json; its device_peak_bytes, found wherever it sits in the
report), llm-compressor's llmc_result.json (torch.cuda peaks) and
quality.json (logit errors). A tool that failed or timed out keeps its row,
with the reason and the last lines of its log.
"""

import json
import os
import platform
import subprocess
import sys
import time

GIB = 2**30


def load_json(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def version_of(distribution):
  """The installed version (PYTHONPATH included), without importing it:
  importing llm-compressor takes as long as the rest of this step."""
  from importlib import metadata
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return "not installed"


def collect_env(results):
  env = {"python": platform.python_version(), "machine": platform.machine(),
         "cpus": os.cpu_count(), "time_utc": time.strftime(
             "%Y-%m-%d %H:%M:%S", time.gmtime())}
  try:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    env["host_memory_gib"] = round(pages / GIB, 1)
  except (ValueError, OSError):
    pass
  for key, dist in (("torch", "torch"), ("transformers", "transformers"),
                    ("llmcompressor", "llmcompressor"),
                    ("compressed_tensors", "compressed-tensors"),
                    ("accelerate", "accelerate"), ("datasets", "datasets"),
                    ("numpy", "numpy"), ("pyarrow", "pyarrow")):
    env[key] = version_of(dist)
  try:
    import torch
    env["torch_cuda"] = torch.version.cuda
    env["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
      env["torch_gpu"] = torch.cuda.get_device_name()
      env["gpu_capability"] = ".".join(
          map(str, torch.cuda.get_device_capability()))
  except Exception as e:
    env["torch_error"] = str(e)
  try:
    p = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
         "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    if p.returncode == 0:
      env["nvidia_smi"] = p.stdout.strip().splitlines()
  except (OSError, subprocess.SubprocessError):
    env["nvidia_smi"] = None
  with open(os.path.join(results, "env.json"), "w") as f:
    json.dump(env, f, indent=1)
  print("env:", json.dumps(env))


def find_all(obj, key):
  """Every value of `key` anywhere in nested dicts and lists."""
  if isinstance(obj, dict):
    found = [obj[key]] if key in obj else []
    values = obj.values()
  elif isinstance(obj, list):
    found, values = [], obj
  else:
    return []
  for v in values:
    found += find_all(v, key)
  return found


def tracecut_device_peak(report):
  """The calibrate report's run.device_peak_bytes (the caching allocator's
  peak since the start), else the largest one anywhere in it."""
  run = (report or {}).get("run") or {}
  if isinstance(run.get("device_peak_bytes"), (int, float)):
    return run["device_peak_bytes"]
  values = [v for v in find_all(report, "device_peak_bytes")
            if isinstance(v, (int, float))]
  return max(values) if values else None


def read_steps(results):
  steps = {}
  path = os.path.join(results, "steps.tsv")
  if os.path.exists(path):
    for line in open(path):
      parts = line.rstrip("\n").split("\t")
      if len(parts) >= 4 and parts[0] != "step":
        steps[parts[0]] = {"rc": int(parts[1]), "seconds": int(parts[2]),
                           "timeout_s": int(parts[3]),
                           "note": parts[4] if len(parts) > 4 else ""}
  return steps


def log_tail(results, step, lines=8):
  path = os.path.join(results, f"{step}.log")
  if not os.path.exists(path):
    return ""
  text = open(path, errors="replace").read().splitlines()
  keep = [l for l in text if l.strip() and "%|" not in l]  # no tqdm bars
  return "\n".join(keep[-lines:])


def step_outcome(step):
  if step is None:
    return "not run"
  if step["note"]:
    return step["note"]
  if step["rc"] == 0:
    return "ok"
  if step["rc"] in (124, 137):
    return f"timed out after {step['timeout_s']} s"
  return f"failed (exit {step['rc']})"


def tool_row(results, steps, name, step, quality, device_peak, extra):
  timing = load_json(os.path.join(results, f"{step}.time.json")) or {}
  gpu = timing.get("gpu") or {}
  q = (quality or {}).get("models", {}).get(name, {})
  row = {
      "tool": name,
      "outcome": step_outcome(steps.get(step)),
      "wall_s": timing.get("wall_s") if timing.get("status") == "ok" else None,
      "peak_host_rss_bytes": timing.get("peak_rss_bytes"),
      "rss_source": timing.get("rss_source"),
      "peak_device_bytes": device_peak,
      "nvidia_smi_peak_bytes": gpu.get("peak_bytes"),
      "nvidia_smi_peak_over_before_bytes": gpu.get("peak_over_before_bytes"),
      "gpu_mean_util_pct": gpu.get("mean_util_pct"),
      "logit_error": q.get("relative_error"),
      "logit_error_note": q.get("error"),
  }
  row.update(extra)
  if row["outcome"] != "ok":
    row["log_tail"] = log_tail(results, step)
  return row


def fmt(v, scale=1.0, digits=2):
  return "-" if v is None else f"{v / scale:.{digits}f}"


def table(results):
  steps = read_steps(results)
  env = load_json(os.path.join(results, "env.json")) or {}
  model = load_json(os.path.join(results, "model.json")) or {}
  quality = load_json(os.path.join(results, "quality.json"))
  ours_report = load_json(os.path.join(results, "tracecut_report.json"))
  ours_peak = tracecut_device_peak(ours_report)
  ours_run = (ours_report or {}).get("run") or {}
  theirs = load_json(os.path.join(results, "llmc_result.json")) or {}
  export = load_json(os.path.join(results, "export.time.json")) or {}
  rows = [
      tool_row(results, steps, "tracecut", "tracecut", quality, ours_peak, {
          "device_peak_source": ("tracecut report device_peak_bytes"
                                 if ours_peak is not None else None),
          "export_s": export.get("wall_s") if export.get("status") == "ok"
                      else None,
          "export_outcome": step_outcome(steps.get("export")),
          "calibration_s": ours_run.get("total_seconds"),
          "device": ours_run.get("device"),
      }),
      tool_row(results, steps, "llm-compressor", "llmcompressor", quality,
               theirs.get("device_peak_allocated_bytes"), {
                   "device_peak_source": (
                       "torch.cuda.max_memory_allocated"
                       if theirs.get("device_peak_allocated_bytes") is not None
                       else None),
                   "device_peak_reserved_bytes":
                       theirs.get("device_peak_reserved_bytes"),
                   "oneshot_s": theirs.get("oneshot_s"),
                   "calibration_s": theirs.get("oneshot_s"),
                   "save_s": theirs.get("save_s"),
                   "load_s": theirs.get("load_s"),
                   "load": theirs.get("load"),
                   "device": theirs.get("device"),
               }),
  ]
  # Without tracecut's own number, nvidia-smi's peak (less the reading
  # before the start) stands in for both, so that they compare.
  for r in rows:
    if r["peak_device_bytes"] is None and \
        r["nvidia_smi_peak_over_before_bytes"] is not None:
      r["peak_device_bytes"] = r["nvidia_smi_peak_over_before_bytes"]
      r["device_peak_source"] = "nvidia-smi memory.used peak - before"
  gpu = env.get("torch_gpu") or (env.get("nvidia_smi") or ["no GPU"])[0]
  out = {"env": env, "model": model, "steps": steps, "rows": rows}
  with open(os.path.join(results, "results.json"), "w") as f:
    json.dump(out, f, indent=1)

  shape = (f"Llama {model.get('size', '?')}: hidden {model.get('hidden_size')}, "
           f"{model.get('num_hidden_layers')} layers, "
           f"{model.get('num_attention_heads')}/"
           f"{model.get('num_key_value_heads')} heads, intermediate "
           f"{model.get('intermediate_size')}, vocab "
           f"{model.get('vocab_size')}, bf16 "
           f"({fmt(model.get('checkpoint_bytes'), GIB)} GiB)")
  lines = [
      "# GPU check: GPTQ W4A16 g128, tracecut vs llm-compressor", "",
      f"{shape}; calibration {model.get('nsamples')} x {model.get('seqlen')} "
      f"seeded token ids, held-out {model.get('held')}.", "",
      f"GPU: {gpu}; torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
      f"transformers {env.get('transformers')}, llm-compressor "
      f"{env.get('llmcompressor')}, compressed-tensors "
      f"{env.get('compressed_tensors')}, Python {env.get('python')}, "
      f"{env.get('cpus')} CPUs, {env.get('host_memory_gib')} GiB; "
      f"{env.get('time_utc')} UTC.", "",
      "| tool | outcome | wall s | calibration s | peak host RSS GiB | "
      "peak device GiB | nvidia-smi peak GiB | mean GPU util % | "
      "logit error |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    err = fmt(r["logit_error"], digits=4)
    if r["logit_error"] is None and r["logit_error_note"]:
      err = "load failed"
    lines.append(
        f"| {r['tool']} | {r['outcome']} | {fmt(r['wall_s'], digits=1)} | "
        f"{fmt(r.get('calibration_s'), digits=1)} | "
        f"{fmt(r['peak_host_rss_bytes'], GIB)} | "
        f"{fmt(r['peak_device_bytes'], GIB)} | "
        f"{fmt(r['nvidia_smi_peak_bytes'], GIB)} | "
        f"{fmt(r['gpu_mean_util_pct'], digits=0)} | {err} |")
  ours, theirs_row = rows
  lines += [
      "",
      "wall s: the whole process (timed.py); calibration s: tracecut's "
      "report run.total_seconds, llm-compressor's `oneshot` call.",
      f"tracecut wall is `calibrate` alone; `tracecut export --meta` took "
      f"{fmt(ours['export_s'], digits=1)} s ({ours['export_outcome']}). "
      f"llm-compressor wall is its whole process (import, load "
      f"{fmt(theirs_row.get('load_s'), digits=1)} s to {theirs_row.get('load')}, "
      f"oneshot {fmt(theirs_row.get('oneshot_s'), digits=1)} s, save "
      f"{fmt(theirs_row.get('save_s'), digits=1)} s).",
      f"Devices: tracecut's report says {ours.get('device') or '-'}, "
      f"llm-compressor ran on {theirs_row.get('device') or '-'}.",
      f"Peak device: tracecut from {ours['device_peak_source'] or '-'}; "
      f"llm-compressor from {theirs_row['device_peak_source'] or '-'} "
      f"(reserved {fmt(theirs_row.get('device_peak_reserved_bytes'), GIB)} "
      f"GiB). nvidia-smi peak: memory.used sampled every 0.5 s "
      f"(whole GPU).",
      "",
      "| step | outcome | seconds | timeout s |", "|---|---|---|---|",
  ]
  for name, s in steps.items():
    lines.append(f"| {name} | {step_outcome(s)} | {s['seconds']} | "
                 f"{s['timeout_s']} |")
  for r in rows:
    if r.get("log_tail"):
      lines += ["", f"{r['tool']} ({r['outcome']}), last lines of its log:",
                "", "```", r["log_tail"], "```"]
    if r.get("logit_error_note"):
      lines += ["", f"{r['tool']} output could not be evaluated: "
                f"{r['logit_error_note']}"]
  text = "\n".join(lines) + "\n"
  with open(os.path.join(results, "results.md"), "w") as f:
    f.write(text)
  print(text)


def main():
  what, results = sys.argv[1:3]
  if what == "env":
    collect_env(results)
  elif what == "table":
    table(results)
  else:
    sys.exit(f"report.py: unknown command {what}")


if __name__ == "__main__":
  main()
