"""The model `tracecut export` exports: its config, checked before any model is
built, the transformers class to build, and the model itself (with the
checkpoint's weights, seeded random ones, or on the meta device)."""

import contextlib
import json
import os

from tracecut_export_errors import _fail
from tracecut_export_layout import checkpoint_files, resolve_inside


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


def _computes_linear(cls):
  """Whether modules of `cls`, a subclass of torch.nn.Linear, compute
  exactly F.linear from Linear's own state: its forward is run on a plain
  Linear's weight and bias (with and without bias), bypassing the
  subclass's __init__, so a forward reading any other state fails or
  differs."""
  import torch
  if cls.forward is torch.nn.Linear.forward:
    return True
  g = torch.Generator().manual_seed(0)
  for bias in (True, False):
    probe = torch.nn.Linear(6, 4, bias=bias)
    with torch.no_grad():
      probe.weight.copy_(torch.randn(4, 6, generator=g))
      if bias:
        probe.bias.copy_(torch.randn(4, generator=g))
    x = torch.randn(3, 6, generator=g)
    try:
      probe.__class__ = cls
      with torch.no_grad():
        got = cls.forward(probe, x)
    except Exception:  # pylint: disable=broad-except
      return False
    want = torch.nn.functional.linear(x, probe.weight, probe.bias)
    if (not isinstance(got, torch.Tensor) or got.shape != want.shape or
        not torch.allclose(got, want, rtol=1e-5, atol=1e-6)):
      return False
  return True


def as_plain_linears(model):
  """Makes every module of a torch.nn.Linear subclass that computes exactly
  F.linear (Falcon's FalconLinear: x @ W.T + b) a plain Linear, so the
  graph has it as a Linear that tracecut quantizes, as llm-compressor does
  (compressed-tensors matches its "Linear" targets by class ancestry). Other
  subclasses (Llama4's router, which also routes) are left alone."""
  import sys
  import torch
  verdicts, made = {}, {}
  for module in model.modules():
    cls = type(module)
    if cls is torch.nn.Linear or not isinstance(module, torch.nn.Linear):
      continue
    if cls not in verdicts:
      verdicts[cls] = _computes_linear(cls)
    if verdicts[cls]:
      module.__class__ = torch.nn.Linear
      made[cls.__name__] = made.get(cls.__name__, 0) + 1
  for name, count in sorted(made.items()):
    print(f"tracecut export: note: {count} {name} modules (a torch.nn.Linear "
          "subclass computing F.linear) are exported as Linear, so "
          "calibration quantizes them; transformers 5.17 cannot load packed "
          "compressed-tensors weights of such modules when the model's "
          "_init_weights reads their .weight (FalconForCausalLM's does; "
          "the TorchScript output, --format=torchscript, loads)",
          file=sys.stderr)
  return model


def _has_weights(directory):
  if not os.path.isdir(directory):
    return True  # A model id in the cache: from_pretrained finds them.
  return any(
      f.endswith(".safetensors") or f.endswith(".bin")
      for f in os.listdir(directory))


def _torch_dtype(name, config):
  """The torch dtype `name` (a --dtype value) stands for with `config`;
  "auto": config.json's dtype, float32 when it names none."""
  import torch
  if name == "auto":
    name = str(getattr(config, "dtype", None) or
               getattr(config, "torch_dtype", None) or "float32")
    name = name.replace("torch.", "")
  if name not in ("float32", "bfloat16", "float16"):
    _fail(f"dtype '{name}' (config.json's): a program computes in float32, "
          "bfloat16 or float16")
  return getattr(torch, name)


@contextlib.contextmanager
def _default_dtype(dtype):
  """Modules built inside make their parameters in `dtype`, as
  transformers' from_pretrained(dtype=...) does (buffers a module computes
  in float32 on purpose, like rotary inv_freq, stay float32)."""
  import torch
  old = torch.get_default_dtype()
  torch.set_default_dtype(dtype)
  try:
    yield
  finally:
    torch.set_default_dtype(old)


def build_model(source, class_name=None, random_weights=False, seed=0,
                meta=False, dtype="float32"):
  """The transformers model of `source`, in eval mode on the CPU, computing
  in `dtype` (a --dtype value); with `meta`, on the meta device (no weight
  read or allocated), plus the real values of its buffers (which
  checkpoints do not hold when non-persistent, e.g. rotary inv_freq)."""
  import torch
  config = _load_config(source)
  torch_dtype = _torch_dtype(dtype, config)
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
    with init_empty_weights(include_buffers=False), _large_on_meta_mode(), \
        _default_dtype(torch_dtype):
      shell = cls(config)
    buffers = {n: b.detach().contiguous().clone()
               for n, b in shell.named_buffers() if b.device.type != "meta"}
    with torch.device("meta"), _default_dtype(torch_dtype):
      model = cls(config)
    return model.eval(), config, buffers
  if random_weights or not _has_weights(source):
    if not random_weights:
      _fail(f"{source}: no *.safetensors or *.bin weights in this directory; "
            "give --random-weights to export with seeded random weights")
    torch.manual_seed(seed)
    with _default_dtype(torch_dtype):
      model = cls(config)
  else:
    if os.path.isdir(source):
      checkpoint_files(source)  # Every shard inside, before transformers.
    try:
      model = cls.from_pretrained(
          source, config=config, local_files_only=True, dtype=torch_dtype)
    except (OSError, ValueError, RuntimeError) as e:
      _fail(f"{source}: cannot load the weights of {cls.__name__}: "
            f"{str(e).strip().splitlines()[0]}")
  return model.eval(), config, None
