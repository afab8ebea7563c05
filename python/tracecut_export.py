"""`tracecut export`: a Hugging Face transformers model to a torch.export .pt2.

    tools/python python/tracecut_export.py HF_DIR_OR_MODEL_ID -o OUT.pt2 \
        [--torchscript] [--batch=N] [--seq-len=N] [--class=NAME]
    tools/python python/tracecut_export.py --config-only CONFIG.json ...

The model is built with transformers' own classes from the checkpoint's
config.json (and its safetensors weights unless --random-weights), exported
with torch.export (eager-mode attention, no KV cache), and saved with these
files embedded next to the program, which `tracecut` reads back:

  config.json           the model's config, as transformers writes it
  tracecut_inputs.json  the example inputs, as descriptions (name, shape,
                        dtype, how values are drawn), so every subcommand can
                        rebuild them deterministically
  tracecut_model.json   {"model_class", "no_split_modules", "exporter"}

--torchscript writes a TorchScript .pt (torch.jit.trace) with the same
files embedded, for LibTorch-only users.

Errors go to stderr as one line "tracecut export: ..." and never as a
traceback: exit 1 for an error (bad input, a config value out of range, a
full disk or read-only output, out of memory), 2 for bad flags, 128 + N when
stopped by signal N (130 for Ctrl-C). When torch.export fails, the line
names the innermost module and source line of model code that the failure
points at.

A checkpoint directory is untrusted input: the files its index names must be
regular files inside it (or, for a Hugging Face cache snapshot, in its
repository's blobs/), and config values must be in sane ranges before any
model is built. The output is written to a hidden temporary beside it and
renamed into place; an existing output is replaced only when it is an
earlier .pt2/.pt archive, and temporaries left by killed exports are
removed.
"""

import argparse
import errno
import json
import os
import re
import signal
import stat
import sys
import tempfile
import traceback

EXIT_ERROR = 1
EXIT_USAGE = 2


class ExportError(Exception):
  pass


def _fail(message):
  raise ExportError(message)


def _first_line(error):
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


# Config values that become shapes and layer counts, with the ranges
# tracecut accepts (tracer/hf/config.cc has the same table): far above any
# released model, far below what would exhaust a machine.
_INT_RANGES = {
    "vocab_size": (1, 1 << 24),
    "hidden_size": (1, 1 << 18),
    "intermediate_size": (1, 1 << 20),
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 1 << 14),
    "num_key_value_heads": (1, 1 << 14),
    "max_position_embeddings": (1, 1 << 24),
    "n_positions": (1, 1 << 24),
    "type_vocab_size": (0, 1 << 16),
    "num_channels": (1, 4096),
    "image_size": (1, 1 << 16),
    "patch_size": (1, 1 << 16),
    "num_labels": (0, 1 << 20),
    "head_dim": (1, 1 << 16),
    "num_local_experts": (1, 1 << 16),
    "num_experts": (1, 1 << 16),
    "n_routed_experts": (1, 1 << 16),
    "moe_intermediate_size": (1, 1 << 20),
    "n_embd": (1, 1 << 18),
    "n_layer": (1, 1024),
    "n_head": (1, 1 << 14),
    "d_model": (1, 1 << 18),
    "num_layers": (1, 1024),
    "encoder_layers": (1, 1024),
    "decoder_layers": (1, 1024),
}
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config")
# Elements of one example input (tracer/hf/inputs.cc: the same bound).
_MAX_INPUT_ELEMENTS = 1 << 26


def check_config_values(values, source, prefix=""):
  """Fails naming the key when a size in a config.json dict is not an
  integer in its range (a bool is not an integer)."""
  for key, (low, high) in _INT_RANGES.items():
    v = values.get(key)
    if v is None:
      continue
    items = v if isinstance(v, (list, tuple)) else [v]
    for x in items:
      if isinstance(x, bool) or not isinstance(x, int) or not low <= x <= high:
        _fail(f"{source}: \"{prefix}{key}\" must be an integer between "
              f"{low} and {high}, got {json.dumps(v)[:40]}")
  for sub in _SUB_CONFIGS:
    if isinstance(values.get(sub), dict):
      check_config_values(values[sub], source, f"{prefix}{sub}.")


