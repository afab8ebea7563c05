"""LLM-scale streaming calibration: tracecut against llm-compressor's
`oneshot` on one generated multi-GB Llama checkpoint, in one run (issue 15).

    tools/python bench/streaming_bench.py TRACECUT [--dir=/tmp/tracecut-stream-bench]
        [--layers=44] [--samples=16] [--seq-len=128] [--no-full-load]
        [--results=bench/RESULTS.md]

TRACECUT is a `-c opt` build of //tools:tracecut. In order, one process at a
time (memory is the measured quantity):

  1. a LlamaForCausalLM (hidden 2048, intermediate 5632, 16 heads, 8 kv
     heads, vocab 32000, --layers layers, seeded random weights, bf16) saved
     as sharded safetensors under --dir (kept between runs), then
     `tracecut export CKPT --meta -o CKPT/model.pt2` (timed on its own);
  2. one calibration set: --samples x --seq-len random token ids (seed 0),
     torch.save'd for `tracecut calibrate --data` and handed to llm-compressor
     as a datasets.Dataset of input_ids/attention_mask;
  3. `tracecut calibrate CKPT --recipe=GPTQ W4 g128 symmetric` (weights
     streamed), then the same with --stream-weights=false (--no-full-load
     skips it);
  4. llm-compressor `oneshot` on CPU: GPTQModifier(targets="Linear",
     scheme="W4A16", ignore=["lm_head"]), the same samples, sequential
     pipeline, saved compressed;
every tool under `/usr/bin/time -v` as its own process (wall clock, maximum
resident set size). Then the memory model of issue 15 (largest subgraph's
fp32 weights + its Linears' Hessians + the activation cache's peak) and the
verdicts, a check of tracecut's output directory (config.json's
quantization_config, the shard index, every quantized Linear present), and
the section "LLM-scale streaming calibration (issue 15)" of --results,
replaced in place (and bench/streaming_bench.md, which bench/report.py
includes when it rewrites RESULTS.md).

Time: both tools spend 1.5 to 2.5 minutes per decoder layer of this shape on
2 busy cores (GPTQ's compression dominates; fewer samples barely help), so
the default 44 layers (4.4 GB) is a 1.5-2 hour run there; --layers=6 took 25
minutes. --render-only rewrites the section from the logs a run left in --dir.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 2048, 5632, 16, 8, 32000
SECTION = "## LLM-scale streaming calibration (issue 15)"

RECIPE = """# GPTQ W4 (symmetric, groups of 128) on every Linear but the LM head.
modifiers {
  gptq {
    scheme { bits: 4 symmetric: true group_size: 128 }
    targets: "Linear"
    ignore: "lm_head"
  }
}
pipeline: SEQUENTIAL
"""


def config_kwargs(layers):
  return dict(vocab_size=VOCAB, hidden_size=HIDDEN,
              intermediate_size=INTERMEDIATE, num_hidden_layers=layers,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
              max_position_embeddings=2048, tie_word_embeddings=False)


def generate(ckpt, layers):
  """Child process: writes the checkpoint (bf16, seeded)."""
  import torch
  import transformers
  torch.manual_seed(0)
  config = transformers.LlamaConfig(**config_kwargs(layers))
  config.torch_dtype = torch.bfloat16
  torch.set_default_dtype(torch.bfloat16)
  model = transformers.LlamaForCausalLM(config).eval()
  tmp = ckpt + ".tmp"
  model.save_pretrained(tmp, max_shard_size="1GB")
  save_tokenizer(tmp)
  os.rename(tmp, ckpt)


def save_tokenizer(ckpt):
  """A word-level tokenizer over the vocabulary ("t0" ... ): llm-compressor
  needs a processor even for tokenized data; tracecut copies it through."""
  import tokenizers
  import transformers
  vocab = {f"t{i}": i for i in range(VOCAB)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2",
      pad_token="t0").save_pretrained(ckpt)


def llmcompressor_run(ckpt, data, out):
  """Child process: llm-compressor's oneshot on the same samples."""
  import torch
  from datasets import Dataset
  from llmcompressor import oneshot
  from llmcompressor.modifiers.quantization import GPTQModifier
  ids = torch.load(data)
  ds = Dataset.from_dict({
      "input_ids": ids.tolist(),
      "attention_mask": torch.ones_like(ids).tolist()})
  t0 = time.perf_counter()
  model = oneshot(
      model=ckpt, dataset=ds,
      recipe=GPTQModifier(targets="Linear", scheme="W4A16",
                          ignore=["lm_head"]),
      max_seq_length=ids.shape[1], num_calibration_samples=ids.shape[0],
      shuffle_calibration_samples=False, pipeline="sequential")
  t1 = time.perf_counter()
  model.save_pretrained(out, save_compressed=True)
  t2 = time.perf_counter()
  print(json.dumps({"oneshot_s": t1 - t0, "save_s": t2 - t1}))


