"""The export itself: the model, its example inputs and the checkpoint's layout
to a torch.export program (or a TorchScript trace) with tracecut's files
embedded; a failure of torch.export is explained in one line."""

import json
import os
import re
import traceback

from tracecut_export_errors import ExportError, _fail
from tracecut_export_inputs import (_forward_params, input_specs, make_inputs,
                                    output_names, program_output_names)
from tracecut_export_layout import (_check_meta_names, _checkpoint_shapes,
                                    _tied_groups, checkpoint_layout)
from tracecut_export_model import _load_config, as_plain_linears, build_model
from tracecut_export_output import check_output, write_output


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')
# The exporter's own files, whose frames are never the model code at fault.
_OWN_FILES = ("tracecut_export.py", "tracecut_export_errors.py",
              "tracecut_export_inputs.py", "tracecut_export_layout.py",
              "tracecut_export_model.py", "tracecut_export_output.py",
              "tracecut_export_program.py")


def _explain(model, error):
  """One line naming where in model code torch.export failed."""
  text = "".join(traceback.format_exception(error))
  frames = _FRAME.findall(text)
  # The innermost frame in model code (not torch's own machinery).
  model_frames = [
      f for f in frames if "/torch/" not in f[0] and "/_dynamo/" not in f[0]
      and not f[0].endswith(_OWN_FILES)
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


def _export_program(model, kwargs, specs):
  import torch
  ep = _export_dynamic(model, kwargs, specs)
  # Exported under no_grad, the program has no grad-mode regions; other
  # higher-order operators (autocast regions) go away in the inference IR,
  # which costs about twice the export itself, so only when needed.
  if any(n.op == "call_function" and
         isinstance(n.target, torch._ops.HigherOrderOperator)
         for n in ep.graph.nodes):
    ep = ep.run_decompositions({})
  return ep


# The token lengths sequence_lengths tries.
_MAX_SCANNED_LENGTH = 8192


def sequence_lengths(ep, specs):
  """The token-sequence lengths the program is valid for, as [[min, max],
  ...] (max None: unbounded), or None when every length from 1 to
  _MAX_SCANNED_LENGTH is. torch.export keeps the guards it assumed
  (ep._guards_code, Python expressions over the inputs' sizes), and a model
  whose code loops over chunks of the sequence (a gated delta rule, a Mamba
  scan) is unrolled for the example's length: such a program computes wrong
  values, with no error, for lengths its guards exclude. Each length is
  tried with the example's other sizes."""
  guards = [g for g in (getattr(ep, "_guards_code", None) or [])
            if "size()[1]" in g]
  tokens = [s["name"] for s in specs if s["kind"] == "tokens"]
  if not guards or not tokens:
    return None

  class Sized:
    def __init__(self, shape):
      self.shape = tuple(shape)

    def size(self):
      return self.shape

  import torch
  try:
    code = [compile(g, "<guard>", "eval") for g in guards]
  except SyntaxError:
    return None

  class Inputs(dict):
    # Inputs tracecut makes from the tokens (attention_mask, position_ids)
    # have the tokens' shape.
    def __missing__(self, name):
      return self[tokens[0]]

  valid = []
  for length in range(1, _MAX_SCANNED_LENGTH + 1):
    inputs = Inputs({s["name"]: Sized([s["shape"][0], length] + s["shape"][2:]
                                      if s["name"] in tokens else s["shape"])
                     for s in specs})
    try:
      env = {"L": inputs, "torch": torch}
      ok = all(eval(c, env) for c in code)  # pylint: disable=eval-used
    except Exception:  # pylint: disable=broad-except
      return None  # Guards over something else than the inputs' sizes.
    valid.append(bool(ok))
  if all(valid):
    return None
  ranges = []
  for length, ok in enumerate(valid, start=1):
    if ok and ranges and ranges[-1][1] == length - 1:
      ranges[-1][1] = length
    elif ok:
      ranges.append([length, length])
  # Valid up to the last length tried over a long stretch: valid beyond it
  # too. A periodic pattern (a scan valid at multiples of its chunk) stays
  # bounded: longer samples are refused.
  if (ranges and ranges[-1][1] == _MAX_SCANNED_LENGTH and
      ranges[-1][0] <= _MAX_SCANNED_LENGTH // 2):
    ranges[-1][1] = None
  return ranges


def _meta_constants(ep, buffers):
  """The names of the lifted constants of `ep` that are on the meta device
  and are not buffers (whose values the export embeds)."""
  return [
      name for name, value in ep.constants.items()
      if getattr(value, "device", None) is not None and
      value.device.type == "meta" and name not in buffers
  ]


def _on_unallocated_cpu(model, buffers, specs, kwargs):
  """`model` with its parameters on the CPU but never written (torch.empty:
  the kernel maps their pages only when touched, and torch.export traces
  with fake tensors, so a model of any size costs no memory), tied ones
  still tied, its buffers' real values restored; and `kwargs` with CPU
  example inputs."""
  import torch
  # Module.to_empty would give each module its own copy of a tied
  # parameter: the memo keeps tied tensors one tensor.
  memo = {}
  for module in model.modules():
    for table in (module._parameters, module._buffers):
      for key, t in list(table.items()):
        if t is None:
          continue
        if id(t) not in memo:
          new = torch.empty_like(t, device="cpu")
          if isinstance(t, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
          memo[id(t)] = new
        table[key] = memo[id(t)]
  for name, value in buffers.items():
    model.get_buffer(name).copy_(value)
  inputs = make_inputs(specs)
  return model, {k: inputs.get(k, v) for k, v in kwargs.items()}


def _weights_to_meta(ep, buffers):
  """`ep` with its parameters and buffers on the meta device, as a --meta
  export has them (tracecut reads them from the checkpoint and the embedded
  buffers); the constants the forward made keep their values."""
  import torch
  memo = {}  # Tied parameters stay one tensor.
  for name, value in list(ep.state_dict.items()):
    if id(value) not in memo:
      meta = torch.empty_like(value, device="meta")
      if isinstance(value, torch.nn.Parameter):
        meta = torch.nn.Parameter(meta, requires_grad=value.requires_grad)
      memo[id(value)] = meta
    ep.state_dict[name] = memo[id(value)]
  for name in list(ep.constants):
    if name in buffers:
      ep.constants[name] = torch.empty_like(ep.constants[name], device="meta")
  return ep


def _check_meta_constants(ep, buffers):
  """A constant still on the meta device after the CPU re-export (made
  from a parameter's value, say) has no value that tracecut could read: one
  error naming it and the code that made it, before anything is written."""
  for name in _meta_constants(ep, buffers):
    where = ""
    placeholder = next(
        (s.arg.name for s in ep.graph_signature.input_specs
         if getattr(s, "target", None) == name), None)
    for node in ep.graph.nodes:
      if placeholder and any(getattr(a, "name", None) == placeholder
                             for a in node.args):
        frames = _FRAME.findall(node.meta.get("stack_trace") or "")
        if frames:
          path, line, func = frames[-1]
          where = f" (made in {func} at {path}:{line})"
        break
    _fail(f"--meta cannot export this model: its forward makes tensor "
          f"constant '{name}'{where} on the meta device, where it has no "
          "value; export without --meta")


def _config_text(config, use_cache):
  """config.json as transformers writes it, without the directory it was
  read from (`_name_or_path`, which save_pretrained leaves out too): a
  --meta export then depends on the checkpoint's contents only
  (tracecut_export_cache.py), and an output's config.json does not name
  where its input was."""
  data = json.loads(config.to_json_string(use_diff=False))
  data.pop("_name_or_path", None)
  if "use_cache" in data:
    # build_model turns the KV cache off for the export; the checkpoint's
    # value is what a calibrated output's config.json must keep (generate
    # without a cache recomputes every token's past).
    data["use_cache"] = use_cache
  return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _no_split_modules(model):
  """The model class's _no_split_modules as a list, in a fixed order."""
  names = model._no_split_modules or []
  if isinstance(names, (set, frozenset)):
    return sorted(names)
  return list(names)


def export(source, output, torchscript=False, batch=2, seq_len=16,
           class_name=None, random_weights=False, seed=0, meta=False,
           dtype="float32"):
  import torch
  import transformers
  if meta and torchscript:
    _fail("--meta and --torchscript exclude each other (a TorchScript file "
          "holds its weights)")
  check_output(output, source)
  use_cache = getattr(_load_config(source), "use_cache", True)
  model, config, buffers = build_model(source, class_name, random_weights,
                                       seed, meta, dtype)
  as_plain_linears(model)
  specs = input_specs(model, config, batch, seq_len)
  # Floating inputs (images, audio) in the dtype the program computes in.
  computes = str(next(model.parameters()).dtype).replace("torch.", "")
  for s in specs:
    if s["dtype"] == "float32":
      s["dtype"] = computes
  inputs = make_inputs(specs, meta=meta)
  tied = _tied_groups(model)
  shapes = _checkpoint_shapes(source) if os.path.isdir(source) else None
  layout = checkpoint_layout(model, shapes) if shapes else {}
  if meta:
    _check_meta_names(model, source, shapes, tied, layout)
  files = {
      "config.json": _config_text(config, use_cache),
      # "outputs" is filled in once they are known.
      "tracecut_inputs.json": None,
      "tracecut_model.json": json.dumps({
          "model_class": type(model).__name__,
          # Sorted when transformers keeps them in a set (composite models):
          # a set's order changes from run to run, and so would the file.
          "no_split_modules": _no_split_modules(model),
          "tied_parameters": tied,
          # compressed-tensors matches a "Linear" target by class ancestry:
          # modules of Linear's subclasses (FalconLinear, Llama4Router) that
          # tracecut leaves unquantized go on the output's ignore list.
          "linear_subclasses": sorted(
              n for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and
              type(m) is not torch.nn.Linear),
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
        ep = _export_program(model, kwargs, specs)
        if meta and _meta_constants(ep, buffers or {}):
          # The forward makes tensors on its parameters' device (a mask's
          # fill value, an index): exported on the CPU they get values.
          model, kwargs = _on_unallocated_cpu(model, buffers or {}, specs,
                                              kwargs)
          ep = _weights_to_meta(_export_program(model, kwargs, specs),
                                buffers or {})
      except ExportError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        _fail(_explain(model, e))
      if meta:
        _check_meta_constants(ep, buffers or {})
      described = {"inputs": specs, "outputs": program_output_names(ep)}
      seq_lens = sequence_lengths(ep, specs)
      if seq_lens is not None:
        described["seq_lens"] = seq_lens
      files["tracecut_inputs.json"] = json.dumps(described, indent=1)
      program = ep
  write_output(program, output, files, torchscript)
  return model, inputs
