"""Open the reports in headless Chromium: sections render, images decode, no script errors, sorting works.

A probe script is put at the top of a copy of the report. It records every error event (script
errors and failed resource loads, captured before the report's own code runs) and console.error
call, then on ``load`` writes into attributes of <html>: the naturalWidth of every image, the errors,
and for sweep reports whether clicking a numeric column header sorts it. ``--dump-dom`` prints the
DOM after load, so the test reads those attributes back.

Chromium comes from scripts/ensure_chromium.sh (the Makefile runs it before the tests; this module
runs it once more if no browser is found). The tests skip, saying why, only when it cannot be had.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from lmprof.config import TrainConfig
from lmprof.pipeline.train import run_training
from lmprof.show.report import write_run_report, write_sweep_report

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Without the background-networking flags Chromium tries to reach Google services and, on a closed
# network, logs refused connections; none of them is needed to render a local file.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")

PROBE = """<script>
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    errors.push(t && t !== window && (t.src || t.href) ? "failed to load " + (t.src || t.href).slice(0, 80)
                                                      : String(e.message));
  }, true);
  var ce = console.error;
  console.error = function () { errors.push(Array.prototype.join.call(arguments, " ")); ce.apply(console, arguments); };
  function column(table, col) {
    return Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[col].getAttribute("data-sort"); })
      .filter(function (v) { return v !== null && v !== ""; }).map(parseFloat);
  }
  function sorted(xs, dir) {
    for (var i = 1; i < xs.length; i++) if ((xs[i] - xs[i - 1]) * dir < 0) return false;
    return xs.length > 1;
  }
  window.addEventListener("load", function () {
    var root = document.documentElement;
    root.setAttribute("data-img-widths", Array.prototype.map.call(document.images, function (im) {
      return im.complete ? im.naturalWidth : -1; }).join(","));
    var table = document.querySelector("table.sortable");
    var th = table && table.querySelector("th[data-type=num]");
    if (th) {
      var col = Array.prototype.indexOf.call(th.parentNode.cells, th);
      th.click();
      root.setAttribute("data-sort-asc", String(sorted(column(table, col), 1)));
      th.click();
      root.setAttribute("data-sort-desc", String(sorted(column(table, col), -1)));
    }
    root.setAttribute("data-errors", JSON.stringify(errors));
    root.setAttribute("data-probe", "done");
  });
})();
</script>"""


def _find_browser() -> str | None:
    return next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


@pytest.fixture(scope="module")
def browser() -> str:
    found = _find_browser()
    if found:
        return found
    script = ROOT / "scripts" / "ensure_chromium.sh"
    try:
        res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600)
        said = (res.stdout + res.stderr).strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as exc:
        said = [f"{script.name} failed: {exc}"]
    found = _find_browser()
    if not found:
        pytest.skip(f"no Chromium and it could not be installed: {said[-1] if said else 'no output'}")
    return found


def _attrs(dom: str) -> dict[str, str]:
    tag = re.search(r"<html[^>]*>", dom)
    assert tag, dom[:300]
    return {k: v.replace("&quot;", '"').replace("&amp;", "&") for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag.group(0))}


def open_in_chromium(browser: str, report: Path, screenshot: Path | None = None) -> tuple[dict[str, str], str]:
    """Load a probed copy of ``report``; return (<html> attributes written by the probe, DOM)."""
    text = report.read_text()
    probed = report.with_name("probed-" + report.name)
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1))
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000"]
        res = subprocess.run([*cmd, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        if screenshot is not None:
            subprocess.run([*cmd, "--window-size=1200,3000", f"--screenshot={screenshot}", report.as_uri()],
                           capture_output=True, text=True, timeout=120, check=True)
    return _attrs(res.stdout), res.stdout


@pytest.fixture(scope="module")
def run_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser") / "tiny"
    cfg = TrainConfig(preset="tiny", batch_size=2, seq_len=16, steps=2, warmup=1, profile_steps=1, device="cpu",
                      energy="off")
    run, folder = run_training(cfg, out_dir=out)
    return write_run_report(run, folder)


def test_run_report_renders_in_chromium(browser, run_report, tmp_path):
    shot = tmp_path / "report.png"
    attrs, dom = open_in_chromium(browser, run_report, screenshot=shot)
    assert attrs.get("data-probe") == "done", "the load handler never ran"
    assert json.loads(attrs["data-errors"]) == []
    widths = [int(w) for w in attrs["data-img-widths"].split(",")]
    assert widths and all(w > 0 for w in widths), widths  # every embedded PNG decoded
    for sid in ("headline", "recommendations", "blocks", "operators", "memory", "energy", "trace-analysis", "trace"):
        assert f'id="{sid}"' in dom, sid
    assert "Where the time goes" in dom and "attn.qkv" in dom
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1200, 3000)
        lo, hi = im.convert("L").getextrema()
        assert hi - lo > 100  # something was drawn, not a blank page


def test_sweep_report_sorts_in_chromium(browser, tmp_path):
    from matplotlib.figure import Figure

    from lmprof.record.run import Env, Metric, Run

    # A sweep folder without a store: three runs and one unreadable record ("boom").
    for name, tps in (("a", 30.0), ("b", 10.0), ("d", 20.0)):
        env = Env(device="cpu", device_name="cpu", torch="x", python="x", lmprof="x", os="x", cpu="x", threads=1)
        Run(id=name, mode="train", created="2026-01-01T00:00:00+00:00", env=env, config={},
            metrics={"tokens_per_s": Metric(value=tps, unit="tokens/s", source="derived")}).save(tmp_path / name)
    (tmp_path / "boom").mkdir()
    (tmp_path / "boom" / "run.json").write_text("{}")
    (tmp_path / "plots").mkdir()
    fig = Figure(figsize=(2, 1.5), dpi=50)
    fig.subplots().bar([0, 1], [1, 2])
    fig.savefig(tmp_path / "plots" / "bars.png", format="png")
    attrs, dom = open_in_chromium(browser, write_sweep_report(tmp_path))
    assert json.loads(attrs["data-errors"]) == []
    assert attrs["data-img-widths"] == "100"  # 2 in x 50 dpi
    assert attrs["data-sort-asc"] == "true" and attrs["data-sort-desc"] == "true"
    assert "boom" in dom and 'id="best"' in dom