def timed_run(cmd, log, render_only=False):
  """Runs cmd under /usr/bin/time -v: (wall s, max RSS bytes, stdout, error).
  render_only: reads what an earlier run left in `log` instead."""
  if render_only:
    if not os.path.exists(log):
      return None
    stdout, err = "", open(log).read()
    code = re.search(r"Exit status: (\d+)", err)
    return parse_time_log(err, int(code.group(1)) if code else 1, stdout)
  with open(log, "w") as f:
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, stdout=subprocess.PIPE,
                       stderr=f, text=True)
  return parse_time_log(open(log).read(), p.returncode, p.stdout)


def parse_time_log(err, returncode, stdout):
  rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
  wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)",
                   err)
  if returncode != 0 or not rss or not wall:
    tail = "\n".join(
        l for l in err.splitlines()[-40:]
        if not l.startswith("\t"))[-1500:]
    return None, None, stdout, f"exit {returncode}: {tail}"
  h, m, s = wall.groups()
  secs = int(h or 0) * 3600 + int(m) * 60 + float(s)
  return secs, int(rss.group(1)) * 1024, stdout, None


def gib(b):
  return f"{b / 2**30:.2f} GiB"


def memory_model(layers, cache_peak):
  """Issue 15's target: largest subgraph's fp32 weights + Hessians + cache."""
  kv = KV_HEADS * HIDDEN // HEADS
  linears = {  # name: (in, out)
      "q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, kv),
      "v_proj": (HIDDEN, kv), "o_proj": (HIDDEN, HIDDEN),
      "gate_proj": (HIDDEN, INTERMEDIATE), "up_proj": (HIDDEN, INTERMEDIATE),
      "down_proj": (INTERMEDIATE, HIDDEN)}
  layer_params = sum(i * o for i, o in linears.values()) + 2 * HIDDEN
  layer_hessians = sum(i * i for i, _ in linears.values()) * 4
  embed = VOCAB * HIDDEN
  # The last decoder layer's subgraph also holds the final norm and lm_head
  # (ignored: no Hessian).
  head = VOCAB * HIDDEN + HIDDEN
  # The head's Linear is ignored (no Hessian); the embedding has none.
  layer_total = layer_params * 4 + layer_hessians
  largest = max(layer_total + head * 4, embed * 4)
  total = largest + cache_peak
  return {"layer_params": layer_params, "layer_fp32": layer_params * 4,
          "hessians": layer_hessians, "layer_total": layer_total,
          "embed_fp32": embed * 4, "head_fp32": head * 4,
          "largest": largest, "cache": cache_peak, "total": total,
          # The model's parameters over the largest subgraph's: how much
          # less than the whole model streaming should hold.
          "factor": (layers * layer_params + embed + head) /
                    (layer_params + head),
          "target": 1.5 * total}


