"""run.json's watch section (backward compatible, hostile records refused in one line), the report's Whole
run section (bounded, escaped, links only inside the run), the live panel and the tracker scalars."""
from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from lmprof.analysis.watch_detect import analyze_series
from lmprof.errors import DataError
from lmprof.measure.watch import Watcher
from lmprof.record.run import Baseline, Env, Growth, Run, WatchCapture, WatchSection
from lmprof.record.watch import StepSummary, chunk_files, load_section, read_series, save_section
from lmprof.show.watch_panel import WatchPanel, alert_line, summary_line
from lmprof.show.watch_report import MAX_POINTS, read_envelopes, watch_parts
from lmprof.trackers.watch import step_scalars

ENV = Env(device="cpu", device_name="x", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1)


class Clock:
    t = 50.0

    def __call__(self) -> float:
        return self.t


def watched_run(folder, n=600, slow_from=400, chunk_rows=128):
    """A run folder whose watch recorded ``n`` steps (3x slower from ``slow_from``), with its alerts."""
    clock = Clock()
    w = Watcher(folder / "watch", clock=clock, memory=None, chunk_rows=chunk_rows)
    w.start(17)
    for k in range(n):
        clock.t += 0.010 * (1 + 0.01 * ((k * 7) % 5)) * (3 if k >= slow_from else 1)
        w.step_end(tokens=256)
    rec = w.close()
    base = Baseline.from_samples([0.010, 0.0101, 0.0102, 0.0103, 0.0104])
    alerts, dropped = analyze_series(read_series(rec.series), base)
    cap = WatchCapture(path="watch/capture-1", first_step=17 + slow_from + 20, steps=3, requested_by="alert",
                       alert=0, grew=[Growth(kind="block", name="layers.*.slow", phase="forward", before_ms=2.0,
                                             after_ms=6.0, delta_ms=4.0, ratio=3.0, status="grew", noise_ms=0.2,
                                             beyond_noise=True)])
    run = Run(id="r1", mode="train", created="now", env=ENV, config={},
              watch=rec.section(folder, base, alerts=alerts, alerts_dropped=dropped, captures=[cap] if alerts else []))
    run.save(folder)
    return run


