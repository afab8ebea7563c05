"""The exporter's one error type: an ExportError is reported as one line
"tracecut export: MESSAGE" (see tracecut_export.py)."""


class ExportError(Exception):
  pass


def _fail(message):
  raise ExportError(message)


def _first_line(error):
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__
