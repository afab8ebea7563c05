"""Unit tests of tracecut_export_layout: the checkpoint's side of `tracecut
export` (checkpoint_layout, tied groups, shapes, the --meta name check and
the checkpoint files' path checks).

Tiny transformers models built from config classes with seeded weights and
written with save_pretrained into temporary directories: no network, no
model hub. The mapping is checked against what the checkpoint holds: the
model's tensors rebuilt from the checkpoint's through the layout equal
transformers' own, bit for bit.

    cd python && tools/python -m unittest tracecut_export_layout_test -v
    tools/python python/tracecut_export_layout_test.py [IGNORED ARGS...]
"""

import copy
import json
import os
import sys
import tempfile
import unittest
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

# pylint: disable=wrong-import-position
import torch
import transformers
from safetensors.torch import load_file

import tracecut_export
import tracecut_export_layout as layout
from tracecut_export_errors import ExportError
# pylint: enable=wrong-import-position

_LM = dict(vocab_size=64, hidden_size=32, intermediate_size=48,
           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           max_position_embeddings=64)


def _model(config_class, model_class, **kwargs):
  torch.manual_seed(0)
  config = getattr(transformers, config_class)(**kwargs)
  return getattr(transformers, model_class)(config).eval()


def _rebuild(model_tensor, pieces, tensors):
  """The model tensor made from the checkpoint's `tensors` as `pieces` say
  (each a box of it, filled exactly once), or an AssertionError."""
  out = torch.zeros_like(model_tensor)
  filled = torch.zeros(model_tensor.shape, dtype=torch.int32)
  for p in pieces:
    box = tuple(slice(o, o + s) for o, s in zip(p["offsets"], p["sizes"]))
    out[box] = tensors[p["name"]].reshape(p["sizes"])
    filled[box] += 1
  assert bool((filled == 1).all()), "pieces overlap or leave a gap"
  return out


