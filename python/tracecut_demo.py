"""The Python half of `tracecut demo`: transformers' side of the main job.

    tracecut_demo.py make CKPT_DIR [--seed=N]
    tracecut_demo.py compare CKPT_DIR OUT_DIR... --json-out=FILE

`make` builds a small transformers LlamaForCausalLM (2 layers, hidden 256)
from a config with seeded weights and saves it as a Hugging Face checkpoint
directory (config.json + model.safetensors): no download, no tokenizer
(tracecut calibrates on token ids).

`compare` loads the original checkpoint and each compressed-tensors
directory with transformers (compressed-tensors decompresses the packed
int4 weights on load), runs all of them on the same seeded held-out token
ids and writes, per output directory, the relative error of its logits
against the original's, ||got - want|| / ||want|| over every position, the
largest absolute difference and how often the top-1 next token agrees.

Errors go to stderr as one line "tracecut demo: ..." (exit 1).
"""

import argparse
import contextlib
import io
import json
import os
import sys
import warnings

EVAL_SEED = 1234
EVAL_BATCH = 8
EVAL_SEQ = 32

CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
              num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128,
              tie_word_embeddings=False)


class DemoError(Exception):
  pass


def make(ckpt, seed):
  import torch
  import transformers
  torch.manual_seed(seed)
  config = transformers.LlamaConfig(**CONFIG)
  model = transformers.LlamaForCausalLM(config).eval()
  tmp = ckpt + ".tmp"
  if os.path.exists(tmp):
    import shutil
    shutil.rmtree(tmp)
  model.save_pretrained(tmp)
  # Replace an earlier demo's checkpoint whole (and the export in it).
  if os.path.exists(ckpt):
    import shutil
    shutil.rmtree(ckpt)
  os.rename(tmp, ckpt)


def _logits(model, ids):
  import torch
  with torch.no_grad():
    return model(input_ids=ids).logits.float()


def compare(ckpt, outputs, json_out):
  import torch
  import transformers
  torch.manual_seed(0)
  original = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
  vocab = original.config.vocab_size
  ids = torch.randint(0, vocab, (EVAL_BATCH, EVAL_SEQ),
                      generator=torch.Generator().manual_seed(EVAL_SEED))
  want = _logits(original, ids)
  results = {}
  for out in outputs:
    config_path = os.path.join(out, "config.json")
    with open(config_path) as f:
      qc = json.load(f).get("quantization_config")
    if not qc or qc.get("quant_method") != "compressed-tensors":
      raise DemoError(f"{config_path}: no compressed-tensors "
                      "quantization_config")
    qconfig = transformers.CompressedTensorsConfig(run_compressed=False)
    # compressed-tensors draws progress bars on stderr that TQDM_DISABLE
    # does not reach; they are shown only if loading fails.
    chatter = io.StringIO()
    try:
      with contextlib.redirect_stderr(chatter):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            out, quantization_config=qconfig).eval()
    except BaseException:
      sys.stderr.write(chatter.getvalue())
      raise
    got = _logits(model, ids)
    results[out] = {
        "relative_error": ((got - want).norm() / want.norm()).item(),
        "max_abs_error": (got - want).abs().max().item(),
        "top1_agreement":
            (got.argmax(-1) == want.argmax(-1)).float().mean().item(),
        "format": qc.get("format"),
    }
  summary = {
      "eval_tokens": [EVAL_BATCH, EVAL_SEQ],
      "eval_seed": EVAL_SEED,
      "transformers": transformers.__version__,
      "outputs": results,
  }
  tmp = json_out + ".tmp"
  with open(tmp, "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
  os.replace(tmp, json_out)


def main(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="command", required=True)
  m = sub.add_parser("make")
  m.add_argument("ckpt")
  m.add_argument("--seed", type=int, default=0)
  c = sub.add_parser("compare")
  c.add_argument("ckpt")
  c.add_argument("outputs", nargs="+")
  c.add_argument("--json-out", required=True)
  args = p.parse_args(argv)
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
  os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
  # compressed-tensors' per-module progress bars, and transformers' note
  # that the checkpoint's own quantization_config wins (it does: only
  # run_compressed=False, decompress on load, is taken from ours).
  os.environ.setdefault("TQDM_DISABLE", "1")
  warnings.filterwarnings("ignore", message="You passed `quantization_config`")
  try:
    if args.command == "make":
      make(args.ckpt, args.seed)
    else:
      compare(args.ckpt, args.outputs, args.json_out)
  except (DemoError, OSError, ValueError) as e:
    print(f"tracecut demo: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
