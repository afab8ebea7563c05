"""The HTML reports, rendered by a real browser (GitHub issue 34).

The Llama fixture is calibrated (GPTQ W4 g128 on synthetic data) with
`--report` and `--html`; `tracecut report` makes the same page from the JSON
alone, byte for byte. The BERT fixture goes through `tracecut debug
--html` with a tolerance the tanh approximation of GELU exceeds. Each page
is rendered by headless Chromium (Debian's `chromium`, which
tools/bootstrap.sh installs for this test) with networking off:

* the screenshot is a PNG of the window's size that is not blank (many
  colours, and the bar colours of the charts among them);
* the rendered DOM's text holds every quantized module's path, its error
  and round-to-nearest's as the report gives them (4 significant digits),
  the subgraphs with their node counts and parameter bytes, the timings, the
  peak memory, and for the debugger each pass, subgraph and error;
* the page loads nothing: no src/href to anything but itself, no script.

    report_browser_test.py TRACECUT LLAMA.pt RECIPE BERT.pt
"""

import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from PIL import Image

WINDOW = (1200, 2000)
BAR_BLUE = (0x34, 0x61, 0xC1)  # .c0 in report_html_internal.cc
BAR_ORANGE = (0xF0, 0xA8, 0x1E)  # .c1


def run(cmd, timeout=600):
  p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  if p.returncode != 0:
    raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}:\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
  return p


class Text(html.parser.HTMLParser):
  """The text of a document, without <style> and <title> contents."""

  def __init__(self):
    super().__init__()
    self.parts = []
    self.skip = 0

  def handle_starttag(self, tag, attrs):
    if tag in ("style", "title"):
      self.skip += 1

  def handle_endtag(self, tag):
    if tag in ("style", "title"):
      self.skip -= 1

  def handle_data(self, data):
    if not self.skip:
      self.parts.append(data)


def page_text(dom):
  t = Text()
  t.feed(dom)
  return " ".join(" ".join(t.parts).split())


def chromium_binary():
  for name in ("chromium", "chromium-browser"):
    path = shutil.which(name)
    if path:
      return path
  raise AssertionError("no chromium on PATH: tools/bootstrap.sh installs "
                       "Debian's chromium for this test")


def render(chromium, page, work):
  """Screenshot and rendered DOM of `page` in headless Chromium."""
  shot = os.path.join(work, os.path.basename(page) + ".png")
  common = [
      chromium, "--headless", "--no-sandbox", "--disable-gpu",
      "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync",
      "--disable-dev-shm-usage",
      "--user-data-dir=" + tempfile.mkdtemp(dir=work),
      f"--window-size={WINDOW[0]},{WINDOW[1]}"
  ]
  run(common + ["--screenshot=" + shot, "file://" + page], timeout=180)
  dom = run(common + ["--dump-dom", "file://" + page], timeout=180).stdout
  return shot, dom


def check_screenshot(shot):
  with Image.open(shot) as im:
    im.load()
    assert im.size == WINDOW, (shot, im.size)
    rgb = im.convert("RGB")
  colours = rgb.getcolors(maxcolors=1 << 20)
  assert colours is not None and len(colours) > 20, (
      f"{shot}: {0 if colours is None else len(colours)} colours: blank?")
  counts = {c: n for n, c in colours}
  most = max(counts.values())
  assert most < 0.98 * WINDOW[0] * WINDOW[1], f"{shot}: one colour covers it"
  for bar in (BAR_BLUE, BAR_ORANGE):
    assert counts.get(bar, 0) > 500, (shot, bar, counts.get(bar, 0))
  print(f"{os.path.basename(shot)}: {im.size[0]}x{im.size[1]}, "
        f"{len(colours)} colours, chart bars drawn "
        f"({counts[BAR_BLUE]} + {counts[BAR_ORANGE]} px)")


def check_self_contained(page):
  with open(page) as f:
    text = f.read()
  assert "<script" not in text.lower(), "a script in the page"
  refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", text, re.I)
  assert not refs, f"the page refers to {refs}"
  assert "url(" not in text and "@import" not in text, "CSS loads something"


def human_bytes(b):
  """util::HumanBytes."""
  if b < 1024:
    return f"{b} B"
  v, u = float(b), 0
  while v >= 1024 and u < 5:
    v /= 1024
    u += 1
  return f"{v:.1f} {['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'][u]}"


