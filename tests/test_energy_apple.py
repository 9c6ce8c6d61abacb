"""powermetrics meter against a fake subprocess.run: never prompts, time-limited, exact integration."""
from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

from lmprof.measure.energy.apple import PowermetricsMeter, parse_powermetrics

SAMPLE = """*** Sampled system activity (Tue Jan  2 10:00:00 2024 +0000) (200.51ms elapsed) ***

**** Processor usage ****
CPU Power: 3210 mW
GPU Power: 1500 mW
ANE Power: 0 mW
Combined Power (CPU + GPU + ANE): {mw} mW
"""


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeRun:
    """Records each command line; answers with the queued outputs."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> Any:
        self.calls.append((cmd, kwargs))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


def ok(mw: float) -> SimpleNamespace:
    return SimpleNamespace(returncode=0, stdout=SAMPLE.format(mw=mw), stderr="")


def meter(run: FakeRun, *, euid: int = 501, platform: str = "darwin", clock: FakeClock | None = None) -> PowermetricsMeter:
    return PowermetricsMeter(
        run=run, platform=platform, which=lambda _: "/usr/bin/powermetrics",
        geteuid=lambda: euid, clock=clock or FakeClock(), threaded=False,
    )


def test_parse_combined_and_parts() -> None:
    assert parse_powermetrics(SAMPLE.format(mw=4710)) == 4.71
    assert parse_powermetrics("CPU Power: 1000 mW\nGPU Power: 500 mW\n") == 1.5


def test_not_macos_is_unavailable() -> None:
    run = FakeRun(ok(1))
    avail = meter(run, platform="linux").probe()
    assert not avail.ok and "macOS" in avail.reason
    assert run.calls == []


def test_missing_tool_is_unavailable() -> None:
    m = PowermetricsMeter(platform="darwin", which=lambda _: None, run=FakeRun(ok(1)))
    avail = m.probe()
    assert not avail.ok and "not found" in avail.reason


def test_sudo_that_would_prompt_is_unavailable_without_prompting() -> None:
    run = FakeRun(SimpleNamespace(returncode=1, stdout="", stderr="sudo: a password is required\n"))
    avail = meter(run, euid=501).probe()
    assert not avail.ok
    assert "never prompts" in avail.reason and "sudo" in avail.reason
    cmd, kwargs = run.calls[0]
    assert cmd[:2] == ["sudo", "-n"]  # -n: fail instead of asking for a password
    assert kwargs["timeout"] > 0 and kwargs["stdin"] is subprocess.DEVNULL


def test_hanging_powermetrics_is_unavailable_after_timeout() -> None:
    run = FakeRun(subprocess.TimeoutExpired(["powermetrics"], 3.2))
    avail = meter(run, euid=0).probe()
    assert not avail.ok and "within" in avail.reason


def test_root_runs_directly_and_integrates_samples_exactly() -> None:
    clock = FakeClock(0.0)
    run = FakeRun(ok(4000), ok(5000), ok(7000))
    m = meter(run, euid=0, clock=clock)
    assert m.probe().ok  # first answer: 4 W probe sample
    assert run.calls[0][0][0] == "/usr/bin/powermetrics"
    m.begin()  # window opens at 0 s; no sample is taken synchronously
    clock.t = 1.0
    m.sample()  # 5 W at 1 s
    clock.t = 2.0
    m.sample()  # 7 W at 2 s
    win = m.end()
    # 0..1 s held at the first sample (5 W) -> 5 J; 1..2 s trapezoid (5 -> 7 W) -> 6 J
    assert win.joules == 11.0
    assert win.seconds == 2.0
    assert win.samples == 2
    assert win.note and "approximate" in win.note