def _blobs_root(real_dir):
  """A Hugging Face cache snapshot (REPO/snapshots/REV) keeps its files as
  links into REPO/blobs: that directory, resolved, or None."""
  snapshots = os.path.dirname(real_dir)
  repo = os.path.dirname(snapshots)
  if (os.path.basename(snapshots) == "snapshots" and
      os.path.basename(repo).startswith("models--")):
    blobs = os.path.join(repo, "blobs")
    if os.path.isdir(blobs):
      return os.path.realpath(blobs)
  return None


def _within(path, root):
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_inside(directory, name, where):
  """The real path of `name` from one of the checkpoint's own files: a
  regular file inside `directory` (checkpoint/closed_dir.h has the same
  rules), else an error naming `where`."""
  def refuse(why):
    _fail(f"{where}: {why}; a checkpoint's files must be regular files "
          f"inside its directory '{directory}'")
  if not isinstance(name, str) or not name:
    refuse("not a file name")
  if "\0" in name:
    refuse("a file name with a NUL byte")
  if name.startswith("/"):
    refuse("an absolute path")
  if ".." in name.split("/"):
    refuse("a path with '..'")
  root = os.path.realpath(directory)
  real = os.path.realpath(os.path.join(root, name))
  roots = [root] + [b for b in [_blobs_root(root)] if b]
  if not os.path.lexists(os.path.join(root, name)):
    _fail(f"{where}: no such file in '{directory}'")
  if not any(_within(real, r) for r in roots):
    refuse("a symbolic link (or a directory link on the way) to a file "
           "outside")
  try:
    mode = os.stat(real).st_mode
  except OSError as e:
    refuse(f"cannot stat it ({e.strerror})")
  if not stat.S_ISREG(mode):
    kind = ("a directory" if stat.S_ISDIR(mode) else
            "a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "not a regular file")
    refuse(f"it is {kind}")
  return real


def checkpoint_files(source):
  """The safetensors files of checkpoint directory `source`, resolved and
  checked (see resolve_inside); [] when it has none."""
  index = os.path.join(source, "model.safetensors.index.json")
  single = os.path.join(source, "model.safetensors")
  if os.path.lexists(index):
    path = resolve_inside(source, "model.safetensors.index.json", index)
    if os.path.getsize(path) > 64 << 20:
      _fail(f"{index}: over 64 MiB, not a safetensors index")
    try:
      with open(path) as f:
        weight_map = json.load(f)["weight_map"]
      if not isinstance(weight_map, dict):
        raise TypeError("weight_map is not an object")
    except (ValueError, KeyError, TypeError) as e:
      _fail(f"{index}: not a safetensors index (wants {{\"weight_map\": "
            f"{{tensor: file}}}}): {e}")
    files = {}
    for tensor, name in sorted(weight_map.items()):
      if name not in files:
        files[name] = resolve_inside(
            source, name, f"{index}: weight_map entry '{tensor}' -> '{name}'")
    return sorted(files.values())
  if os.path.lexists(single):
    return [resolve_inside(source, "model.safetensors", single)]
  return []


def _load_config(source, trust_remote_code=False):
  import transformers
  if os.path.isfile(source) and source.endswith(".json"):
    return transformers.AutoConfig.from_pretrained(os.path.dirname(source) or
                                                   ".")
  if os.path.isdir(source):
    if not os.path.isfile(os.path.join(source, "config.json")):
      _fail(f"{source}: no config.json in this directory (not a Hugging Face "
            "checkpoint)")
  if os.path.isdir(source):
    cfg = os.path.join(source, "config.json")
    try:
      with open(resolve_inside(source, "config.json", cfg)) as f:
        values = json.load(f)
    except ValueError as e:
      _fail(f"{cfg}: not JSON ({e})")
    if not isinstance(values, dict):
      _fail(f"{cfg}: a config must be a JSON object")
    check_config_values(values, cfg)
  try:
    config = transformers.AutoConfig.from_pretrained(
        source, local_files_only=True, trust_remote_code=trust_remote_code)
  except (OSError, ValueError, TypeError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
    _fail(f"{source}: cannot read a Hugging Face config ({first}); give a "
          "checkpoint directory or a model id already in the local Hugging "
          "Face cache (tracecut never downloads)")
  # What transformers made of it (a model id's config, defaults filled in).
  check_config_values(config.to_dict(), f"{source}: config.json")
  return config


def _model_class(config, name):
  import transformers
  names = [name] if name else list(getattr(config, "architectures", None) or [])
  for n in names:
    cls = getattr(transformers, n, None)
    if cls is not None:
      return cls
    if name:
      _fail(f"--class={name}: transformers {transformers.__version__} has no "
            "such class")
  auto = transformers.AutoModel
  try:
    return auto._model_mapping[type(config)]
  except KeyError:
    _fail(f"config.json names no architecture that transformers "
          f"{transformers.__version__} knows ({names or 'none'}) and "
          f"model_type '{config.model_type}' has no AutoModel class; give "
          "--class=NAME")


def _large_on_meta_mode():
  import torch
  from torch.overrides import TorchFunctionMode

  factories = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand,
               torch.randn, torch.randint, torch.arange, torch.eye,
               torch.empty_strided, torch.linspace}

  class LargeOnMeta(TorchFunctionMode):
    """Factory calls whose result has more than 2^22 elements return meta
    tensors: no model's computed buffer (rotary frequencies, a causal mask)
    is that large, and a parameter that large is never allocated."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
      kwargs = dict(kwargs or {})
      if func in factories and kwargs.get("device") is None:
        probe = func(*args, **{**kwargs, "device": "meta"})
        if probe.numel() > (1 << 22):
          return probe
      return func(*args, **kwargs)

  return LargeOnMeta()


def _has_weights(directory):
  if not os.path.isdir(directory):
    return True  # A model id in the cache: from_pretrained finds them.
  return any(
      f.endswith(".safetensors") or f.endswith(".bin")
      for f in os.listdir(directory))


def build_model(source, class_name=None, random_weights=False, seed=0,
                meta=False):
  """The transformers model of `source`, in eval mode on the CPU; with
  `meta`, on the meta device (no weight read or allocated), plus the real
  values of its buffers (which checkpoints do not hold when non-persistent,
  e.g. rotary inv_freq)."""
  import torch
  config = _load_config(source)
  cls = _model_class(config, class_name)
  attn = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
  config._attn_implementation = attn
  if hasattr(config, "use_cache"):
    config.use_cache = False
  if meta:
    from accelerate import init_empty_weights
    # Parameters on meta, buffers computed. accelerate moves each parameter
    # to meta once it is registered, after it was allocated: large tensors
    # are made on meta from the start.
    with init_empty_weights(include_buffers=False), _large_on_meta_mode():
      shell = cls(config)
    buffers = {n: b.detach().contiguous().clone()
               for n, b in shell.named_buffers() if b.device.type != "meta"}
    with torch.device("meta"):
      model = cls(config)
    return model.eval(), config, buffers
  if random_weights or not _has_weights(source):
    if not random_weights:
      _fail(f"{source}: no *.safetensors or *.bin weights in this directory; "
            "give --random-weights to export with seeded random weights")
    torch.manual_seed(seed)
    model = cls(config)
  else:
    if os.path.isdir(source):
      checkpoint_files(source)  # Every shard inside, before transformers.
    try:
      model = cls.from_pretrained(
          source, config=config, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError) as e:
      _fail(f"{source}: cannot load the weights of {cls.__name__}: "
            f"{str(e).strip().splitlines()[0]}")
  return model.eval(), config, None


# Input descriptions (tracecut_inputs.json; see tracer/hf/inputs.h).
def _tokens(name, batch, seq, vocab):
  return {"name": name, "shape": [batch, seq], "dtype": "int64",
          "kind": "tokens", "high": int(vocab)}


def input_specs(model, config, batch, seq_len):
  """Example-input descriptions for `model`'s forward, by modality."""
  import inspect
  params = inspect.signature(model.forward).parameters
  main = getattr(model, "main_input_name", "input_ids")
  vocab = getattr(config, "vocab_size", None)
  text_config = getattr(config, "text_config", None)
  vision_config = getattr(config, "vision_config", None)
  specs = []
  if main == "input_ids" or "input_ids" in params and main not in params:
    v = vocab or getattr(text_config, "vocab_size", None) or 1000
    specs.append(_tokens("input_ids", batch, seq_len, v))
  if main == "pixel_values" or (vision_config is not None and
                                "pixel_values" in params):
    vc = vision_config or config
    size = getattr(vc, "image_size", 224)
    size = size if isinstance(size, int) else size[0]
    channels = getattr(vc, "num_channels", 3)
    specs.append({"name": "pixel_values", "shape": [batch, channels, size,
                                                    size],
                  "dtype": "float32", "kind": "normal"})
  if main == "input_features":
    mels = getattr(config, "num_mel_bins", 80)
    frames = 2 * getattr(config, "max_source_positions", 1500)
    specs.append({"name": "input_features", "shape": [batch, mels, frames],
                  "dtype": "float32", "kind": "normal"})
  if main == "input_values":
    specs.append({"name": "input_values", "shape": [batch, 16000],
                  "dtype": "float32", "kind": "normal"})
  if getattr(config, "is_encoder_decoder", False) and (
      "decoder_input_ids" in params):
    v = vocab or 1000
    specs.append(_tokens("decoder_input_ids", batch, seq_len, v))
  if not specs:
    _fail(f"{type(model).__name__}: main input '{main}' is not one tracecut "
          "knows how to make (input_ids, pixel_values, input_features, "
          "input_values)")
  return specs


def make_inputs(specs, seed=1234, meta=False):
  """Example inputs from their descriptions; with `meta`, on the meta
  device (nothing allocated)."""
  import torch
  g = torch.Generator().manual_seed(seed)
  out = {}
  for s in specs:
    numel = 1
    for d in s["shape"]:
      numel *= d
    if numel > _MAX_INPUT_ELEMENTS:
      _fail(f"example input '{s['name']}' would have shape {s['shape']} "
            f"({numel} elements, more than {_MAX_INPUT_ELEMENTS}); check the "
            "config's sizes or give smaller --batch/--seq-len")
    dtype = getattr(torch, s["dtype"])
    if meta:
      out[s["name"]] = torch.empty(s["shape"], dtype=dtype, device="meta")
      continue
    if s["kind"] == "tokens":
      out[s["name"]] = torch.randint(0, s["high"], s["shape"], generator=g,
                                     dtype=dtype)
    elif s["kind"] == "ones":
      out[s["name"]] = torch.ones(s["shape"], dtype=dtype)
    else:
      out[s["name"]] = torch.randn(s["shape"], generator=g, dtype=dtype)
  return out


def _forward_params(model):
  import inspect
  return inspect.signature(model.forward).parameters


def _leaf_names(tree):
  from torch.utils import _pytree
  names = []
  for path, _ in _pytree.tree_flatten_with_path(tree)[0]:
    parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))
             for k in path]
    names.append(".".join(parts) or "output")
  return names


