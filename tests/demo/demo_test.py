"""`tracecut demo`, the README's first command, end to end (GitHub issue 34).

The demo generates a transformers Llama, exports it with --meta, calibrates
it with GPTQ and RTN into compressed-tensors checkpoints and reports their
final-logit errors as transformers loads them. Checked here, independently
of the demo's own Python half:

* it exits 0, prints the partition table, the transformers-loaded error
  lines and where the outputs and the HTML report are, and --json prints
  the summary on stdout only;
* both outputs are compressed-tensors checkpoints (pack-quantized, 14
  Linear modules per run, lm_head left out) that transformers loads;
* the errors it prints are the ones this test measures itself: the same
  held-out token ids through transformers' original model and each loaded
  output (relative error equal to 1e-6);
* GPTQ's final-logit error is below round-to-nearest's, and both are
  below 0.5 but not zero (int4 on the seeded Gaussian weights of a
  randomly initialised model moves each Linear's output by ~10%);
* the HTML report exists and is self-contained.

    demo_test.py TRACECUT
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

EVAL_SEED, EVAL_BATCH, EVAL_SEQ = 1234, 8, 32  # python/tracecut_demo.py


def run(cmd):
  p = subprocess.run(cmd, capture_output=True, text=True)
  if p.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}:\n"
                         f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
  return p


def logits(model, ids):
  with torch.no_grad():
    return model(input_ids=ids).logits.float()


def main():
  tracecut = sys.argv[1]
  work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  out = os.path.join(work, "demo-out")
  p = run([tracecut, "demo", "-o", out, "--samples=32"])
  text = p.stdout
  for needle in ("== tracecut export", "--meta", "== tracecut partition",
                 "LlamaDecoderLayer", "final-logit relative error",
                 "loaded by transformers", "HTML report: "):
    assert needle in text, f"'{needle}' not in the demo's output:\n{text}"
  assert text.rstrip().splitlines()[-1] == (
      "HTML report: " + os.path.join(out, "llama-gptq-w4a16.report.html")), (
          text[-500:])

  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  ckpt = os.path.join(out, "llama")
  original = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
  ids = torch.randint(0, original.config.vocab_size, (EVAL_BATCH, EVAL_SEQ),
                      generator=torch.Generator().manual_seed(EVAL_SEED))
  want = logits(original, ids)
  errors = {}
  for name in ("gptq", "rtn"):
    result = summary["results"][name]
    with open(os.path.join(result["model"], "config.json")) as f:
      qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors", qc
    assert qc["format"] == "pack-quantized", qc
    model = transformers.AutoModelForCausalLM.from_pretrained(
        result["model"],
        quantization_config=transformers.CompressedTensorsConfig(
            run_compressed=False)).eval()
    got = logits(model, ids)
    err = ((got - want).norm() / want.norm()).item()
    assert abs(err - result["relative_error"]) <= 1e-6, (name, err, result)
    assert f"{err:.4f}" in text, (name, err)
    with open(result["report"]) as f:
      report = json.load(f)
    assert report["summary"]["weights_quantized"] == 14, report["summary"]
    errors[name] = err
  assert 0 < errors["gptq"] < errors["rtn"] < 0.5, errors
  print(f"demo: final-logit relative error through transformers: GPTQ "
        f"{errors['gptq']:.4f}, RTN {errors['rtn']:.4f}")

  html_path = summary["html_report"]
  with open(html_path) as f:
    page = f.read()
  assert "<script" not in page and "model.layers.1.mlp.down_proj" in page
  print(f"demo: {html_path} written ({len(page)} bytes)")

  # --json: the summary on stdout, nothing else.
  p = run([tracecut, "demo", "-o", out, "--samples=32", "--json"])
  again = json.loads(p.stdout)
  assert again["results"]["gptq"]["relative_error"] == (
      summary["results"]["gptq"]["relative_error"]), "not deterministic"
  print("demo --json: summary on stdout, same errors on a second run")


if __name__ == "__main__":
  main()
