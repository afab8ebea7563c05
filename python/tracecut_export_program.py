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
from tracecut_export_model import build_model
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


def _check_meta_constants(ep, buffers):
  """A tensor the model's code makes during forward on its parameters'
  device (a mask's fill value) is lifted as a constant, which a --meta export
  leaves without a value that tracecut could read: one error naming it and
  the code that made it, before anything is written."""
  for name, value in ep.constants.items():
    if (getattr(value, "device", None) is None or
        value.device.type != "meta" or name in buffers):
      continue
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


def _config_text(config):
  """config.json as transformers writes it, without the directory it was
  read from (`_name_or_path`, which save_pretrained leaves out too): a
  --meta export then depends on the checkpoint's contents only
  (tracecut_export_cache.py), and an output's config.json does not name
  where its input was."""
  data = json.loads(config.to_json_string(use_diff=False))
  data.pop("_name_or_path", None)
  return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _no_split_modules(model):
  """The model class's _no_split_modules as a list, in a fixed order."""
  names = model._no_split_modules or []
  if isinstance(names, (set, frozenset)):
    return sorted(names)
  return list(names)


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
      "config.json": _config_text(config),
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
      if meta:
        _check_meta_constants(ep, buffers or {})
      files["tracecut_inputs.json"] = json.dumps(
          {"inputs": specs, "outputs": program_output_names(ep)}, indent=1)
      program = ep
  write_output(program, output, files, torchscript)
  return model, inputs
