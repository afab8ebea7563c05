"""The GPU check's model and data (issue 33), made on the device.

    make_model.py WORK_DIR [--size=1b|8b|tiny] [--nsamples=128]
        [--seqlen=2048] [--held=8x512] [--device=cuda]

Writes, under WORK_DIR:
  model/        a LlamaForCausalLM of the --size shape (SIZES below) with
                seeded random bf16 weights (torch.manual_seed(0), drawn on
                --device), saved by save_pretrained as safetensors shards,
                plus a word-level tokenizer over the vocabulary ("t0",
                "t1", ...): llm-compressor wants a processor even for
                tokenized data; tracecut copies it through;
  calib.pt      --nsamples x --seqlen token ids (int64, torch.Generator
                seeded 0): the calibration set both tools get;
  held.pt       the held-out batch for the logit error (seed 1234);
  model.json    the shape and the data's sizes, for the report.
An existing WORK_DIR/model with the same model.json is kept (a rerun on a
warm machine skips the generation).
"""

import argparse
import json
import os
import shutil
import sys
import time

# Llama 3 shapes. The LM head is untied (Llama-3.2-1B ties it to the
# embedding; Llama-3-8B does not): the same for both tools, and it is
# ignored by the recipe either way.
SIZES = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=8000),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8,
               vocab_size=128256),
    "8b": dict(hidden_size=4096, intermediate_size=14336,
               num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
}


def llama_config(size, seqlen):
  import transformers
  return transformers.LlamaConfig(
      **SIZES[size], rope_theta=500000.0, rms_norm_eps=1e-5,
      max_position_embeddings=max(2048, seqlen), tie_word_embeddings=False,
      bos_token_id=1, eos_token_id=2, pad_token_id=0)


def save_tokenizer(directory, vocab_size):
  """A word-level tokenizer whose ids are the model's: "t<i>" is id i."""
  import tokenizers
  import transformers
  vocab = {f"t{i}": i for i in range(vocab_size)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2",
      pad_token="t0").save_pretrained(directory)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("work")
  ap.add_argument("--size", default="1b", choices=sorted(SIZES))
  ap.add_argument("--nsamples", type=int, default=128)
  ap.add_argument("--seqlen", type=int, default=2048)
  ap.add_argument("--held", default="8x512", help="held-out ROWSxCOLS")
  ap.add_argument("--device", default="cuda")
  a = ap.parse_args()
  held_rows, held_cols = (int(x) for x in a.held.split("x"))

  import torch
  import transformers

  os.makedirs(a.work, exist_ok=True)
  model_dir = os.path.join(a.work, "model")
  info_path = os.path.join(a.work, "model.json")
  # What the checkpoint depends on (a rerun with the same keeps it).
  spec = {"size": a.size, **SIZES[a.size],
          "max_position_embeddings": max(2048, a.seqlen),
          "dtype": "bfloat16", "tie_word_embeddings": False,
          "weights_seed": 0, "weights_device": a.device}
  old = json.load(open(info_path)) if os.path.exists(info_path) else {}
  info = dict(spec)
  t0 = time.perf_counter()
  if ({k: old.get(k) for k in spec} != spec or
      not os.path.exists(os.path.join(model_dir, "config.json"))):
    shutil.rmtree(model_dir, ignore_errors=True)
    config = llama_config(a.size, a.seqlen)
    torch.manual_seed(0)
    with torch.device(a.device):
      model = transformers.AutoModelForCausalLM.from_config(
          config, dtype=torch.bfloat16)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    tmp = model_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size="2GB")
    del model
    save_tokenizer(tmp, config.vocab_size)
    os.rename(tmp, model_dir)
    info["parameters"] = n_params
    made = True
  else:
    info["parameters"] = old.get("parameters")
    made = False
  info.update(nsamples=a.nsamples, seqlen=a.seqlen,
              held=[held_rows, held_cols], calib_seed=0, held_seed=1234)

  vocab = SIZES[a.size]["vocab_size"]
  g = torch.Generator().manual_seed(0)
  torch.save(torch.randint(0, vocab, (a.nsamples, a.seqlen), generator=g,
                           dtype=torch.int64),
             os.path.join(a.work, "calib.pt"))
  g = torch.Generator().manual_seed(1234)
  torch.save(torch.randint(0, vocab, (held_rows, held_cols), generator=g,
                           dtype=torch.int64),
             os.path.join(a.work, "held.pt"))
  info["checkpoint_bytes"] = sum(
      os.path.getsize(os.path.join(model_dir, f))
      for f in os.listdir(model_dir) if f.endswith(".safetensors"))
  json.dump(info, open(info_path, "w"), indent=1)
  print(json.dumps({"made": made, "seconds": time.perf_counter() - t0,
                    **info}))


if __name__ == "__main__":
  sys.exit(main())