def check_output(out, layers):
  """tracecut's directory: quantization_config and every packed Linear."""
  cfg = json.load(open(os.path.join(out, "config.json")))
  q = cfg.get("quantization_config")
  problems = []
  if not q or q.get("quant_method") != "compressed-tensors":
    problems.append(f"quantization_config: {q}")
  names = set()
  idx = os.path.join(out, "model.safetensors.index.json")
  if os.path.exists(idx):
    names = set(json.load(open(idx))["weight_map"])
    for f in set(json.load(open(idx))["weight_map"].values()):
      if not os.path.exists(os.path.join(out, f)):
        problems.append(f"missing shard {f}")
  else:
    from safetensors import safe_open
    for f in os.listdir(out):
      if f.endswith(".safetensors"):
        with safe_open(os.path.join(out, f), "pt") as s:
          names |= set(s.keys())
  expected = [f"model.layers.{i}.{m}.weight_packed" for i in range(layers)
              for m in ("self_attn.q_proj", "self_attn.k_proj",
                        "self_attn.v_proj", "self_attn.o_proj",
                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
  missing = [n for n in expected if n not in names]
  for n in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
    if n not in names:
      missing.append(n)
  if missing:
    problems.append(f"{len(missing)} tensors missing, e.g. {missing[:3]}")
  groups = q.get("config_groups", {}) if q else {}
  w = next(iter(groups.values()), {}).get("weights", {})
  return problems, {"names": len(names), "weights": w,
                    "format": q.get("format") if q else None}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("pos", nargs="+", metavar="TRACECUT")
  ap.add_argument("--dir", default="/tmp/tracecut-stream-bench")
  ap.add_argument("--layers", type=int, default=44)
  ap.add_argument("--samples", type=int, default=16)
  ap.add_argument("--seq-len", type=int, default=128)
  ap.add_argument("--no-full-load", action="store_true")
  ap.add_argument("--skip-llmc", action="store_true")
  ap.add_argument("--render-only", action="store_true",
                  help="write the section from the logs a run left in --dir")
  ap.add_argument("--results", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"))
  ap.add_argument("--child", choices=["generate", "llmc", "tokenizer"])
  a = ap.parse_args()
  if a.child == "generate":
    return generate(a.pos[0], a.layers)
  if a.child == "tokenizer":
    return save_tokenizer(a.pos[0])
  if a.child == "llmc":
    return llmcompressor_run(*a.pos)

  import torch
  tracecut = os.path.abspath(a.pos[0])
  os.makedirs(a.dir, exist_ok=True)
  me = [sys.executable, os.path.abspath(__file__)]
  env_threads = os.environ.get("OMP_NUM_THREADS", "(unset)")
  ckpt = os.path.join(a.dir, f"llama_{a.layers}l_bf16")
  log = lambda name: os.path.join(a.dir, name + ".time.log")
  rows = {}

  def step(msg):
    print(f"[{datetime.datetime.utcnow():%H:%M:%S}] {msg}", file=sys.stderr,
          flush=True)

  if not os.path.exists(os.path.join(ckpt, "config.json")):
    step(f"generating {ckpt}")
    subprocess.run(me + ["--child=generate", f"--layers={a.layers}", ckpt],
                   check=True)
  if not os.path.exists(os.path.join(ckpt, "tokenizer.json")):
    subprocess.run(me + ["--child=tokenizer", ckpt], check=True)
  ckpt_bytes = sum(os.path.getsize(os.path.join(ckpt, f))
                   for f in os.listdir(ckpt) if f.endswith(".safetensors"))
  pt2 = os.path.join(ckpt, "model.pt2")
  R = a.render_only
  if os.path.exists(pt2) and not R:
    os.remove(pt2)
  step("tracecut export --meta")
  rows["export"] = timed_run([tracecut, "export", ckpt, "--meta", "-o", pt2],
                             log("export"), R)

  data = os.path.join(a.dir, f"calib_{a.samples}x{a.seq_len}.pt")
  recipe = os.path.join(a.dir, "gptq_w4g128.textproto")
  if not R:
    g = torch.Generator().manual_seed(0)
    torch.save(torch.randint(0, VOCAB, (a.samples, a.seq_len), generator=g,
                             dtype=torch.int64), data)
    open(recipe, "w").write(RECIPE)

  def tracecut_calibrate(name, extra):
    out = os.path.join(a.dir, f"out_{name}")
    report = os.path.join(a.dir, f"report_{name}.json")
    if not R:
      subprocess.run(["rm", "-rf", out, out + ".pt.run", out + ".run"])
    step(f"tracecut calibrate ({name})")
    cmd = [tracecut, "calibrate", ckpt, "-o", out, f"--recipe={recipe}",
           f"--data={data}", f"--report={report}"] + extra
    r = timed_run(cmd, log(name), R)
    rows[name] = r + (out, report, " ".join(cmd)) if r else None

  tracecut_calibrate("tracecut_stream", [])
  if not a.no_full_load:
    tracecut_calibrate("tracecut_full", ["--stream-weights=false"])
  llmc_out = os.path.join(a.dir, "out_llmcompressor")
  if not R:
    subprocess.run(["rm", "-rf", llmc_out])
  if not a.skip_llmc:
    step("llm-compressor oneshot")
    rows["llmc"] = timed_run(me + ["--child=llmc", ckpt, data, llmc_out],
                             log("llmc"), R)
  step("done; writing results")

  # Memory model, with the cache's peak from tracecut's report.
  s = rows["tracecut_stream"]
  cache_peak, cache_budget = 0, None
  if s[0] is not None:
    rep = json.load(open(s[5]))
    cache = rep.get("run", {}).get("cache", {})
    cache_peak = int(cache.get("peak_bytes_held", 0))
    cache_budget = cache.get("budget_bytes")
  mm = memory_model(a.layers, cache_peak)

  def cell(r):
    if r is None:
      return "not run", "not run"
    if r[0] is None:
      return "failed", "failed"
    return f"{r[0]:.0f} s", gib(r[1])

  lines = [SECTION, ""]
  now = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
  load = open("/proc/loadavg").read().split()[:3]
  mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  lines += [
      f"`bench/streaming_bench.py`, {now}; {os.cpu_count()} cores, "
      f"{gib(mem)} RAM shared with other processes (load average at the end "
      f"{' '.join(load)}), OMP_NUM_THREADS={env_threads}. Wall clock and "
      "maximum resident set size from `/usr/bin/time -v`, each tool its own "
      "process, one after the other.", "",
      f"Checkpoint: LlamaForCausalLM, {a.layers} layers, hidden {HIDDEN}, "
      f"intermediate {INTERMEDIATE}, {HEADS} heads / {KV_HEADS} kv heads, "
      f"vocab {VOCAB}, untied head, seeded random bf16 weights: "
      f"{ckpt_bytes / 1e9:.2f} GB ({gib(ckpt_bytes)}) of sharded safetensors. "
      f"Calibration data: {a.samples} samples x {a.seq_len} random token ids "
      "(seed 0), the same tensor for both tools. Recipe: GPTQ W4, groups of "
      "128, symmetric, every Linear but lm_head, sequential pipeline "
      "(llm-compressor: `GPTQModifier(targets=\"Linear\", scheme=\"W4A16\", "
      "ignore=[\"lm_head\"])`, `oneshot(..., pipeline=\"sequential\")`, "
      "saved with `save_compressed=True`).", ""]
  e = rows["export"]
  lines += [f"`tracecut export CKPT --meta -o CKPT/model.pt2`: "
            + (f"{e[0]:.0f} s, peak RSS {gib(e[1])}." if e[0] is not None
               else f"failed: {e[3]}"), ""]
  lines += ["| tool | wall | peak RSS | peak RSS / tracecut streamed |",
            "|---|---|---|---|"]
  names = [("tracecut calibrate (weights streamed)", "tracecut_stream"),
           ("tracecut calibrate --stream-weights=false", "tracecut_full"),
           ("llm-compressor 0.14.0.1 oneshot", "llmc")]
  for label, key in names:
    r = rows.get(key)
    w, m = cell(r)
    ratio = (f"{r[1] / s[1]:.2f}" if r and r[0] is not None and
             s[0] is not None else "")
    lines.append(f"| {label} | {w} | {m} | {ratio} |")
  lines.append("")
  for label, key in names:
    r = rows.get(key)
    if r and r[0] is None:
      lines += [f"{label} failed: `{r[3].strip()}`", ""]
  lines += [f"Command: `{s[6].replace(a.dir, '$DIR')}`" if s[0] is not None
            else "", ""]
  lines += [
      "Memory model (issue 15): the largest subgraph's fp32 weights and "
      "Hessians; the largest is the last decoder layer's, which also holds "
      "the final norm and lm_head: the layer's "
      f"{mm['layer_params'] / 1e6:.1f} M parameters = "
      f"{gib(mm['layer_fp32'])} + its 7 Linears' Hessians (in_features^2 "
      f"x 4 B) {gib(mm['hessians'])} = {gib(mm['layer_total'])}, "
      f"+ norm and lm_head (ignored, no Hessian) {gib(mm['head_fp32'])} "
      f"= {gib(mm['largest'])} (the embedding's subgraph: "
      f"{gib(mm['embed_fp32'])}), "
      f"+ activation cache peak {gib(mm['cache'])} (tracecut's report, budget "
      f"{cache_budget if cache_budget not in (None, -1) else 'unlimited'}) "
      f"= {gib(mm['total'])}; target peak RSS <= 1.5 x that = "
      f"{gib(mm['target'])}. Model-size factor (all parameters / the "
      f"largest subgraph's): {mm['factor']:.1f}.", ""]
  verdicts = []
  llmc = rows.get("llmc")
  if s[0] is not None:
    ok = s[1] <= mm["target"]
    verdicts.append(
        f"* peak RSS <= 1.5 x model: **{'yes' if ok else 'no'}** "
        f"({gib(s[1])} vs {gib(mm['target'])}, "
        f"{s[1] / mm['target']:.2f} x the target)")
    if llmc and llmc[0] is not None:
      ok = llmc[1] / s[1] >= mm["factor"]
      verdicts.append(
          f"* below llm-compressor's by the model-size factor "
          f"({mm['factor']:.1f}): "
          f"**{'yes' if ok else 'no'}** (llm-compressor / tracecut = "
          f"{llmc[1] / s[1]:.2f})")
      ok = s[0] <= llmc[0]
      verdicts.append(
          f"* wall time at most llm-compressor's: **{'yes' if ok else 'no'}** "
          f"({s[0]:.0f} s vs {llmc[0]:.0f} s, {s[0] / llmc[0]:.2f} x)")
    else:
      verdicts.append("* against llm-compressor: no row (see above)")
    problems, info = check_output(s[4], a.layers)
    lines += verdicts + ["",
        f"Output check (tracecut streamed): {info['names']} tensors in the "
        f"shard index, format `{info['format']}`, weights "
        f"`{json.dumps(info['weights'], sort_keys=True)}`"
        + (f"; PROBLEMS: {problems}" if problems else
           "; every decoder Linear's weight_packed and the unquantized "
           "embedding, norm and lm_head present."), ""]
  else:
    lines += [f"tracecut failed: `{s[3].strip()}`", ""]

  section = "\n".join(lines).rstrip() + "\n"
  print(section)
  # bench/report.py includes streaming_bench.md in RESULTS.md as it is (like
  # HF.md); the copy in RESULTS.md is replaced in place until it runs again.
  with open(os.path.splitext(os.path.abspath(__file__))[0] + ".md", "w") as f:
    f.write(section)
  text = open(a.results).read() if os.path.exists(a.results) else ""
  start = text.find(SECTION)
  if start >= 0:
    end = text.find("\n## ", start + len(SECTION))
    if end < 0:
      end = text.find("\nRaw measurements:", start)
    text = text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
  elif "\nRaw measurements:" in text:
    at = text.find("\nRaw measurements:") + 1
    text = text[:at] + section + "\n" + text[at:]
  else:
    text = text.rstrip() + "\n\n" + section
  open(a.results, "w").write(text)
  json.dump({k: list(v[:2]) for k, v in rows.items() if v},
            open(os.path.join(a.dir, "rows.json"), "w"))


if __name__ == "__main__":
  sys.exit(main())
