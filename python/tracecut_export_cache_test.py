"""Tests of the export cache (tracecut_export_cache.py) through the
exporter's command line: what its key depends on, that a cached export is
byte-identical to a fresh one (also for another checkpoint with the same
config and layout), and that failures and hostile files are never cached.

Tiny seeded transformers models written with save_pretrained into
temporary directories: no network, no model hub.

    tools/python python/tracecut_export_cache_test.py [IGNORED ARGS...]
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

# pylint: disable=wrong-import-position
import torch
import transformers
from safetensors.torch import load_file, save_file

import tracecut_export
import tracecut_export_cache as cache
# pylint: enable=wrong-import-position

_LM = dict(vocab_size=64, hidden_size=32, intermediate_size=48,
           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=64)


def _save(directory, seed):
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_LM))
  model.save_pretrained(directory)


def _export(model, output, *flags):
  """tracecut_export.main's exit code and its one line."""
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = tracecut_export.main([model, "--meta", "-o", output, *flags])
  return code, err.getvalue().strip()


def _read(path):
  with open(path, "rb") as f:
    return f.read()


class ExportCacheTest(unittest.TestCase):

  def setUp(self):
    self._tmp = tempfile.TemporaryDirectory()
    self.tmp = self._tmp.name
    os.environ["TRACECUT_CACHE_DIR"] = os.path.join(self.tmp, "cache")
    self.ck = os.path.join(self.tmp, "ck")
    _save(self.ck, 0)

  def tearDown(self):
    os.environ.pop("TRACECUT_CACHE_DIR", None)
    self._tmp.cleanup()

  def entries(self):
    d = cache.cache_dir()
    return sorted(os.listdir(d)) if os.path.isdir(d) else []

  def test_a_second_export_is_the_cached_copy_of_the_first(self):
    first = os.path.join(self.tmp, "a.pt2")
    code, line = _export(self.ck, first)
    self.assertEqual(code, 0, line)
    self.assertNotIn("export cache", line)
    self.assertEqual(len(self.entries()), 1)
    again = os.path.join(self.tmp, "b.pt2")
    code, line = _export(self.ck, again)
    self.assertEqual(code, 0, line)
    self.assertIn("from the export cache", line)
    self.assertEqual(_read(first), _read(again))
    # Exported afresh, the program is the same bytes: the cache gives what
    # the export would.
    fresh = os.path.join(self.tmp, "c.pt2")
    code, line = _export(self.ck, fresh, "--no-cache")
    self.assertEqual(code, 0, line)
    self.assertNotIn("export cache", line)
    self.assertEqual(_read(first), _read(fresh))

  def test_another_fine_tune_of_the_same_model_hits(self):
    other = os.path.join(self.tmp, "other")
    _save(other, 1)  # Other weights, same config and layout.
    key = cache.cache_key(self.ck, 2, 16, None)
    self.assertIsNotNone(key)
    self.assertEqual(cache.cache_key(other, 2, 16, None), key)
    out = os.path.join(self.tmp, "a.pt2")
    self.assertEqual(_export(self.ck, out)[0], 0)
    code, line = _export(other, os.path.join(other, "model.pt2"))
    self.assertEqual(code, 0, line)
    self.assertIn("from the export cache", line)
    # Nothing in the program names the checkpoint it came from.
    self.assertNotIn(self.ck.encode(), _read(out))

  def test_the_key_follows_what_the_export_reads(self):
    key = cache.cache_key(self.ck, 2, 16, None)
    self.assertNotEqual(cache.cache_key(self.ck, 3, 16, None), key)
    self.assertNotEqual(cache.cache_key(self.ck, 2, 8, None), key)
    # --dtype: another program; float32 is the default's.
    self.assertNotEqual(cache.cache_key(self.ck, 2, 16, None, "bfloat16"),
                        key)
    self.assertEqual(cache.cache_key(self.ck, 2, 16, None, "float32"), key)
    self.assertNotEqual(
        cache.cache_key(self.ck, 2, 16, "LlamaModel"), key)
    # config.json.
    path = os.path.join(self.ck, "config.json")
    with open(path) as f:
      config = json.load(f)
    config["rms_norm_eps"] = 1e-5
    with open(path, "w") as f:
      json.dump(config, f)
    changed = cache.cache_key(self.ck, 2, 16, None)
    self.assertNotEqual(changed, key)
    # A tensor's dtype in the safetensors (its header), not its values.
    weights = os.path.join(self.ck, "model.safetensors")
    tensors = load_file(weights)
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * 2
    save_file(tensors, weights, metadata={"format": "pt"})
    self.assertEqual(cache.cache_key(self.ck, 2, 16, None), changed)
    tensors["lm_head.weight"] = tensors["lm_head.weight"].half()
    save_file(tensors, weights, metadata={"format": "pt"})
    retyped = cache.cache_key(self.ck, 2, 16, None)
    self.assertNotEqual(retyped, changed)
    # Custom code beside the config.
    with open(os.path.join(self.ck, "modeling_x.py"), "w") as f:
      f.write("X = 1\n")
    self.assertNotEqual(cache.cache_key(self.ck, 2, 16, None), retyped)

  def test_no_key_for_what_the_export_must_refuse(self):
    self.assertIsNone(cache.cache_key(os.path.join(self.tmp, "nothing"), 2,
                                      16, None))
    # A config.json linked to a file outside the checkpoint.
    outside = os.path.join(self.tmp, "outside.json")
    shutil.copy(os.path.join(self.ck, "config.json"), outside)
    os.remove(os.path.join(self.ck, "config.json"))
    os.symlink(outside, os.path.join(self.ck, "config.json"))
    self.assertIsNone(cache.cache_key(self.ck, 2, 16, None))

  def test_a_truncated_header_gives_no_key(self):
    with open(os.path.join(self.ck, "model.safetensors"), "r+b") as f:
      f.truncate(20)
    self.assertIsNone(cache.cache_key(self.ck, 2, 16, None))

  def test_a_failed_export_caches_nothing(self):
    path = os.path.join(self.ck, "config.json")
    with open(path) as f:
      config = json.load(f)
    config["num_hidden_layers"] = -3
    with open(path, "w") as f:
      json.dump(config, f)
    code, line = _export(self.ck, os.path.join(self.tmp, "a.pt2"))
    self.assertNotEqual(code, 0)
    self.assertIn("num_hidden_layers", line)
    self.assertEqual(self.entries(), [])
    self.assertFalse(os.path.exists(os.path.join(self.tmp, "a.pt2")))

  def test_a_cache_hit_still_refuses_to_overwrite_the_checkpoint(self):
    self.assertEqual(_export(self.ck, os.path.join(self.tmp, "a.pt2"))[0], 0)
    weights = os.path.join(self.ck, "model.safetensors")
    before = _read(weights)
    code, line = _export(self.ck, weights)
    self.assertNotEqual(code, 0)
    self.assertIn("refusing", line)
    self.assertEqual(_read(weights), before)

  def test_an_unwritable_cache_only_means_no_cache(self):
    blocker = os.path.join(self.tmp, "file")
    with open(blocker, "w") as f:
      f.write("x")
    os.environ["TRACECUT_CACHE_DIR"] = blocker  # Not a directory.
    out = os.path.join(self.tmp, "a.pt2")
    code, line = _export(self.ck, out)
    self.assertEqual(code, 0, line)
    self.assertTrue(os.path.isfile(out))


if __name__ == "__main__":
  unittest.main(argv=sys.argv[:1])