def output_names(model, inputs):
  """Names of the tensors the model returns, flattened in pytree order
  (nested outputs, like CLIP's text_model_output, as dotted paths)."""
  import torch
  from torch.utils import _pytree
  with torch.no_grad():
    kwargs = dict(inputs)
    if "use_cache" in _forward_params(model):
      kwargs["use_cache"] = False
    out = model(**kwargs)
  if isinstance(out, torch.Tensor):
    return ["output"]
  return [
      n for n, t in zip(_leaf_names(out), _pytree.tree_leaves(out))
      if isinstance(t, torch.Tensor)
  ]


def program_output_names(ep):
  """The same names, from an exported program's output spec (no run)."""
  from torch.utils import _pytree
  spec = ep.call_spec.out_spec
  if spec is None or spec.num_leaves == 1 and spec.is_leaf():
    return ["output"]
  return _leaf_names(_pytree.tree_unflatten(list(range(spec.num_leaves)),
                                            spec))


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')


def _explain(model, error):
  """One line naming where in model code torch.export failed."""
  text = "".join(traceback.format_exception(error))
  frames = _FRAME.findall(text)
  # The innermost frame in model code (not torch's own machinery).
  model_frames = [
      f for f in frames if "/torch/" not in f[0] and "/_dynamo/" not in f[0]
      and not f[0].endswith("tracecut_export.py")
  ]
  where = ""
  if model_frames:
    path, line, func = model_frames[-1]
    where = f" at {path}:{line} (in {func})"
    owner = _module_for_source(model, path, func)
    if owner:
      where = f" in module {owner}{where}"
  first = str(error).strip().splitlines()[0] if str(error).strip() else (
      type(error).__name__)
  return f"torch.export cannot export {type(model).__name__}{where}: {first}"