def seconds(s):
  return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def expect(text, needle, what):
  assert needle in text, f"{what}: '{needle}' not in the rendered page"


def check_calibration(tracecut, chromium, llama, recipe, work):
  model = os.path.join(work, "llama-gptq.pt")
  report_path = os.path.join(work, "llama-gptq.report.json")
  page = os.path.join(work, "llama-gptq.html")
  run([tracecut, "calibrate", llama, "--recipe=" + recipe, "--synthetic=16",
       "--batch-size=4", "-o", model, "--report=" + report_path,
       "--html=" + page])
  with open(report_path) as f:
    report = json.load(f)
  again = os.path.join(work, "again.html")
  run([tracecut, "report", report_path, "-o", again])
  with open(page, "rb") as a, open(again, "rb") as b:
    assert a.read() == b.read(), "calibrate --html and tracecut report differ"
  check_self_contained(page)

  shot, dom = render(chromium, page, work)
  check_screenshot(shot)
  text = page_text(dom)
  for section in ("summary", "warnings", "partition", "errors", "time",
                  "memory", "recipe"):
    expect(dom, f'id="{section}"', "section")

  quantized = [m for m in report["modules"]
               if m.get("weight") and m["weight"]["method"] != "observer"]
  assert len(quantized) == 14, len(quantized)
  for m in quantized:
    w = m["weight"]
    expect(text, m["path"], "module path")
    expect(text, f"{w['output_error']:.4g}", m["path"] + " error")
    expect(text, f"{w['rtn_output_error']:.4g}", m["path"] + " RTN error")
  s = report["summary"]
  expect(text, f"{s['mean_compared_output_error']:.4g}", "mean error")
  expect(text, f"{s['mean_rtn_output_error']:.4g}", "mean RTN error")
  for label in report["subgraphs"]:
    expect(text, label, "subgraph")
  run_section = report["run"]
  assert len(run_section["subgraphs"]) == len(report["subgraphs"])
  for sub in run_section["subgraphs"]:
    assert sub["nodes"] > 0 and sub["param_bytes"] > 0, sub
    expect(text, human_bytes(sub["param_bytes"]), "parameter bytes")
    expect(text, human_bytes(sub["rss_bytes"]), "resident memory")
  for t in run_section["timings"]:
    expect(text, seconds(t["calibrate_seconds"]), "calibrate time")
  expect(text, human_bytes(run_section["peak_rss_bytes"]), "peak RSS")
  expect(text, human_bytes(run_section["cache"]["peak_bytes_held"]),
         "peak cache")
  expect(text, "group_size: 128", "recipe")
  print(f"calibration page: {len(quantized)} modules, "
        f"{len(report['subgraphs'])} subgraphs, errors, timings and memory "
        "in the rendered text")


def check_debug(tracecut, chromium, bert, work):
  page = os.path.join(work, "bert-debug.html")
  p = run([tracecut, "debug", bert, "--passes=gelu-tanh-approx",
           "--targets=BertLayer", "--rtol=1e-6", "--atol=0", "--json",
           "--html=" + page])
  report = json.loads(p.stdout)
  check_self_contained(page)
  shot, dom = render(chromium, page, work)
  check_screenshot(shot)
  text = page_text(dom)
  first = report["first_exceeding"]
  assert first is not None, "the tolerance should be exceeded"
  expect(text, "First over the tolerance", "verdict")
  expect(text, first["pass"], "first pass")
  for step in report["steps"]:
    if step["max_rel"]:
      expect(text, f"{step['max_rel']:.2e}", "step error")
  for sub in report["subgraphs"]:
    for path in sub["module_paths"]:
      expect(text, path, "subgraph module")
  print(f"debug page: {len(report['steps'])} steps, first over the "
        f"tolerance {first['pass']} in subgraph {first['subgraph']}")


def main():
  tracecut, llama, recipe, bert = sys.argv[1:5]
  llama, recipe, bert = (os.path.abspath(p) for p in (llama, recipe, bert))
  chromium = chromium_binary()
  work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  check_calibration(tracecut, chromium, llama, recipe, work)
  check_debug(tracecut, chromium, bert, work)


if __name__ == "__main__":
  main()
