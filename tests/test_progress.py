"""Long work says how far it has come: step i/N with an ETA, as plain lines on stderr when not a terminal.
(``lmprof train``'s own count is checked in tests/test_export_tensorboard.py::test_log_to_on_train, which
runs one anyway.)"""
from __future__ import annotations

from lmprof import progress
from lmprof.cli.common import _Status


def test_plain_lines_count_steps_and_estimate_what_is_left(monkeypatch, capsys) -> None:
    clock = iter([0.0, 10.0, 20.0, 30.0, 31.0, 40.0]).__next__  # listener made, then one per report
    monkeypatch.setattr("lmprof.cli.common.time.monotonic", clock)
    with progress.listening(_Status("profiling", None, every_s=100.0)):
        progress.report("step", 1, 4)  # 10 s for the first step: 3 left, ~30 s
        progress.report("step", 2, 4)  # within every_s: no line
        progress.report("step", 4, 4)  # the last one: a line
        progress.report("step", 5, 4)  # more than planned (a FLOPs step): N grows, never i > N
        progress.report("reading the trace")
    assert capsys.readouterr().err.splitlines() == [
        "lmprof: profiling: step 1/4, ~30 s left",
        "lmprof: profiling: step 4/4",
        "lmprof: profiling: step 5/5",
        "lmprof: profiling: reading the trace",
    ]


def test_nobody_listening_and_a_failing_listener_change_nothing() -> None:
    progress.report("step", 1, 2)

    def broken(event: progress.Progress) -> None:
        raise RuntimeError("a terminal that went away")

    with progress.listening(broken):
        progress.report("step", 1, 2)