def _module_for_source(model, path, func):
  """The first submodule path whose class is defined in `path` and has a
  method `func`."""
  import inspect
  for name, sub in model.named_modules():
    try:
      src = inspect.getsourcefile(type(sub))
    except TypeError:
      continue
    if src and os.path.abspath(src) == os.path.abspath(path) and hasattr(
        type(sub), func):
      return f"{name or '<root>'} ({type(sub).__name__})"
  return ""


def _checkpoint_shapes(source):
  """Tensor name -> shape in the checkpoint's safetensors (headers only);
  None when `source` has no safetensors."""
  from safetensors import safe_open
  files = checkpoint_files(source)
  if not files:
    return None
  shapes = {}
  for path in files:
    try:
      with safe_open(path, framework="pt") as f:
        for k in f.keys():
          shapes[k] = list(f.get_slice(k).get_shape())
    except Exception as e:  # pylint: disable=broad-except
      _fail(f"{path}: not a valid safetensors file ({_first_line(e)})")
  return shapes


def _tied_groups(model):
  """Names that share one parameter (tied embeddings), as lists."""
  groups = {}
  for name, p in model.named_parameters(remove_duplicate=False):
    groups.setdefault(id(p), []).append(name)
  return [g for g in groups.values() if len(g) > 1]


def checkpoint_layout(model, shapes):
  """How the checkpoint stores the model's tensors that it does not hold
  under their own names, from transformers' own conversion mapping (the one
  from_pretrained applies on load and save_pretrained reverses): model name
  -> pieces, each a checkpoint tensor and the box of the model tensor it
  fills (offsets and sizes per dimension; the checkpoint tensor is that box
  reshaped). A renamed tensor is one piece covering it; MoE experts saved
  one by one are stacked (MergeModulelist) and gate/up concatenated
  (Concatenate). Other conversion operations are refused."""
  try:
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (WeightConverter,
                                                 dot_natural_key,
                                                 rename_source_key)
  except ImportError:  # A transformers without conversion mappings.
    return {}
  conversions = get_model_conversion_mapping(model)
  renamings = [t for t in conversions if not isinstance(t, WeightConverter)]
  converters = [t for t in conversions if isinstance(t, WeightConverter)]
  state = model.state_dict()
  layout = {}
  groups = {}  # model name -> (converter, {source pattern: [names]})
  for key in sorted(shapes, key=dot_natural_key):
    target, pattern = rename_source_key(key, renamings, converters,
                                        model.base_model_prefix, state)
    if target not in state:
      continue  # Not the model's (unused checkpoint tensors stay out).
    if pattern is None:
      if target != key:
        layout[target] = [{"name": key, "offsets": [0] * len(shapes[key]),
                           "sizes": shapes[key]}]
      continue
    conv = next(c for c in converters if pattern in c.source_patterns)
    groups.setdefault(target, (conv, {}))[1].setdefault(pattern,
                                                        []).append(key)
  for target, (conv, by_pattern) in groups.items():
    ops = list(conv.operations)
    kinds = [type(op).__name__ for op in ops]
    if not (kinds in (["MergeModulelist"],
                      ["MergeModulelist", "Concatenate"])):
      _fail(f"{target}: transformers builds it from the checkpoint with "
            f"{' + '.join(kinds)}, which tracecut cannot map back to the "
            "checkpoint's tensors (supported: MergeModulelist, then "
            "Concatenate)")
    stack = ops[0].dim
    cat = ops[1].dim if len(ops) > 1 else None
    pieces = []
    along = 0  # Where the current source pattern starts along `cat`.
    for pattern in conv.source_patterns:
      names = by_pattern.get(pattern, [])
      if not names:
        _fail(f"{target}: the checkpoint has no tensor for "
              f"'{pattern}' (needed with "
              f"{', '.join(conv.source_patterns)})")
      first = shapes[names[0]]
      for e, name in enumerate(names):
        if shapes[name] != first:
          _fail(f"{name}: shape {shapes[name]}, but {names[0]} has {first}")
        sizes = list(first)
        sizes.insert(stack, 1)
        offsets = [0] * len(sizes)
        offsets[stack] = e
        if cat is not None:
          offsets[cat] += along
        pieces.append({"name": name, "offsets": offsets, "sizes": sizes})
      stacked = list(first)
      stacked.insert(stack, len(names))
      if cat is not None:
        along += stacked[cat]
    shape = list(state[target].shape)
    covered = [max(p["offsets"][d] + p["sizes"][d] for p in pieces)
               for d in range(len(shape))]
    if covered != shape:
      _fail(f"{target}: the checkpoint's tensors "
            f"({pieces[0]['name']}, ...) make shape {covered}, the model's "
            f"is {shape}")
    layout[target] = pieces
  # Only what the model reads (a tied alias of a stored name needs none).
  return {k: layout[k] for k in sorted(layout, key=dot_natural_key)}


