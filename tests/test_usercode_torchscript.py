"""TorchScript models under ``lmprof.profile`` (found by attack: a ScriptModule refuses hooks, and
the refusal, raised while the session began, went through to the user's script as a traceback).

Truths: the user's loop runs every step and the with-block returns normally; the operators the
trace holds are the model's (two Linear layers: two addmm per forward).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmprof


def _loop(model: torch.nn.Module, out: Path, steps: int = 8) -> tuple[object, int]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    done = 0
    with lmprof.profile(model, out=out, warmup=1, steps=2, profile_steps=1, report=False, verbose=False) as prof:
        for _ in range(steps):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
            done += 1
    return prof, done


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def test_a_script_module_is_measured_without_hooks_and_says_so(tmp_path: Path) -> None:
    prof, done = _loop(torch.jit.script(_mlp()), tmp_path)
    assert done == 8
    run = prof.run  # type: ignore[attr-defined]
    assert run is not None and run.value("step_time")
    assert any(n.startswith("TorchScript: the model is a ScriptModule") for n in run.notes), run.notes
    assert {b.name for b in run.blocks} >= {"optimizer", "autograd_engine"}
    assert not {"model_glue", "0", "2"} & {b.name for b in run.blocks}  # no hook was placed
    assert {o.name: o.calls for o in run.ops}.get("aten::addmm") == 2  # the figures step's forward


def test_a_scripted_submodule_stays_in_its_parents_time(tmp_path: Path) -> None:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 32)
            self.b = torch.jit.script(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(32, 10)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    prof, done = _loop(Model(), tmp_path)
    assert done == 8
    names = {b.name for b in prof.run.blocks}  # type: ignore[attr-defined]
    assert {"a", "model_glue"} <= names and not any(n.startswith("b") for n in names), names


def test_a_failure_as_the_session_begins_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from lmprof.pipeline.protocol.windows import figures as figures_step

    def broken(self: object) -> None:
        raise RuntimeError("hooks refused")

    monkeypatch.setattr(figures_step.FiguresStep, "start", broken)
    prof, done = _loop(_mlp(), tmp_path)
    assert done == 8 and prof.run is None  # type: ignore[attr-defined]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lmprof:") and "hooks refused" in err[0], err
    assert not torch.autograd.profiler._is_profiler_enabled