class CheckpointLayoutTest(unittest.TestCase):

  @classmethod
  def setUpClass(cls):
    cls._tmp = tempfile.TemporaryDirectory()
    cls.models, cls.dirs, cls.tensors = {}, {}, {}
    for name, model in {
        "llama": _model("LlamaConfig", "LlamaForCausalLM", **_LM),
        "tied": _model("LlamaConfig", "LlamaForCausalLM",
                       tie_word_embeddings=True, **_LM),
        "mixtral": _model("MixtralConfig", "MixtralForCausalLM",
                          num_local_experts=3, num_experts_per_tok=2, **_LM),
        "vit": _model("ViTConfig", "ViTModel", hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, image_size=32, patch_size=8),
    }.items():
      directory = os.path.join(cls._tmp.name, name)
      model.save_pretrained(directory)
      cls.models[name] = model
      cls.dirs[name] = directory
      cls.tensors[name] = load_file(
          os.path.join(directory, "model.safetensors"))

  @classmethod
  def tearDownClass(cls):
    cls._tmp.cleanup()

  def shapes(self, name):
    return layout._checkpoint_shapes(self.dirs[name])

  def assertRebuilds(self, name, mapping):
    state = self.models[name].state_dict()
    for target, pieces in mapping.items():
      self.assertTrue(
          torch.equal(_rebuild(state[target], pieces, self.tensors[name]),
                      state[target]), target)

  def test_shapes_are_the_checkpoints(self):
    for name, tensors in self.tensors.items():
      self.assertEqual(self.shapes(name),
                       {k: list(t.shape) for k, t in tensors.items()}, name)

  def test_llama_holds_every_tensor_under_its_own_name(self):
    model, shapes = self.models["llama"], self.shapes("llama")
    state = model.state_dict()
    self.assertEqual(shapes, {k: list(t.shape) for k, t in state.items()})
    self.assertEqual(layout.checkpoint_layout(model, shapes), {})
    self.assertEqual(layout._tied_groups(model), [])
    layout._check_meta_names(model, "llama", shapes, [], {})

  def test_tied_embeddings_read_through_their_alias(self):
    model, shapes = self.models["tied"], self.shapes("tied")
    tied = layout._tied_groups(model)
    self.assertEqual(tied, [["model.embed_tokens.weight", "lm_head.weight"]])
    # save_pretrained stores the shared tensor once, under the first name.
    self.assertIn("model.embed_tokens.weight", shapes)
    self.assertNotIn("lm_head.weight", shapes)
    # A tied alias of a stored name needs no layout entry.
    self.assertEqual(layout.checkpoint_layout(model, shapes), {})
    layout._check_meta_names(model, "tied", shapes, tied, {})
    # Checkpoints that store it under the other name are read through the
    # tied group: without it, --meta finds no tensor for the embedding.
    as_head = {("lm_head.weight" if k == "model.embed_tokens.weight" else k):
               v for k, v in shapes.items()}
    layout._check_meta_names(model, "tied", as_head, tied, {})
    with self.assertRaisesRegex(ExportError, r"no tensor for 1 of the "
                                r"model's parameters \(e\.g\. "
                                r"'model\.embed_tokens\.weight'\)"):
      layout._check_meta_names(model, "tied", as_head, [], {})

  def test_mixtral_experts_are_stacked_and_concatenated(self):
    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    mapping = layout.checkpoint_layout(model, shapes)
    expected = [f"model.layers.{i}.{t}" for i in range(2) for t in (
        "mlp.experts.down_proj", "mlp.experts.gate_up_proj",
        "mlp.gate.weight")]
    self.assertEqual(sorted(mapping), expected)
    # Every checkpoint tensor the model does not hold by name is one piece.
    used = sorted(p["name"] for ps in mapping.values() for p in ps)
    self.assertEqual(used, sorted(set(shapes) - set(model.state_dict())))
    prefix = "model.layers.0.block_sparse_moe."
    self.assertEqual(mapping["model.layers.0.mlp.gate.weight"], [
        {"name": prefix + "gate.weight", "offsets": [0, 0], "sizes": [3, 32]}
    ])
    # gate (w1) then up (w3) along dimension 1, each expert at its index.
    self.assertEqual(mapping["model.layers.0.mlp.experts.gate_up_proj"], [
        {"name": f"{prefix}experts.{e}.{w}.weight", "offsets": [e, at, 0],
         "sizes": [1, 48, 32]} for w, at in (("w1", 0), ("w3", 48))
        for e in range(3)
    ])
    self.assertEqual(mapping["model.layers.1.mlp.experts.down_proj"], [
        {"name": f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight",
         "offsets": [e, 0, 0], "sizes": [1, 32, 48]} for e in range(3)
    ])
    self.assertRebuilds("mixtral", mapping)
    layout._check_meta_names(model, "mixtral", shapes, [], mapping)

  def test_vit_renamed_tensors_are_one_piece_each(self):
    model, shapes = self.models["vit"], self.shapes("vit")
    mapping = layout.checkpoint_layout(model, shapes)
    state = model.state_dict()
    self.assertEqual(set(mapping), set(state) - set(shapes))
    self.assertEqual(len(mapping), 32)  # 16 tensors in each of 2 layers.
    self.assertEqual(mapping["layers.1.attention.q_proj.weight"], [
        {"name": "encoder.layer.1.attention.attention.query.weight",
         "offsets": [0, 0], "sizes": [32, 32]}
    ])
    for target, pieces in mapping.items():
      self.assertEqual(len(pieces), 1, target)
      self.assertEqual(pieces[0]["sizes"], list(state[target].shape))
    self.assertRebuilds("vit", mapping)

  def test_tensors_that_are_not_the_models_stay_out(self):
    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    extra = dict(shapes, **{"unused.weight": [3],
                            "model.layers.0.block_sparse_moe.x.weight": [2]})
    self.assertEqual(layout.checkpoint_layout(model, extra),
                     layout.checkpoint_layout(model, shapes))

  def test_missing_source_pattern_is_refused(self):
    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    no_up = {k: v for k, v in shapes.items()
             if not (k.startswith("model.layers.0.") and
                     k.endswith("w3.weight"))}
    with self.assertRaisesRegex(
        ExportError, r"^model\.layers\.0\.mlp\.experts\.gate_up_proj: the "
        r"checkpoint has no tensor for '.*w3\.weight' \(needed with "):
      layout.checkpoint_layout(model, no_up)

  def test_missing_expert_is_refused(self):
    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    for e in (0, 2):
      missing = dict(shapes)
      del missing[f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight"]
      with self.assertRaisesRegex(
          ExportError, r"^model\.layers\.1\.mlp\.experts\.down_proj: the "
          r"checkpoint has 2 tensors for '\.experts\.\*\.w2\.weight' "
          r"\(model\.layers\.1\.block_sparse_moe\.experts\.\d\.w2\.weight, "
          r".*\), the model stacks 3, one per expert 0\.\.2$"):
        layout.checkpoint_layout(model, missing)

  def test_missing_expert_of_one_concatenated_half_is_refused(self):
    # Without expert 0's w1 the w3 half still spans all 3 experts; each
    # pattern must give one tensor per expert, by expert number.
    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    missing = dict(shapes)
    del missing["model.layers.0.block_sparse_moe.experts.0.w1.weight"]
    with self.assertRaisesRegex(ExportError, r"has 2 tensors for .*w1.*"
                                r"stacks 3, one per expert 0\.\.2"):
      layout.checkpoint_layout(model, missing)

  def test_experts_numbered_out_of_range_are_refused(self):
    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    renumbered = dict(shapes)
    prefix = "model.layers.0.block_sparse_moe.experts."
    renumbered[prefix + "7.w1.weight"] = renumbered.pop(prefix + "2.w1.weight")
    with self.assertRaisesRegex(ExportError, r"one per expert 0\.\.2"):
      layout.checkpoint_layout(model, renumbered)

  def test_experts_of_different_shapes_are_refused(self):
    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    odd = dict(shapes)
    odd["model.layers.0.block_sparse_moe.experts.1.w2.weight"] = [32, 47]
    with self.assertRaisesRegex(
        ExportError, r"^model\.layers\.0\.block_sparse_moe\.experts\.1\.w2\."
        r"weight: shape \[32, 47\], but model\.layers\.0\.block_sparse_moe\."
        r"experts\.0\.w2\.weight has \[32, 48\]$"):
      layout.checkpoint_layout(model, odd)

  def test_unsupported_conversion_is_refused(self):
    from transformers import conversion_mapping
    from transformers.core_model_loading import Transpose, WeightConverter
    real = conversion_mapping.get_model_conversion_mapping

    def with_transpose(model, *args, **kwargs):
      conversions = copy.deepcopy(real(model, *args, **kwargs))
      for c in conversions:
        if isinstance(c, WeightConverter) and len(c.operations) == 1:
          c.operations = list(c.operations) + [Transpose(1, 2)]
      return conversions

    model, shapes = self.models["mixtral"], self.shapes("mixtral")
    with mock.patch.object(conversion_mapping, "get_model_conversion_mapping",
                           with_transpose):
      with self.assertRaisesRegex(
          ExportError, r"^model\.layers\.0\.mlp\.experts\.down_proj: "
          r"transformers builds it from the checkpoint with MergeModulelist "
          r"\+ Transpose, which tracecut cannot map back"):
        layout.checkpoint_layout(model, shapes)

  def test_without_conversion_mappings_nothing_is_mapped(self):
    model, shapes = self.models["vit"], self.shapes("vit")
    with mock.patch.dict(sys.modules,
                         {"transformers.conversion_mapping": None}):
      self.assertEqual(layout.checkpoint_layout(model, shapes), {})

  def test_renamed_tensor_is_missing_for_meta(self):
    model, shapes = self.models["vit"], self.shapes("vit")
    renamed = dict(shapes)
    renamed["encoder.layer.0.attention.attention.qq.weight"] = renamed.pop(
        "encoder.layer.0.attention.attention.query.weight")
    mapping = layout.checkpoint_layout(model, renamed)
    self.assertNotIn("layers.0.attention.q_proj.weight", mapping)
    self.assertNotIn("encoder.layer.0.attention.attention.qq.weight",
                     [p["name"] for ps in mapping.values() for p in ps])
    with self.assertRaisesRegex(
        ExportError, r"^vit: --meta reads the weights by name, but the "
        r"checkpoint has no tensor for 1 of the model's parameters \(e\.g\. "
        r"'layers\.0\.attention\.q_proj\.weight'\)"):
      layout._check_meta_names(model, "vit", renamed, [], mapping)
    with self.assertRaisesRegex(ExportError, r"^vit: --meta reads the "
                                r"weights from the checkpoint's safetensors"):
      layout._check_meta_names(model, "vit", None, [], {})

  def test_entry_point_reexports_the_mapping(self):
    self.assertIs(tracecut_export.checkpoint_layout, layout.checkpoint_layout)
    self.assertIs(tracecut_export.resolve_inside, layout.resolve_inside)
    self.assertIs(tracecut_export.ExportError, ExportError)


class CheckpointFilesTest(unittest.TestCase):

  def setUp(self):
    self._tmp = tempfile.TemporaryDirectory()
    self.dir = os.path.join(self._tmp.name, "ckpt")
    os.mkdir(self.dir)

  def tearDown(self):
    self._tmp.cleanup()

  def write_index(self, weight_map):
    with open(os.path.join(self.dir, "model.safetensors.index.json"),
              "w") as f:
      json.dump({"weight_map": weight_map}, f)

  def test_sharded_checkpoint_has_the_same_shapes(self):
    model = _model("LlamaConfig", "LlamaForCausalLM", **_LM)
    single = os.path.join(self._tmp.name, "single")
    model.save_pretrained(single)
    model.save_pretrained(self.dir, max_shard_size="50KB")
    files = layout.checkpoint_files(self.dir)
    self.assertGreater(len(files), 1)
    self.assertEqual(files, sorted(files))
    self.assertEqual(layout._checkpoint_shapes(self.dir),
                     layout._checkpoint_shapes(single))
    self.assertEqual(layout.checkpoint_files(single),
                     [os.path.realpath(os.path.join(single,
                                                    "model.safetensors"))])

  def test_no_safetensors(self):
    self.assertEqual(layout.checkpoint_files(self.dir), [])
    self.assertIsNone(layout._checkpoint_shapes(self.dir))

  def test_index_entries_must_be_files_inside(self):
    outside = os.path.join(self._tmp.name, "outside.safetensors")
    open(outside, "w").close()
    os.symlink(outside, os.path.join(self.dir, "link.safetensors"))
    os.mkdir(os.path.join(self.dir, "sub.safetensors"))
    for name, why in [("../outside.safetensors", "a path with '..'"),
                      (outside, "an absolute path"),
                      ("link.safetensors", "a symbolic link"),
                      ("sub.safetensors", "it is a directory"),
                      ("gone.safetensors", "no such file in"),
                      ("", "not a file name")]:
      self.write_index({"a.weight": name})
      with self.assertRaisesRegex(
          ExportError, r"model\.safetensors\.index\.json: weight_map entry "
          r"'a\.weight' -> '.*': " + why):
        layout.checkpoint_files(self.dir)

  def test_not_an_index(self):
    self.write_index(["model.safetensors"])
    with self.assertRaisesRegex(ExportError, "not a safetensors index"):
      layout.checkpoint_files(self.dir)

  def test_not_safetensors(self):
    with open(os.path.join(self.dir, "model.safetensors"), "w") as f:
      f.write("not safetensors")
    with self.assertRaisesRegex(ExportError, r"model\.safetensors: not a "
                                "valid safetensors file"):
      layout._checkpoint_shapes(self.dir)


class NoSplitModulesTest(unittest.TestCase):
  """tracecut_model.json's no_split_modules is the same on every run."""

  def test_a_set_is_sorted_and_a_list_kept(self):
    import tracecut_export_program as program  # pylint: disable=import-outside-toplevel

    class FromSet:
      _no_split_modules = {"ViTLayer", "ViTEmbeddings", "Block"}

    class FromList:
      _no_split_modules = ["BartEncoderLayer", "BartDecoderLayer"]

    class Without:
      _no_split_modules = None

    self.assertEqual(program._no_split_modules(FromSet),  # pylint: disable=protected-access
                     ["Block", "ViTEmbeddings", "ViTLayer"])
    self.assertEqual(program._no_split_modules(FromList),  # pylint: disable=protected-access
                     ["BartEncoderLayer", "BartDecoderLayer"])
    self.assertEqual(program._no_split_modules(Without), [])  # pylint: disable=protected-access


if __name__ == "__main__":
  # Arguments are ignored: a test runner may pass its own.
  unittest.main(argv=sys.argv[:1], verbosity=2)