def _check_meta_names(model, source, shapes, tied, layout):
  """--meta reads weights by name: every parameter must be in the
  checkpoint under its own name, a tied one's, or through the layout."""
  if shapes is None:
    _fail(f"{source}: --meta reads the weights from the checkpoint's "
          "safetensors, and this directory has no model.safetensors or "
          "model.safetensors.index.json")
  alias = {n: g for g in tied for n in g}
  missing = [n for n, _ in model.named_parameters()
             if n not in shapes and n not in layout and
             not any(a in shapes or a in layout for a in alias.get(n, []))]
  if missing:
    _fail(f"{source}: --meta reads the weights by name, but the checkpoint "
          f"has no tensor for {len(missing)} of the model's parameters "
          f"(e.g. '{missing[0]}'), not even through transformers' "
          "conversion mapping; export without --meta")


def _export_dynamic(model, kwargs, specs):
  """torch.export with the batch dimension (and the sequence dimension of
  token inputs) dynamic where the model allows; dimensions the model fixes
  are specialised (Dim.AUTO), so calibration batches of another size run."""
  import torch
  auto = torch.export.Dim.AUTO
  dynamic = {k: None for k in kwargs}
  for s in specs:
    dims = {0: auto}
    if s["kind"] == "tokens":
      dims[1] = auto
    dynamic[s["name"]] = dims
  try:
    return torch.export.export(model, (), kwargs, dynamic_shapes=dynamic,
                               strict=False)
  except Exception:  # pylint: disable=broad-except
    # Some models cannot keep any dimension symbolic: export them static.
    return torch.export.export(model, (), kwargs, strict=False)


