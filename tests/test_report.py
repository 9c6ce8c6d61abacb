"""The HTML run and sweep reports: one self-contained file, every section, n/a where figures are missing."""
from __future__ import annotations

import base64
import re
import sqlite3
from pathlib import Path

import pytest

from lmprof.errors import DataError
from lmprof.config import TrainConfig
from lmprof.pipeline.train import run_training
from lmprof.record.run import Block, Env, Metric, OpStat, Run
from lmprof.show.report import (
    findings_from_analysis,
    load_sweep_table,
    render_run_report,
    write_report,
    write_run_report,
    write_sweep_report,
)

RUN_SECTIONS = ("headline", "recommendations", "blocks", "operators", "compute", "memory", "energy",
                "trace-analysis", "notes", "all-figures", "environment", "configuration", "trace")
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "tiny"
    cfg = TrainConfig(preset="tiny", batch_size=2, seq_len=16, steps=2, warmup=1, profile_steps=1, device="cpu",
                      energy="off")
    run, folder = run_training(cfg, out_dir=out)
    return run, Path(folder)


def assert_self_contained(text: str) -> list[bytes]:
    """No external resource references; every <img> a decodable PNG data URI. Returns the PNGs."""
    assert not EXTERNAL.search(text), EXTERNAL.search(text).group(0)
    assert "<link" not in text and "@import" not in text and "url(" not in text
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', text)
    pngs = []
    for src in srcs:
        assert src.startswith("data:image/png;base64,"), src[:60]
        data = base64.b64decode(src.split(",", 1)[1])
        assert data.startswith(PNG_MAGIC)
        pngs.append(data)
    return pngs


def section_ids(text: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', text)


def test_report_of_a_real_run(real_run):
    run, folder = real_run
    path = write_run_report(run, folder)
    assert path == folder / "report.html" and path.is_file()
    text = path.read_text()
    assert list(section_ids(text))[:2] == ["headline", "recommendations"]
    assert set(RUN_SECTIONS) <= set(section_ids(text))
    pngs = assert_self_contained(text)
    listed = [n for n in run.files.values() if n.endswith(".png")]
    assert len(pngs) == 1 + len(listed)  # the per-block chart and every plot the run listed
    # Headline figures carry their source labels; the per-block table has forward and backward.
    assert 'data-key="step_time"' in text and "src-measured" in text and "src-derived" in text
    assert "forward ms" in text and "backward ms" in text and "attn.qkv" in text
    # Energy was off: said so, never a crash or a blank.
    energy = text.split('id="energy"')[1].split("</section>")[0]
    assert "n/a" in energy or "not recorded in this run" in energy
    # The trace is linked relatively, with how to open it.
    assert 'href="trace.json.gz"' in text and "ui.perfetto.dev" in text and "chrome://tracing" in text


def test_cli_report_writes_into_the_folder_and_prints_the_path(real_run, cli, tmp_path):
    _, folder = real_run
    code, out, err = cli("report", folder)
    assert code == 0, err
    assert out.strip() == str(folder / "report.html")
    other = tmp_path / "elsewhere" / "r.html"
    code, out, _ = cli("report", folder, "--out", other)
    assert code == 0 and other.is_file()
    # Written elsewhere, the trace link still points at the run folder's trace.
    assert re.search(r'href="[^"]*tiny/trace\.json\.gz"', other.read_text())
    code, _, err = cli("report", tmp_path / "nope")
    assert code == 2 and "no such folder" in err


def _png(path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 1.5), dpi=50)
    fig.subplots().plot([0, 1], [1, 0])
    fig.savefig(path, format="png")


def _env(**extra) -> Env:
    return Env(device="cuda:0", device_name="Test GPU", torch="2", python="3", lmprof="0", os="linux",
               cpu="cpu", threads=1, **extra)


