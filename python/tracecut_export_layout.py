"""The checkpoint's side of `tracecut export`: its safetensors files (untrusted
input: each must be a regular file inside the checkpoint directory), their
tensor shapes, the model's tied parameters, and how the checkpoint stores the
model's tensors (checkpoint_layout, which tracecut reads back through
checkpoint/layout.h)."""

import json
import os
import stat

from tracecut_export_errors import _fail, _first_line


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


def _expert_numbers(names):
  """The expert number of each name (the one dotted component in which the
  names differ, all digits), or None when there is no such component."""
  parts = [n.split(".") for n in names]
  if len({len(p) for p in parts}) != 1:
    return None
  if len(parts) == 1:
    return [0]
  differ = [i for i in range(len(parts[0]))
            if len({p[i] for p in parts}) > 1]
  if len(differ) != 1 or not all(p[differ[0]].isdigit() for p in parts):
    return None
  return [int(p[differ[0]]) for p in parts]


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
      count = state[target].shape[stack]
      if len(names) != count or _expert_numbers(names) != list(range(count)):
        _fail(f"{target}: the checkpoint has {len(names)} tensors for "
              f"'{pattern}' ({', '.join(names[:4])}"
              f"{', ...' if len(names) > 4 else ''}), the model stacks "
              f"{count}, one per expert 0..{count - 1}")
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