def export(source, output, torchscript=False, batch=2, seq_len=16,
           class_name=None, random_weights=False, seed=0, meta=False):
  import torch
  import transformers
  if meta and torchscript:
    _fail("--meta and --torchscript exclude each other (a TorchScript file "
          "holds its weights)")
  check_output(output, source)
  model, config, buffers = build_model(source, class_name, random_weights,
                                       seed, meta)
  specs = input_specs(model, config, batch, seq_len)
  inputs = make_inputs(specs, meta=meta)
  tied = _tied_groups(model)
  shapes = _checkpoint_shapes(source) if os.path.isdir(source) else None
  layout = checkpoint_layout(model, shapes) if shapes else {}
  if meta:
    _check_meta_names(model, source, shapes, tied, layout)
  files = {
      "config.json": config.to_json_string(use_diff=False),
      # "outputs" is filled in once they are known.
      "tracecut_inputs.json": None,
      "tracecut_model.json": json.dumps({
          "model_class": type(model).__name__,
          "no_split_modules": list(model._no_split_modules or []),
          "tied_parameters": tied,
          # Model tensors the checkpoint stores under other names or split
          # (checkpoint/layout.h).
          "checkpoint_layout": layout,
          "exporter": (f"tracecut_export (torch {torch.__version__}, "
                       f"transformers {transformers.__version__})"),
      }, indent=1),
  }
  if buffers is not None:
    import base64
    from safetensors.torch import save
    files["tracecut_buffers.safetensors.b64"] = base64.b64encode(
        save(buffers)).decode("ascii")
  kwargs = dict(inputs)
  if "use_cache" in _forward_params(model):
    kwargs["use_cache"] = False
  with torch.no_grad():
    if torchscript:
      try:
        traced = torch.jit.trace(model, example_kwarg_inputs=kwargs,
                                 strict=False, check_trace=False)
      except Exception as e:  # pylint: disable=broad-except
        _fail(_explain(model, e).replace("torch.export", "torch.jit.trace"))
      files["tracecut_inputs.json"] = json.dumps(
          {"inputs": specs, "outputs": output_names(model, inputs)}, indent=1)
      program = traced
    else:
      try:
        ep = _export_dynamic(model, kwargs, specs)
        # Exported under no_grad, the program has no grad-mode regions;
        # other higher-order operators (autocast regions) go away in the
        # inference IR, which costs about twice the export itself, so only
        # when needed.
        if any(n.op == "call_function" and
               isinstance(n.target, torch._ops.HigherOrderOperator)
               for n in ep.graph.nodes):
          ep = ep.run_decompositions({})
      except ExportError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        _fail(_explain(model, e))
      files["tracecut_inputs.json"] = json.dumps(
          {"inputs": specs, "outputs": program_output_names(ep)}, indent=1)
      program = ep
  write_output(program, output, files, torchscript)
  return model, inputs


