"""The whole-run recorder (measure/watch): every column against what the test injected, the Parquet
chunks against the rows written, memory bounded, device figures read back without waiting, and a
killed process leaving every finished chunk readable."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from lmprof.atomic import WriteError
from lmprof.errors import ConfigError
from lmprof.measure.watch import Watcher, period_for
from lmprof.measure.watch.device import CPU_DEVICE_TIME, ProcRss
from lmprof.record.watch import COLUMN_NAMES, chunk_files, read_chunk, read_series

SRC = Path(__file__).resolve().parents[1] / "src"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Mark:
    def __init__(self, at: float) -> None:
        self.at = at


class FakeTimer:
    """A device clock the test moves: a mark is done once the device has reached its time."""

    def __init__(self) -> None:
        self.queued = 0.0  # device time at which work enqueued so far ends
        self.reached = 0.0  # how far the device has run
        self.released: list[Mark] = []

    def mark(self) -> Mark:
        return Mark(self.queued)

    def done(self, m: Mark) -> bool:
        return m.at <= self.reached

    def elapsed_s(self, a: Mark, b: Mark) -> float:
        assert self.done(a) and self.done(b)
        return b.at - a.at

    def release(self, m: Mark) -> None:
        self.released.append(m)

    def stage(self, value: torch.Tensor) -> list[float]:
        return [float(value)]  # a pinned copy, in effect

    def read(self, staged: list[float]) -> float:
        return staged[0]


class FakeMemory:
    def __init__(self, per_read: float = 4096.0) -> None:
        self.n = 0
        self.per_read = per_read

    def read(self) -> tuple[float, float, float]:
        self.n += 1
        return 1e9 + self.per_read * self.n, 2e9, 5e8


def test_every_column_is_what_was_injected_and_device_figures_arrive_later(tmp_path):
    clock, timer, mem = Clock(), FakeTimer(), FakeMemory()
    w = Watcher(tmp_path / "watch", clock=clock, timer=timer, memory=mem, tokens_per_step=512, memory_every=1)
    w.start(40)
    host = [0.010, 0.012, 0.011, 0.030, 0.010, 0.010]
    device = [0.008, 0.009, 0.0085, 0.028, 0.009, 0.0095]
    wait = [0.001, 0.002, 0.0, 0.015, 0.001, 0.001]
    for k, (h, d, iw) in enumerate(zip(host, device, wait)):
        clock.t += iw
        timer.queued += iw  # the device sits idle while the host waits for input (it has caught up)
        w.forward_start()
        w.forward_start()  # a second forward in the step (micro-batches) does not move the mark
        clock.t += h - iw
        timer.queued += d - iw
        w.step_end(loss=torch.tensor(2.0 - 0.1 * k))
        timer.reached = timer.queued - 2 * d  # the device runs one step behind: nothing is waited for
    rows = w.take()
    assert rows is not None and len(rows["step"]) < len(host)  # the last step's device figure is pending
    timer.reached = timer.queued
    rec = w.close()
    got = read_series(rec.series)
    assert list(got["step"]) == list(range(40, 46))
    np.testing.assert_allclose(got["step_s"], host, rtol=1e-9)
    np.testing.assert_allclose(got["device_s"], device, rtol=1e-12)
    np.testing.assert_allclose(got["input_wait_s"], wait, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["input_stall_s"], wait, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["loss"], [2.0 - 0.1 * k for k in range(6)], rtol=1e-6)
    np.testing.assert_allclose(got["tokens"], 512)
    np.testing.assert_allclose(got["mem_allocated_B"], [1e9 + 4096 * (k + 1) for k in range(6)])
    np.testing.assert_allclose(got["t_s"], np.cumsum(host), rtol=1e-9)
    assert rec.first_step == 40 and rec.last_step == 45 and rec.steps == 6 and rec.device_time is None


def test_chunks_hold_every_row_once_in_order_and_memory_stays_bounded(tmp_path):
    clock = Clock()
    w = Watcher(tmp_path / "watch", clock=clock, timer=None, memory=FakeMemory(), chunk_rows=64, max_pending=8,
                memory_every=3)
    w.start(0)
    seen = []
    truth = []
    for k in range(1000):
        clock.t += 0.001 * (1 + k % 7)
        truth.append(0.001 * (1 + k % 7))
        w.step_end(tokens=k, loss=float(k))
        if k % 50 == 0:  # the detectors look less often than a chunk fills: nothing is lost to them
            rows = w.take()
            seen += [] if rows is None else list(rows["step"])
        assert w._cols["step"].size == 64 + 8
        assert w.latest().step == k  # also right after a spill emptied the buffer
    rows = w.take()
    seen += [] if rows is None else list(rows["step"])
    so_far = w.recorded()
    assert so_far.steps == 1000 and so_far.last_step == 999 and len(so_far.series) == 1000 // 64
    rec = w.close()
    assert [p.name for p in rec.series] == [p.name for p in chunk_files(tmp_path)][:len(rec.series)]
    got = read_series(chunk_files(tmp_path))
    assert list(got["step"]) == list(range(1000)) == seen
    np.testing.assert_allclose(got["step_s"], truth, rtol=1e-9)
    np.testing.assert_allclose(got["tokens"], np.arange(1000))
    sampled = np.isfinite(got["mem_allocated_B"])
    assert list(np.flatnonzero(sampled)) == list(range(0, 1000, 3))
    assert "memory read every 3 steps" not in " ".join(rec.notes)  # asked for, not chosen


class DearMemory(FakeMemory):
    """A memory read that costs ``cost_s`` on the test's clock (as it does in a loop whose caches are cold)."""

    def __init__(self, clock: Clock, cost_s: float) -> None:
        super().__init__()
        self.clock, self.cost_s = clock, cost_s

    def read(self) -> tuple[float, float, float]:
        self.clock.t += self.cost_s
        return super().read()