def test_a_run_without_a_watch_writes_and_reads_as_before(tmp_path):
    run = Run(id="r0", mode="train", created="now", env=ENV, config={})
    run.save(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    assert "watch" not in data
    assert Run.load(tmp_path).watch is None


def test_the_watch_section_round_trips_and_travels_with_the_run(tmp_path):
    run = watched_run(tmp_path / "a [x] $y é")
    back = Run.load(tmp_path / "a [x] $y é")
    assert back.watch == run.watch
    w = back.watch
    assert w.steps == 600 and w.first_step == 17 and w.last_step == 616
    assert w.series == [f"watch/series-{i:05d}.parquet" for i in range(1, 6)]
    (a,) = w.alerts
    assert a.kind == "drift" and abs(a.first_step - (17 + 400)) <= 2
    assert w.device_time.startswith("n/a: a CPU run")
    back.save(tmp_path / "b")  # saved elsewhere: the series comes along
    assert [p.name for p in chunk_files(tmp_path / "b")] == [p.name for p in chunk_files(tmp_path / "a [x] $y é")]


def test_a_record_naming_files_outside_the_folder_does_not_copy_them(tmp_path):
    secret = tmp_path / "secret.parquet"
    secret.write_bytes(b"x")
    run = Run(id="r", mode="train", created="now", env=ENV, config={},
              watch=WatchSection(series=["../secret.parquet", str(secret)]))
    (tmp_path / "a").mkdir()
    run.save(tmp_path / "a")
    loaded = Run.load(tmp_path / "a")
    loaded.save(tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["blocks.csv", "ops.csv", "run.json"]


@pytest.mark.parametrize("bad", [{"alerts": [{"kind": "boom", "first_step": 0, "last_step": 0, "message": ""}]},
                                 {"baseline": {"step_s_median": "NaN", "step_s_spread": 0, "n": 1}},
                                 {"captures": [{"path": "x"}]}, {"surprise": 1}])
def test_a_hostile_watch_section_is_one_line_naming_the_field(tmp_path, bad):
    run = Run(id="r", mode="train", created="now", env=ENV, config={})
    run.save(tmp_path)
    data = json.loads((tmp_path / "run.json").read_text())
    data["watch"] = bad
    (tmp_path / "run.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"field watch\.") as exc:
        Run.load(tmp_path)
    assert "\n" not in str(exc.value)


def test_the_section_alone_survives_a_run_that_never_reached_run_json(tmp_path):
    sec = WatchSection(steps=3, series=["watch/series-00001.parquet"])
    save_section(tmp_path, sec)
    assert load_section(tmp_path) == sec
    (tmp_path / "watch" / "watch.json").write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        load_section(tmp_path)


def test_the_report_draws_the_run_marks_alerts_and_captures_and_links_only_inside(tmp_path):
    from lmprof.show.report import write_report

    run = watched_run(tmp_path)
    run.watch.alerts[0].message = "<script>alert(1)</script> drift"
    run.watch.captures.append(WatchCapture(path="../../etc", first_step=500, steps=3, requested_by="signal"))
    (tmp_path / "watch" / "capture-1").mkdir()
    (tmp_path / "watch" / "capture-1" / "report.html").write_text("child")
    run.save(tmp_path)
    html = write_report(tmp_path).read_text()
    assert 'id="watch"' in html and "Whole run" in html
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; drift" in html
    assert 'href="watch/capture-1/report.html"' in html
    assert "../../etc" in html and 'href="../../etc' not in html
    assert html.count("data:image/png;base64,") >= 1
    assert "layers.*.slow (forward, block): 2 -&gt; 6 ms per profiled step (+4 ms, 3.00x)" in html


def test_a_long_series_is_drawn_from_a_bounded_number_of_points(tmp_path):
    run = watched_run(tmp_path, n=20_000, slow_from=10**9, chunk_rows=4096)
    series = read_envelopes(run, run.watch)
    s, lo, mean, hi = series.step_ms.arrays()
    assert 0 < len(s) <= MAX_POINTS
    assert (lo <= mean + 1e-12).all() and (mean <= hi + 1e-12).all()
    assert lo.min() == pytest.approx(10.0, rel=1e-6) and hi.max() == pytest.approx(10.4, rel=1e-6)


def test_missing_and_foreign_series_files_are_named_not_fatal(tmp_path):
    run = watched_run(tmp_path, n=200)
    (tmp_path / run.watch.series[0]).write_bytes(b"garbage")
    run.watch.series += ["watch/gone.parquet", "/etc/passwd"]
    text = " ".join(str(getattr(p, "items", getattr(p, "text", ""))) for p in watch_parts(run, tmp_path))
    assert "not a readable Parquet file" in text and "gone.parquet: missing" in text
    assert "/etc/passwd: not a file inside the run folder" in text


class Tty(io.StringIO):
    """A terminal's screen, as the bytes written to it."""

    def isatty(self) -> bool:
        return True


def summary(step=41, **kw):
    base = dict(step=step, step_s=0.0123, tokens_per_s=20812.0, loss=2.5, input_wait_s=0.0004, rss_B=3 * 2**30)
    return StepSummary(**{**base, **kw})


def test_the_plain_panel_prints_a_line_per_period_and_each_alert_at_once(tmp_path):
    clock = Clock()
    out = io.StringIO()
    panel = WatchPanel(out, every_s=30.0, clock=clock)
    panel.update(summary())
    panel.update(summary(42))  # within the period: nothing
    run = watched_run(tmp_path, n=300, slow_from=100)
    alert = run.watch.alerts[0]
    alert.message = "[bold]x[/] $y"
    panel.update(summary(43), [alert])
    clock.t += 31
    panel.update(summary(44))
    lines = out.getvalue().splitlines()
    assert lines[0] == ("lmprof watch: step 41 · step time 12.3 ms · tokens/s 20,812 · loss 2.5 · input wait "
                        "0.4 ms · RSS 3 GiB")
    assert lines[1] == alert_line(alert) and "[bold]x[/] $y" in lines[1]
    assert lines[2].startswith("lmprof watch: step 44 ") and lines[2].endswith("· 1 alert")
    assert len(lines) == 3


def test_on_a_terminal_the_watch_prints_lines_and_never_moves_over_the_scripts_own(capsys):
    """A region redrawn in place moved the cursor up over what the script printed meanwhile (the HF Trainer's
    log lines, erased or drawn into): on a terminal too the watch only appends whole lines."""
    clock = Clock()
    tty = Tty()
    panel = WatchPanel(tty, clock=clock)
    panel.update(summary())
    tty.write("the script's own line\n")  # stdout and stderr on one terminal
    clock.t += 31
    panel.update(summary(42))
    screen = tty.getvalue()
    assert screen.splitlines()[1] == "the script's own line"
    assert [line.split(" · ")[0] for line in screen.splitlines()] == ["lmprof watch: step 41", "the script's own line",
                                                                       "lmprof watch: step 42"]
    assert not re.search(r"\x1b\[\d*[ABK]|\r", screen), repr(screen)  # no cursor up or down, no erasing
    assert capsys.readouterr().out == ""


def test_the_watch_line_clears_a_tqdm_bar_and_draws_it_again():
    tqdm = pytest.importorskip("tqdm")

    tty = Tty()
    with tqdm.tqdm(total=10, file=tty, mininterval=0, ascii=True) as bar:
        bar.update(3)
        WatchPanel(tty, clock=Clock()).update(summary())
        bar.update(1)
    screen = tty.getvalue()
    said = screen.index("lmprof watch: step 41")
    assert re.search(r"\r +\r$", screen[:said]), repr(screen[:said][-80:])  # the bar cleared first
    assert "4/10" in screen[said:]  # and drawn again after


def test_summary_line_leaves_out_what_a_step_does_not_have():
    line = summary_line(StepSummary(step=1, step_s=0.5))
    assert line == "lmprof watch: step 1 · step time 500.0 ms"


def test_tracker_scalars_carry_their_unit_in_the_name():
    got = step_scalars(summary(device_s=0.011, mem_allocated_B=1e9, mem_reserved_B=2e9))
    assert got == pytest.approx({"watch/step_time_ms": 12.3, "watch/device_time_ms": 11.0,
                                 "watch/tokens_per_s": 20812.0, "watch/loss": 2.5, "watch/input_wait_ms": 0.4,
                                 "watch/memory.allocated_B": 1e9, "watch/memory.reserved_B": 2e9,
                                 "watch/rss_B": 3 * 2**30})
    assert "watch/loss" in step_scalars(StepSummary.from_row(
        {"step": np.array([3]), "step_s": np.array([0.01]), "loss": np.array([1.0]),
         "tokens": np.array([np.nan])}))