def check_output(output, source):
  """Fails before any work when writing `output` would destroy a user's
  file: it is a directory, a file of the source checkpoint (its weights,
  config or index), or any existing file that is not an earlier export."""
  if not output or output.endswith("/"):
    _fail(f"-o '{output}': not a file path")
  if os.path.isdir(output):
    _fail(f"cannot write '{output}': it is a directory")
  parent = os.path.dirname(os.path.abspath(output))
  if not os.path.isdir(parent):
    _fail(f"cannot write '{output}': '{parent}' is not an existing directory")
  # Permission bits do not stop root, and /proc refuses new files whatever
  # they say: create (and remove) one to know, before the export's work.
  try:
    probe = tempfile.NamedTemporaryFile(dir=parent, prefix=".tracecut-probe.")
    probe.close()
  except OSError as e:
    _fail(f"cannot write '{output}': cannot create a file in '{parent}' "
          f"({e.strerror or e})")
  if not os.path.lexists(output):
    return
  if os.path.isdir(source) and os.path.exists(output):
    real = os.path.realpath(output)
    for name in os.listdir(source):
      path = os.path.join(source, name)
      if (not name.endswith((".pt2", ".pt")) and os.path.isfile(path) and
          os.path.samefile(path, real)):
        _fail(f"refusing to write '{output}': it is '{name}' of the input "
              f"checkpoint '{source}'; choose another output path")
  try:
    mode = os.lstat(output).st_mode
    with open(output, "rb") as f:
      magic = f.read(4) if stat.S_ISREG(mode) else b""
  except OSError as e:
    _fail(f"cannot write '{output}': {e.strerror}")
  if (not stat.S_ISREG(mode) or magic != b"PK\x03\x04" or
      not output.endswith((".pt2", ".pt"))):
    _fail(f"refusing to replace '{output}': it exists and is not an earlier "
          "export (a .pt2 or .pt archive); remove it or choose another path")


def _remove_stale_temporaries(output):
  """Temporaries that killed exports left beside `output`
  (".NAME.PID.tmp.pt2" whose process is gone)."""
  parent = os.path.dirname(os.path.abspath(output))
  pattern = re.compile(r"^\." + re.escape(os.path.basename(output)) +
                       r"\.(\d+)\.tmp\.pt2$")
  for name in os.listdir(parent):
    m = pattern.match(name)
    if not m:
      continue
    try:
      os.kill(int(m.group(1)), 0)
      continue  # Still running: another export's.
    except ProcessLookupError:
      pass
    except OSError:
      continue
    try:
      os.remove(os.path.join(parent, name))
    except OSError:
      pass


