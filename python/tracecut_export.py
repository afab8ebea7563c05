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

This file is the command line (flags, exit codes, signals); the work is in
its sibling modules, imported from the script's directory:

  tracecut_export_model.py    config checks, the class, build_model
  tracecut_export_inputs.py   example-input descriptions and output names
  tracecut_export_layout.py   the checkpoint's files (resolve_inside), shapes,
                              tied parameters and checkpoint_layout
  tracecut_export_program.py  export: torch.export / torch.jit.trace
  tracecut_export_output.py   check_output and the atomic write_output
  tracecut_export_cache.py    the export cache of --meta exports
  tracecut_export_errors.py   ExportError
"""

import argparse
import errno
import os
import signal
import sys

# The exporter's functions, importable from here as before the split.
from tracecut_export_errors import ExportError, _first_line
from tracecut_export_inputs import (input_specs, make_inputs, output_names,
                                    program_output_names)
from tracecut_export_layout import (checkpoint_files, checkpoint_layout,
                                    resolve_inside)
from tracecut_export_model import build_model, check_config_values
import tracecut_export_cache as export_cache
from tracecut_export_output import check_output, write_bytes, write_output
from tracecut_export_program import export

__all__ = [
    "EXIT_ERROR", "EXIT_USAGE", "ExportError", "Stopped", "build_model",
    "check_config_values", "check_output", "checkpoint_files",
    "checkpoint_layout", "export", "input_specs", "main", "make_inputs",
    "output_names", "program_output_names", "resolve_inside", "write_output"
]

EXIT_ERROR = 1
EXIT_USAGE = 2


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
  p.add_argument("--dtype", default="float32",
                 choices=["float32", "bfloat16", "float16", "auto"],
                 help="what the program computes in (default float32; auto: "
                 "config.json's dtype, as transformers loads it)")
  p.add_argument("--no-cache", action="store_true",
                 help="export even when the export cache holds an export of "
                 "the same inputs (--meta exports are cached under "
                 "$TRACECUT_CACHE_DIR/export, default "
                 "~/.cache/tracecut/export)")
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
    key = _cache_key(a)
    cached = export_cache.fetch(key)
    if cached is None:
      export(a.model, a.output, a.torchscript, a.batch, a.seq_len,
             a.class_name, a.random_weights, a.seed, a.meta, a.dtype)
      export_cache.store(key, a.output)
      message = f"wrote {a.output}"
    else:
      write_bytes(cached, a.output)
      message = (f"wrote {a.output} (from the export cache: the same config, "
                 "safetensors layout, exporter and packages as an earlier "
                 "export; --no-cache exports again)")
    code = 0
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


def _cache_key(a):
  """The export cache's key (tracecut_export_cache.py) for a --meta export
  of a checkpoint directory, after the output checks a cached copy needs as
  much as an export; None when the export is not cached."""
  if not a.meta or a.torchscript or a.random_weights or a.no_cache:
    return None
  check_output(a.output, a.model)
  return export_cache.cache_key(a.model, a.batch, a.seq_len, a.class_name,
                                a.dtype)


class Stopped(BaseException):
  """SIGTERM, raised where Python was so that cleanups run."""

  def __init__(self, signum):
    super().__init__(signum)
    self.signum = signum


def _on_signal(signum, _frame):
  raise Stopped(signum)


if __name__ == "__main__":
  sys.exit(main())
