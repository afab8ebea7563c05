"""The example inputs of an export: their descriptions (tracecut_inputs.json),
the tensors made from them, and the names of the model's outputs."""

from tracecut_export_errors import _fail


# Elements of one example input (tracer/hf/inputs.cc: the same bound).
_MAX_INPUT_ELEMENTS = 1 << 26


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
