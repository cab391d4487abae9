"""The report in headless Chromium: the deciding columns are visible without scrolling at 1400 px and at 420 px,
the prefix-cache section of a prefix-sharing run is shown without script errors, and a mixed report is refused.

Method: the report is embedded in a host page as an ``<iframe srcdoc>`` exactly W px wide (headless Chromium will
not make a window narrower than 500 px; a srcdoc frame shares the host's origin, so the host can read its layout).
A small script in the host measures, on load, the bounding boxes of the deciding table's header cells and of the
first row's cells with ``getBoundingClientRect`` and writes them as JSON into a ``<pre>``; ``--dump-dom`` returns
the DOM with it. A cell is visible without scrolling when it lies within both the frame's viewport and the box of
the table's scroll container, and the page itself does not scroll sideways.

The prefix-cache section is checked on the report itself, with a script put first in its ``<head>`` that records
every uncaught error and rejected promise from the start, and measures the section after scrolling to it."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pytest
import yaml

from sim.reports.compare import compare
from tests.conftest import REPO

from conftest import MMSIM_CLI

SCENARIO = {
    "name": "browser", "seed": 5, "profile": "paper-rtx5000",
    "cluster": {"nodes": 1, "gpus_per_node": 2, "host_memory_gb": 64},
    "models": [{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}, {"name": "qwen2.5-7b"}],
    "workload": {"generator": {"duration_s": 25, "arrivals": {"process": "poisson", "rate_per_s": 3.0},
                               "mix": {"qwen2.5-3b": 0.5, "qwen3-8b": 0.3, "qwen2.5-7b": 0.2},
                               "prompt_tokens": {"dist": "lognormal", "mean": 500, "cv": 1.0, "max": 2000},
                               "output_tokens": {"dist": "lognormal", "mean": 100, "cv": 1.0, "max": 500}}},
    "slo": {"default": {"ttft_s": 2.0, "tpot_s": 0.1}},
    "engine": {"max_num_seqs": 32},
}
POLICIES = ["static", "fcfs-swap", "swap-aware", "offload-aware", "slo-aware", "time-slice"]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1500,1000"]
PROBE = """<script>
window.addEventListener('load', function () {
  var frame = document.getElementById('page'), doc = frame.contentDocument, win = frame.contentWindow;
  var table = doc.querySelector('table.deciding');
  var out = {innerWidth: win.innerWidth, scrollWidth: doc.documentElement.scrollWidth, cells: []};
  if (table) {
    var wrap = table.parentElement.getBoundingClientRect();
    out.visibleLeft = Math.max(0, wrap.left);
    out.visibleRight = Math.min(win.innerWidth, wrap.right);
    table.querySelectorAll('thead th[data-deciding], tbody tr:first-child > *').forEach(function (el) {
      var box = el.getBoundingClientRect();
      out.cells.push({text: el.textContent.trim(), left: box.left, right: box.right, width: box.width});
    });
  }
  var pre = document.createElement('pre');
  pre.id = 'measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Six policies × one seed of a small scenario: the widest deciding table the built-ins give."""
    root = tmp_path_factory.mktemp("browser")
    scenario = root / "browser.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    out, _ = compare(scenario, POLICIES, seeds=1, out=root / "browser.html", runs_dir=root / "runs",
                     show_progress=False)
    return out


def measure(report_path, width: int, tmp_path) -> dict:
    """Boxes of the deciding table's cells with the report shown in a viewport ``width`` px wide."""
    page = report_path.read_text(encoding="utf-8")
    host = tmp_path / f"host-{width}.html"
    host.write_text(f'<!DOCTYPE html><html><body style="margin:0"><iframe id="page" style="border:0;width:{width}px;'
                    f'height:900px" srcdoc="{html.escape(page, quote=True)}"></iframe>{PROBE}</body></html>',
                    encoding="utf-8")
    dom = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", host.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S)
    assert found, "the probe wrote no measurement: " + dom[-500:]
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.parametrize("width", [1400, 420])
def test_deciding_columns_visible_without_scrolling(report, width, tmp_path):
    boxes = measure(report, width, tmp_path)
    assert boxes["innerWidth"] == width  # the frame really is that wide
    assert boxes["scrollWidth"] <= width, "the page scrolls sideways"
    headers = [c["text"].replace("\xad", "") for c in boxes["cells"][:6]]  # soft hyphens let headers wrap
    expected = ["Policy", "Goodput", "SLO attainment", "Requests", "TTFT", "TPOT"]
    assert all(h.startswith(e) for h, e in zip(headers, expected)) and len(headers) == 6, headers
    assert len(boxes["cells"]) == 12  # six headers, six cells of the first row
    for cell in boxes["cells"]:
        assert cell["width"] > 20, cell
        assert cell["left"] >= boxes["visibleLeft"] - 0.5 and cell["right"] <= boxes["visibleRight"] + 0.5, (width, cell)


def test_mixed_report_is_refused_in_the_cli(report, tmp_path):
    """Runs of two profiles: `mmsim report` exits 2 naming the field; --allow-mixed shows two groups."""
    import os
    
    runs = report.parent / "runs"
    other = tmp_path / "other"
    shutil.copytree(runs / sorted(p.name for p in runs.iterdir())[0], other)
    summary = json.loads((other / "summary.json").read_text())
    summary["profile"] = "cpu-calibrated"
    (other / "summary.json").write_text(json.dumps(summary))
    mmsim = MMSIM_CLI
    env = {**os.environ, "COLUMNS": "200"}
    refused = subprocess.run([*mmsim, "report", str(runs), str(other), "--out", str(tmp_path / "r.html")],
                             capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "profile" in refused.stderr and "--allow-mixed" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()
    mixed = subprocess.run([*mmsim, "report", str(runs), str(other), "--allow-mixed", "--out", str(tmp_path / "m.html")],
                           capture_output=True, text=True, timeout=300, env=env)
    assert mixed.returncode == 0, mixed.stderr
    page = (tmp_path / "m.html").read_text(encoding="utf-8")
    assert page.count('class="group-title"') == 2 and "profile cpu-calibrated" in page


PREFIX_PROBE = """<script>
var seenErrors = [];
window.addEventListener('error', function (e) { seenErrors.push(String(e.message)); });
window.addEventListener('unhandledrejection', function (e) { seenErrors.push('rejection: ' + String(e.reason)); });
window.addEventListener('load', function () {
  var out = {errors: seenErrors, innerWidth: window.innerWidth, innerHeight: window.innerHeight, panels: []};
  var heading = Array.prototype.find.call(document.querySelectorAll('figure > h3'), function (h) {
    return h.textContent.trim() === 'Prefix cache'; });
  if (heading) {
    var fig = heading.parentElement;
    fig.scrollIntoView();
    out.caption = fig.querySelector('figcaption').textContent;
    fig.querySelectorAll('.panel svg').forEach(function (svg) {
      var box = svg.getBoundingClientRect(), style = getComputedStyle(svg);
      out.panels.push({text: svg.textContent, top: box.top, bottom: box.bottom, left: box.left, right: box.right,
                       width: box.width, height: box.height, paths: svg.querySelectorAll('path').length,
                       shown: style.display !== 'none' && style.visibility === 'visible' && style.opacity !== '0'});
    });
    out.tableRows = Array.prototype.map.call(fig.querySelectorAll('.prefix-instances tbody tr'), function (tr) {
      return tr.textContent; });
  }
  var pre = document.createElement('pre');
  pre.id = 'measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def prefix_report(tmp_path_factory):
    """The prefix-sharing scenario cut to a minute and 10 tenants, under two policies that route differently."""
    root = tmp_path_factory.mktemp("prefix-browser")
    scenario = yaml.safe_load((REPO / "scenarios" / "prefix-sharing.yaml").read_text())
    scenario["workload"]["generator"]["duration_s"] = 60
    scenario["workload"]["generator"]["conversations"]["tenants"] = 10
    path = root / "prefix-sharing.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out, _ = compare(path, ["static", "prefix-swap-aware"], seeds=1, out=root / "prefix.html", runs_dir=root / "runs",
                     show_progress=False)
    return out


def probe_section(report_path, probe: str, tmp_path) -> dict:
    """What ``probe`` (a script put first in the report's ``<head>``) measured, with the report in headless Chromium."""
    page = report_path.read_text(encoding="utf-8")
    assert page.count("<head>") == 1
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + probe), encoding="utf-8")
    dom = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="measure">(.*?)</pre>', dom, re.S)
    assert found, "the probe wrote no measurement: " + dom[-500:]
    return json.loads(html.unescape(found.group(1)))


def test_prefix_section_is_shown_without_script_errors(prefix_report, tmp_path):
    seen = probe_section(prefix_report, PREFIX_PROBE, tmp_path)
    assert seen["errors"] == []
    hit_rate, ttft = seen["panels"]  # the section exists with its two figures, in this order
    assert "prompt tokens from cache (%)" in hit_rate["text"] and "mean TTFT (s)" in ttft["text"]
    for panel in (hit_rate, ttft):
        assert panel["shown"] and panel["width"] > 200 and panel["height"] > 120, panel
        # On screen once scrolled to: within the viewport's width, and its top in view.
        assert 0 <= panel["left"] and panel["right"] <= seen["innerWidth"] and 0 <= panel["top"] < seen["innerHeight"]
        assert "static" in panel["text"] and "prefix-swap-aware" in panel["text"]  # a legend entry or a bar label
        assert panel["paths"] > 4  # axes, ticks and the data drawn
    assert "with a hit" in seen["caption"] and "without" in seen["caption"]
    assert seen["tableRows"] and all("%" in row for row in seen["tableRows"])
