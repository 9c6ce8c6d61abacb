"""Capture decisions (the rate limiter, SIGUSR2, the 'capture' file) and the diff of a captured window
against the baseline window, on block and operator tables written by hand."""
from __future__ import annotations

import os
import signal

import pytest

from lmprof.analysis.watch_capture import CaptureLimiter, capture_diff, diff_runs, profiled_spread
from lmprof.measure.watch.requests import CAPTURE_FILE, CaptureRequests, FileRequests, SignalRequests
from lmprof.record.run import Block, Env, OpStat, Run, WatchAlert


def alert(kind="drift", step=0):
    return WatchAlert(kind=kind, first_step=step, last_step=step, message="")


def test_the_limiter_keeps_a_minimum_gap_and_a_maximum_count():
    lim = CaptureLimiter(min_gap_steps=100, max_captures=2)
    assert lim.refuse(10, "alert", alert()) is None
    lim.begin(10)
    assert "fewer than the minimum gap of 100" in lim.refuse(60, "alert", alert())
    assert lim.refuse(60, "signal") is None  # the user's own request skips the gap...
    assert lim.refuse(110, "alert", alert("input_bound")) is None
    lim.begin(110)
    assert "the maximum" in lim.refuse(5000, "file")  # ...never the maximum
    assert "straggler alerts ask for none" in CaptureLimiter().refuse(0, "alert", alert("straggler"))
    # a spike is reported once it is over: the steps after it are ordinary ones, not worth a capture
    assert "spike alerts ask for none" in CaptureLimiter().refuse(0, "alert", alert("spike"))
    assert CaptureLimiter(max_captures=0).refuse(0, "signal") is not None
    with pytest.raises(ValueError):
        CaptureLimiter(min_gap_steps=-1)


def blk(name, phase, profiled, spread=None, time_ms=None):
    t = time_ms if time_ms is not None else profiled
    return Block(name=name, phase=phase, time_ms=t, profiled_ms=profiled, pct=0.0, spread_ms=spread)


def op(name, self_ms, phase="forward", device_ms=None):
    return OpStat(name=name, calls=1, self_ms=self_ms, total_ms=self_ms, self_pct=0.0, phase=phase, device_ms=device_ms)


BEFORE_BLOCKS = [blk("embedding", "forward", 0.5), blk("layers.*.slow", "forward", 2.0, spread=0.1),
                 blk("lm_head", "forward", 3.0, spread=0.1), blk("layers.*.slow", "backward", 4.0, spread=0.2)]
BEFORE_OPS = [op("aten::addmm", 5.0), op("aten::relu", 0.3), op("aten::addmm", 8.0, "backward")]


def test_a_module_that_tripled_and_a_new_matmul_are_named_with_their_figures():
    after_blocks = [blk("embedding", "forward", 0.51), blk("layers.*.slow", "forward", 6.0, spread=0.1),
                    blk("lm_head", "forward", 3.0, spread=0.1), blk("layers.*.slow", "backward", 4.05, spread=0.2)]
    after_ops = [op("aten::addmm", 5.1), op("aten::relu", 0.3), op("aten::mm", 3.9), op("aten::addmm", 8.0, "backward")]
    grew = capture_diff(BEFORE_BLOCKS, BEFORE_OPS, after_blocks, after_ops, rel_spread=0.02)
    beyond = [(g.kind, g.name, g.phase) for g in grew if g.beyond_noise]
    assert beyond == [("block", "layers.*.slow", "forward"), ("operator", "aten::mm", "forward")]
    slow = grew[0]
    assert (slow.before_ms, slow.after_ms, slow.delta_ms, slow.ratio, slow.status) == (2.0, 6.0, 4.0, 3.0, "grew")
    mm = next(g for g in grew if g.name == "aten::mm")
    assert mm.status == "new" and mm.ratio is None and mm.after_ms == 3.9 and mm.before_ms == 0.0
    # what moved within noise is listed after, marked so; what did not grow is not listed
    within = {(g.name, g.phase) for g in grew if not g.beyond_noise}
    assert ("embedding", "forward") in within and ("aten::addmm", "forward") in within
    assert all(g.name != "lm_head" and g.name != "aten::relu" for g in grew)