def full_run(folder: Path) -> Run:
    """A run with every optional section present: MFU, roofline, memory, energy, plots."""
    gib = 2**30
    m = {
        "step_time": Metric(value=10.0, unit="ms", source="measured", p10=9.9, p90=10.2, n=10),
        "tokens_per_s": Metric(value=50000.0, unit="tokens/s", source="derived"),
        "profiler_overhead": Metric(value=45.0, unit="%", source="derived"),
        "mfu": Metric(value=12.5, unit="%", source="derived", note="model FLOP/s / peak"),
        "flops.model_per_step": Metric(value=3e12, unit="FLOP", source="estimated"),
        "peak.flops": Metric(value=1e15, unit="FLOP/s", source="estimated"),
        "memory.peak": Metric(value=4 * gib, unit="B", source="measured"),
        "memory.estimated.peak": Metric(value=3.5 * gib, unit="B", source="estimated"),
        "energy.total": Metric(value=120.0, unit="J", source="measured"),
        "energy.per_token": Metric(value=0.002, unit="J/token", source="derived"),
    }
    blocks = [Block(name="attn.scores", phase="forward", time_ms=2, profiled_ms=2, pct=20),
              Block(name="attn.softmax", phase="forward", time_ms=1, profiled_ms=1, pct=10),
              Block(name="mlp.fc", phase="backward", time_ms=5, profiled_ms=5, pct=50),
              Block(name="optimizer", phase="step", time_ms=2, profiled_ms=2, pct=20)]
    for name in ("roofline.png", "memory_timeline.png", "extra_plot.png"):
        _png(folder / name)
    run = Run(
        id="full", mode="train", created="2026-01-01T00:00:00Z", env=_env(gpu_memory_bytes=80 * gib),
        config={"preset": "tiny", "batch_size": 8, "optimizer": "adamw", "model": {"n_layer": 4}},
        metrics=m, blocks=blocks,
        ops=[OpStat(name="aten::mm", calls=10, self_ms=5, total_ms=6, self_pct=50, device_ms=4.5)],
        tables={"memory": [{"category": "peak", "measured_bytes": 4 * gib, "estimated_bytes": int(3.5 * gib),
                            "diff_pct": 14.3, "note": "torch.cuda.max_memory_allocated"}],
                "roofline": [{"name": "mlp.fc", "phase": "forward", "intensity": 85.3, "bound": "compute-bound"}],
                "energy": [{"domain": "gpu", "meter": "nvml", "joules": 120.0}],
                "custom": [{"x": 1, "y": "two"}]},
        notes=["a note <with> markup & ampersand"],
        files={"roofline": "roofline.png", "memory_timeline": "memory_timeline.png", "extra": "extra_plot.png"},
    )
    run.save(folder)
    return Run.load(folder)


def test_report_shows_every_optional_section_when_present(tmp_path):
    run = full_run(tmp_path)
    text = write_run_report(run, tmp_path).read_text()
    assert len(assert_self_contained(text)) == 4  # block chart, roofline, memory timeline, extra plot
    sec = {sid: text.split(f'id="{sid}"')[1].split("</section>")[0] for sid in section_ids(text)}
    assert "roofline.png" in sec["compute"] and "compute-bound" in sec["compute"] and "12.5 %" in sec["compute"]
    assert "memory_timeline.png" in sec["memory"] and "4 GiB" in sec["memory"] and "+14.3%" in sec["memory"]
    assert "0.002 J/token" in sec["headline"] and "120.0 J" in sec["energy"]
    assert "extra_plot.png" in sec["other"] and "custom" in sec["other"]
    assert "no trace file" in sec["trace-analysis"]
    # Rules fired with their evidence: overhead 45 %, written-out attention 30 %, optimizer 20 %.
    for rule, number in (("profiler_overhead", "45"), ("attention_unfused", "30"), ("optimizer_share", "20")):
        block = sec["recommendations"].split(f'data-rule="{rule}"')[1].split("</div></div>")[0]
        assert f"= {number}" in block, rule
    assert 'data-rule="memory_headroom"' in sec["recommendations"]  # 4 GiB of 80 GiB
    assert "mfu = 12.5 %" in sec["recommendations"]  # MFU 12.5 % with mlp.fc at 50 % of the step
    # Text from the run is escaped.
    assert "a note &lt;with&gt; markup &amp; ampersand" in sec["notes"]


def test_report_of_a_bare_run_never_crashes(tmp_path):
    run = Run(id="bare", mode="infer", created="2026-01-01T00:00:00Z", env=_env(), config={},
              metrics={"ttft": Metric.na("ms", "no prefill was timed")})
    run.save(tmp_path)
    text = write_run_report(Run.load(tmp_path), tmp_path).read_text()
    assert_self_contained(text)
    assert set(RUN_SECTIONS) <= set(section_ids(text))
    assert "n/a: no prefill was timed" in text
    assert text.count("not recorded in this run") >= 5  # tpot, MFU, memory, energy, blocks, ...
    assert "No rule fired" in text