def write_output(program, output, files, torchscript):
  """Serializes `program` in memory (LibTorch's file writer throws from
  its destructor after a failed write, which aborts), then writes it beside
  `output` and renames it into place; a full disk or read-only directory is
  an error naming `output`, and nothing is left behind."""
  import io
  import torch
  buffer = io.BytesIO()
  if torchscript:
    torch.jit.save(program, buffer, _extra_files=files)
  else:
    torch.export.save(program, buffer, extra_files=files)
  data = buffer.getbuffer()
  _remove_stale_temporaries(output)
  tmp = os.path.join(os.path.dirname(os.path.abspath(output)),
                     f".{os.path.basename(output)}.{os.getpid()}.tmp.pt2")
  try:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                 0o666)
    try:
      view = memoryview(data)
      while view:
        view = view[os.write(fd, view):]
      os.fsync(fd)
    finally:
      os.close(fd)
    os.replace(tmp, output)
  except OSError as e:
    _fail(f"cannot write '{output}': {e.strerror or e}")
  finally:
    if os.path.lexists(tmp):
      try:
        os.remove(tmp)
      except OSError:
        pass


def main(argv=None):
  p = argparse.ArgumentParser(
      prog="tracecut export",
      description=("Export a Hugging Face transformers model (checkpoint "
                   "directory or model id in the local cache) to a "
                   "torch.export .pt2 that tracecut reads."))
  p.add_argument("model", metavar="HF_DIR_OR_MODEL_ID")
  p.add_argument("-o", "--output", required=True, metavar="OUT.pt2")
  p.add_argument("--torchscript", action="store_true",
                 help="write a TorchScript .pt (torch.jit.trace) instead")
  p.add_argument("--batch", type=int, default=2,
                 help="batch size of the example inputs (default 2)")
  p.add_argument("--seq-len", type=int, default=16,
                 help="sequence length of the example inputs (default 16)")
  p.add_argument("--class", dest="class_name", default=None,
                 help="transformers class to build (default: config.json's "
                 "architectures[0])")
  p.add_argument("--meta", action="store_true",
                 help="build and export on the meta device: no weight is "
                 "read; tracecut reads them from the checkpoint's "
                 "safetensors next to OUT.pt2 when it loads the program")
  p.add_argument("--random-weights", action="store_true",
                 help="seeded random weights instead of the checkpoint's")
  p.add_argument("--seed", type=int, default=0,
                 help="seed of --random-weights (default 0)")
  a = p.parse_args(argv)
  if a.batch < 1 or a.seq_len < 1:
    p.error("--batch and --seq-len must be >= 1")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
  os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
  signal.signal(signal.SIGTERM, _on_signal)
  code, message = EXIT_ERROR, None
  try:
    export(a.model, a.output, a.torchscript, a.batch, a.seq_len, a.class_name,
           a.random_weights, a.seed, a.meta)
    code, message = 0, f"wrote {a.output}"
  except ExportError as e:
    message = str(e)
  except Stopped as e:
    code, message = 128 + e.signum, f"stopped by signal {e.signum}"
  except KeyboardInterrupt:
    code, message = 128 + signal.SIGINT, "interrupted"
  except MemoryError:
    message = (f"out of memory exporting '{a.model}' (check the config's "
               "sizes, or export with --meta)")
  except OSError as e:
    where = f"'{e.filename}': " if e.filename else ""
    cause = e.strerror or _first_line(e)
    if e.errno == errno.ENOSPC:
      cause = "no space left on device"
    message = f"{where}{cause}"
  except Exception as e:  # pylint: disable=broad-except
    # The contract is one line: the cause, never a traceback.
    message = f"cannot export '{a.model}': {type(e).__name__}: {_first_line(e)}"
  print(f"tracecut export: {message}".replace("\n", " "), file=sys.stderr)
  return code


class Stopped(BaseException):
  """SIGTERM, raised where Python was so that cleanups run."""

  def __init__(self, signum):
    super().__init__(signum)
    self.signum = signum


def _on_signal(signum, _frame):
  raise Stopped(signum)


if __name__ == "__main__":
  sys.exit(main())