def test_memory_is_read_as_often_as_its_cost_in_the_loop_allows(tmp_path):
    """The period follows each read's cost as timed in the loop: 19 µs against 0.05% of a 10 ms step is one
    read every 4 steps; the steps between keep NaN and the record says the period."""
    clock = Clock()
    mem = DearMemory(clock, 19e-6)
    w = Watcher(tmp_path / "watch", clock=clock, timer=None, memory=mem, step_s_hint=0.010, tokens_per_step=64)
    w.start(0)
    for k in range(100):
        clock.t += 0.010
        w.step_end(loss=float(k) if k % 2 else None)
    rec = w.close()
    got = read_series(rec.series)
    read = np.flatnonzero(np.isfinite(got["rss_B"]))
    assert w.memory_every == 4 and set(np.diff(read)) == {4} and len(read) == 25
    assert "memory read every 4 steps at most" in " ".join(rec.notes)
    np.testing.assert_allclose(got["tokens"], 64)  # a column a step does not write keeps the run's figure
    assert np.isnan(got["loss"][::2]).all() and list(got["loss"][1::2]) == list(range(1, 100, 2))
    assert np.isnan(got["input_wait_s"]).all()  # no forward was seen


def test_a_dear_read_is_still_made_often_enough_for_a_creep_fit(tmp_path):
    """On a loaded machine a read may cost 100 µs: against 0.05% of a 6 ms step that would be one read in 34
    steps, and a creep fit over 128 steps would have 4 samples. The watch caps the period at the creep
    window over its samples (128 // 16 = 8; analysis/watch_detect.py's Rules), so creep is judged on time."""
    from lmprof.analysis.watch_detect import Rules

    cap = Rules().memory_every_max
    assert cap == Rules().creep_window // Rules().creep_min_samples == 8
    clock = Clock()
    w = Watcher(tmp_path / "watch", clock=clock, timer=None, memory=DearMemory(clock, 100e-6), step_s_hint=0.006,
                memory_every_max=cap)
    w.start(0)
    for _ in range(160):
        clock.t += 0.006
        w.step_end()
    got = read_series(w.close().series)
    read = np.flatnonzero(np.isfinite(got["rss_B"]))
    assert w.memory_every == cap and set(np.diff(read)[-10:]) == {cap}
    assert len(read[read >= 160 - 128]) >= Rules().creep_min_samples  # the last creep window has its samples


def test_a_device_that_never_finishes_costs_its_figures_not_memory(tmp_path):
    clock, timer = Clock(), FakeTimer()
    w = Watcher(tmp_path / "watch", clock=clock, timer=timer, memory=None, chunk_rows=16, max_pending=8)
    w.start(0)
    for _ in range(200):
        clock.t += 0.01
        timer.queued += 0.01  # the device never reaches any mark
        w.step_end()
        assert w._cols["step"].size == 24
    rec = w.abort()
    got = read_series(rec.series)
    assert list(got["step"]) == list(range(200))
    assert np.isnan(got["device_s"]).all()
    assert any("device time n/a" in n for n in rec.notes)


def test_cpu_device_time_is_na_with_the_reason_and_cpu_loss_is_read_at_once(tmp_path):
    w = Watcher(tmp_path / "watch")
    w.start(0)
    w.report_loss(torch.tensor(3.25, requires_grad=True) * 1)
    w.step_end()
    w.step_end(loss=torch.ones(3))  # not one number: no loss, no error
    summary = w.latest()
    rec = w.close()
    got = read_series(rec.series)
    assert got["loss"][0] == 3.25 and np.isnan(got["loss"][1])
    assert rec.device_time == CPU_DEVICE_TIME and np.isnan(got["device_s"]).all()
    assert summary is not None and summary.device_s is None and summary.step == 1


