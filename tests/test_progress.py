"""Long work says how far it has come: step i/N with an ETA, as plain lines on stderr when not a terminal.
(``lmprof train``'s own count is checked in tests/test_export_tensorboard.py::test_log_to_on_train, which
runs one anyway.)"""
from __future__ import annotations

from lmprof import progress
from lmprof.cli.common import _Status


def test_plain_lines_count_steps_and_estimate_what_is_left(monkeypatch, capsys) -> None:
    # The listener is made at 0 s, then one clock reading per report.
    clock = iter([0.0, 2.0, 10.0, 20.0, 25.0, 40.0, 41.0]).__next__
    monkeypatch.setattr("lmprof.cli.common.time.monotonic", clock)
    with progress.listening(_Status("profiling", None, every_s=10.0, quiet_s=5.0)):
        progress.report("step", 1, 5)  # 2 s: still quiet (a short run prints nothing)
        progress.report("step", 2, 5)  # 10 s, 5 s a step: 3 left, ~15 s
        progress.report("step", 3, 5)  # 20 s: 10 s since the last line
        progress.report("step", 4, 5)  # 25 s: within every_s, no line
        progress.report("step", 6, 5)  # more than planned (a FLOPs step): N grows, never i > N
        progress.report("reading the trace")  # a new stage: a line
    assert capsys.readouterr().err.splitlines() == [
        "lmprof: profiling: step 2/5, ~15 s left",
        "lmprof: profiling: step 3/5, ~13 s left",
        "lmprof: profiling: step 6/6",
        "lmprof: profiling: reading the trace",
    ]


def test_nobody_listening_and_a_failing_listener_change_nothing() -> None:
    progress.report("step", 1, 2)

    def broken(event: progress.Progress) -> None:
        raise RuntimeError("a terminal that went away")

    with progress.listening(broken):
        progress.report("step", 1, 2)