def test_on_a_gpu_run_operators_compare_by_device_time():
    before = [op("aten::mm", 0.1, device_ms=2.0)]
    after = [op("aten::mm", 0.1, device_ms=5.0)]
    (g,) = capture_diff([], before, [], after)
    assert g.kind == "operator" and g.delta_ms == pytest.approx(3.0)


def run_with(blocks, ops, steps_ms):
    env = Env(device="cpu", device_name="x", torch="2", python="3", lmprof="0", os="l", cpu="c", threads=1)
    return Run(id="r", mode="train", created="now", env=env, config={}, blocks=blocks, ops=ops,
               tables={"attribution": [{"profiled_step_ms": steps_ms}]})


def test_diff_runs_takes_the_noise_from_the_profiled_steps():
    base = run_with(BEFORE_BLOCKS, BEFORE_OPS, [10.0, 10.5, 11.0, 10.2])
    assert profiled_spread(base) == pytest.approx((10.85 - 10.06) / 10.35)
    cap = run_with([blk("lm_head", "forward", 3.6, spread=0.1)], BEFORE_OPS, [13.0, 13.1])
    (g,) = [g for g in diff_runs(base, cap) if g.kind == "block"]
    # twice the larger of the block's own spread (0.1 ms) and the profiled steps' relative spread x its time
    assert g.name == "lm_head" and g.beyond_noise
    assert g.noise_ms == pytest.approx(2 * max(0.1, profiled_spread(base) * 3.0))


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="no SIGUSR2 on this platform")
def test_sigusr2_asks_for_one_capture_and_the_default_comes_back():
    before = signal.getsignal(signal.SIGUSR2)
    assert before is signal.SIG_DFL
    sig = SignalRequests()
    assert sig.install() and sig.installed
    os.kill(os.getpid(), signal.SIGUSR2)
    assert sig.take() is True and sig.take() is False
    sig.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


@pytest.mark.skipif(not hasattr(signal, "SIGUSR2"), reason="no SIGUSR2 on this platform")
def test_a_program_with_its_own_sigusr2_handler_keeps_it():
    got = []

    def mine(signum, frame):
        got.append(signum)

    signal.signal(signal.SIGUSR2, mine)
    try:
        sig = SignalRequests()
        assert not sig.install() and "handles SIGUSR2 itself" in sig.note
        os.kill(os.getpid(), signal.SIGUSR2)
        assert got == [signal.SIGUSR2] and not sig.take()
        sig.uninstall()
        assert signal.getsignal(signal.SIGUSR2) is mine
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_touching_capture_asks_once_and_is_looked_for_at_most_once_a_period(tmp_path):
    req = FileRequests(tmp_path, period_s=1.0)
    assert not req.poll(0.0)
    (tmp_path / CAPTURE_FILE).touch()
    assert not req.poll(0.5)  # not looked for yet
    assert req.poll(1.0) and not (tmp_path / CAPTURE_FILE).exists()
    assert not req.poll(2.0)  # consumed: one touch, one capture


def test_a_capture_symlink_is_removed_never_its_target_and_a_folder_is_a_note(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    run = tmp_path / "run [x] $y"
    run.mkdir()
    (run / CAPTURE_FILE).symlink_to(target)
    req = FileRequests(run, period_s=0.0)
    assert req.poll(0.0) and target.read_text() == "keep" and not (run / CAPTURE_FILE).is_symlink()
    (run / CAPTURE_FILE).mkdir()
    assert not req.poll(1.0) and "cannot be consumed" in req.note
    assert not req.poll(2.0)


def test_both_sources_together(tmp_path):
    reqs = CaptureRequests(tmp_path, signals=False, period_s=0.0)
    assert reqs.poll(0.0) is None
    (tmp_path / CAPTURE_FILE).touch()
    assert reqs.poll(1.0) == "file"
    reqs.signals._flag = True  # what the handler does
    assert reqs.poll(2.0) == "signal"
    reqs.close()
    assert reqs.notes() == []