def test_rss_matches_the_kernels_own_figure():
    rss = ProcRss()
    status = {ln.split(":")[0]: ln.split(":")[1] for ln in Path("/proc/self/status").read_text().splitlines()}
    vm_rss = int(status["VmRSS"].split()[0]) * 1024
    assert abs(rss.rss() - vm_rss) <= 2 << 20  # the process moves a little between the two reads
    rss.close()


def test_input_wait_equals_an_injected_sleep(tmp_path):
    """A real loop whose data loading sleeps 40 ms: the watch's input wait is that sleep (within 10%)."""
    w = Watcher(tmp_path / "watch")
    a = np.random.default_rng(0).standard_normal((64, 64))
    w.start(0)
    for _ in range(7):
        time.sleep(0.04)  # the data loader
        w.forward_start()
        for _ in range(20):  # forward, backward, optimizer
            a = np.tanh(a @ a.T / 64)
        w.step_end()
    got = read_series(w.close().series)
    median = float(np.median(got["input_wait_s"]))
    assert 0.04 <= median <= 0.044, got["input_wait_s"]
    assert (got["step_s"] >= got["input_wait_s"]).all()


def test_a_full_disk_stops_the_watch_and_never_the_step(tmp_path, monkeypatch):
    w = Watcher(tmp_path / "watch", chunk_rows=4, max_pending=2)

    def full(columns):
        raise WriteError(tmp_path / "watch" / "x.parquet", OSError(28, "No space left on device"))

    monkeypatch.setattr(w._writer, "write", full)
    w.start(0)
    for _ in range(50):
        w.step_end()  # never raises
    rec = w.close()
    assert w.failed and "no space left on device" in w.failed
    assert rec.series == [] and any("the watch stopped at step" in n for n in rec.notes)


def test_without_pyarrow_the_watch_is_refused_up_front(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigError, match="pip install 'lmprof\\[parquet\\]'"):
        Watcher(tmp_path / "watch")
    assert not (tmp_path / "watch").exists()


def test_a_file_where_the_watch_folder_belongs_is_one_clear_error(tmp_path):
    (tmp_path / "watch").write_text("x")
    with pytest.raises(ConfigError, match="cannot use .*watch for the watch's series"):
        Watcher(tmp_path / "watch")


def test_a_second_watcher_in_the_same_folder_never_overwrites_a_chunk(tmp_path):
    for _ in range(2):
        w = Watcher(tmp_path / "watch")
        w.start(0)
        w.step_end()
        w.close()
    assert [p.name for p in chunk_files(tmp_path)] == ["series-00001.parquet", "series-00002.parquet"]


def test_hostile_chunk_files_are_one_clear_error(tmp_path):
    from lmprof.errors import DataError

    bad = tmp_path / "series-00001.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        read_chunk(bad)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"step": ["a"]}), tmp_path / "other.parquet")
    with pytest.raises(DataError, match="no column"):
        read_chunk(tmp_path / "other.parquet")
    pq.write_table(pa.table({c: ["x"] for c in COLUMN_NAMES}), tmp_path / "strings.parquet")
    with pytest.raises(DataError, match="not a number"):
        read_chunk(tmp_path / "strings.parquet")


def test_period_for_keeps_a_cost_under_its_share():
    assert period_for(50e-6, 0.010, 0.0025) == 2  # 50 µs every 2nd step of 10 ms: 0.25%
    assert period_for(50e-6, 1.0, 0.0025) == 1
    assert period_for(50e-6, None, 0.0025) == 1


def test_a_killed_process_leaves_every_finished_chunk_readable(tmp_path):
    """SIGKILL in the middle of spilling (no handler can run): every series-*.parquet is whole."""
    script = textwrap.dedent(f"""
        import sys
        from lmprof.measure.watch import Watcher
        w = Watcher({str(tmp_path / 'watch')!r}, chunk_rows=200, memory_every=1)
        w.start(0)
        for k in range(10**9):
            w.step_end(tokens=k)
            if k == 2000:
                print("spilling", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(SRC)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"spilling"
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    files = chunk_files(tmp_path)
    assert len(files) >= 10
    got = read_series(files)
    assert list(got["step"]) == list(range(len(got["step"])))  # whole chunks, in order, none twice
    np.testing.assert_array_equal(got["tokens"], got["step"])
