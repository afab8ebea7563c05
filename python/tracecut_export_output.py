"""Writing the exported program: checks that the output path may be written
(and replaced) before any work, and the atomic write beside it."""

import contextlib
import os
import re
import stat
import tempfile

from tracecut_export_errors import _fail


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
    with _no_canonical_form_check():
      torch.export.save(program, buffer, extra_files=files)
  write_bytes(buffer.getbuffer(), output)


@contextlib.contextmanager
def _no_canonical_form_check():
  """torch.export.save canonicalizes the serialized program only to test
  that its canonical form is well defined, and throws the result away; that
  test is a third of the save's time (2 s of a 32-layer Llama's export).
  The bytes written are the same without it."""
  from torch._export.serde import serialize
  check = getattr(serialize, "canonicalize", None)
  if check is None:
    yield
    return
  serialize.canonicalize = lambda ep, constants=None: ep
  try:
    yield
  finally:
    serialize.canonicalize = check


def write_bytes(data, output):
  """Writes `data` beside `output` and renames it into place (what
  write_output does with a program's bytes)."""
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