def test_trace_findings_from_a_gpu_analysis_feed_the_sync_rule():
    report = {"traces": [{
        "steps": {"count": 2, "median_ms": 12.0, "min_ms": 11.0, "max_ms": 13.0},
        "operators": {"count": 400, "top": [{"name": "aten::mm", "share_pct": 40.0}]},
        "device": {"temporal": {"span_us": 20000.0, "idle_pct": 30.0, "compute_pct": 60.0, "memory_pct": 10.0,
                                "communication_pct": 0.0},
                   "idle": {"gaps": 5, "sync_us": 4000.0, "host_bound_us": 2000.0, "sync_gaps": 2, "host_bound_gaps": 3},
                   "launches": {"linked": 100, "launch_delay_median_us": 12.0, "short_kernels_pct": 25.0},
                   "kernels": {"top": [{"name": "sgemm", "share_pct": 55.0}]}},
    }], "notes": ["one trace"]}
    tf = findings_from_analysis(report)
    assert tf.facts == pytest.approx({"ops_per_step": 200.0, "device_idle_pct": 30.0, "sync_idle_pct": 20.0,
                                      "host_bound_idle_pct": 10.0})
    text = " ".join(tf.findings)
    assert "idle 30.0%" in text and "synchronisation 20.0%" in text and "sgemm" in text and "one trace" in text
    run = Run(id="g", mode="train", created="x", env=_env(), config={})
    html = render_run_report(run, trace=tf)
    assert 'data-rule="host_sync"' in html and "trace.sync_idle_pct = 20" in html


# -- sweeps ----------------------------------------------------------------------------------------


def _plots(folder: Path) -> None:
    (folder / "plots").mkdir(parents=True, exist_ok=True)
    _png(folder / "plots" / "throughput_vs_batch.png")
    _png(folder / "plots" / "mfu_vs_batch.png")


def _plain_sqlite_sweep(folder: Path) -> None:
    """A results.sqlite that is not the store's schema: the report reads it as a plain table."""
    folder.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(folder / "results.sqlite") as con:
        con.execute("CREATE TABLE results (label TEXT, status TEXT, message TEXT, mode TEXT, batch_size INT,"
                    " tokens_per_s REAL, step_time_ms REAL, mfu_pct REAL)")
        con.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
            ("b2", "ok", None, "train", 2, 1000.0, 20.0, 10.0),
            ("b8", "ok", None, "train", 8, 3000.0, 30.0, 30.0),
            ("b32", "oom", "CUDA out of memory", "train", 32, None, None, None),
            ("b64", "pending", None, "train", 64, None, None, None),
        ])


def test_sweep_report_refuses_a_foreign_results_table(tmp_path):
    """The report reads the store's own schema and guesses no other: a plain SQLite file (another
    tool's results table) is one clear error, not a report built from guessed column names."""
    _plain_sqlite_sweep(tmp_path)
    with pytest.raises(DataError, match="not an lmprof sweep store"):
        load_sweep_table(tmp_path)


def test_sweep_report_from_the_sweep_store(tmp_path):
    sweep_fakes = pytest.importorskip("sweep_fakes", reason="tests/sweep_fakes.py (the store's fake sweep) not present")
    pytest.importorskip("lmprof.record.store", reason="lmprof.record.store not present")
    sweep_fakes.fake_sweep(tmp_path)
    _plots(tmp_path)
    text = write_sweep_report(tmp_path).read_text()
    assert_self_contained(text)
    best = text.split('id="best"')[1].split("</section>")[0]
    for title in ("fastest (tokens/s)", "lowest step time", "best MFU", "lowest peak memory", "best energy per token"):
        assert title in best
    assert "decode_tokens_per_s" in best  # inference points ranked on their own throughput
    failed = text.split('id="failed"')[1].split("</section>")[0]
    assert "out of memory" in failed and "no result after 1 s" in failed


def test_sweep_report_from_run_folders_only(tmp_path, real_run):
    run, _ = real_run
    run.save(tmp_path / "p1")
    text = write_report(tmp_path).read_text()
    assert "results from run folders" in text and run.id in text
