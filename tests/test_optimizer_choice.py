"""Which optimizer's steps are a script's steps, and which module is its model, when lmprof only
watches torch.optim's global step hooks: the largest optimizer; the outermost module holding its
parameters; never an optimizer or a model of code that already finished (kept alive only by a
reference cycle). The collector runs only when such leftovers could change the answer: it costs
0.15-0.3 s of the user's first step."""
from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lmprof.pipeline.protocol import triggers
from lmprof.pipeline.protocol.triggers import OptimizerTrigger


class FakeSession:
    def __init__(self) -> None:
        self.observed = SimpleNamespace(notes=[], device=None, optimizers=[], model=None)
        self.attached: list[Any] = []

    @property
    def notes(self) -> list[str]:
        return self.observed.notes

    def attach(self, model: torch.nn.Module, optimizers: list[Any], compiled: bool, outer: Any = None) -> None:
        self.attached.append((model, optimizers, compiled))
        self.observed.model, self.observed.optimizers = model, list(optimizers)


def _step(opt: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    model(torch.randn(2, model[0].in_features)).sum().backward()
    opt.step()
    opt.zero_grad()


def _choose(stepped: torch.optim.Optimizer) -> tuple[OptimizerTrigger, FakeSession]:
    session = FakeSession()
    trigger = OptimizerTrigger(session)  # type: ignore[arg-type]
    trigger._choose(stepped)
    return trigger, session


@pytest.fixture
def collect_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts lmprof's calls of gc.collect (the real collection still runs)."""
    calls: list[int] = []
    real = gc.collect

    def counted(*a: Any) -> int:
        calls.append(1)
        return real(*a)

    monkeypatch.setattr("lmprof.pipeline.protocol.triggers.gc", SimpleNamespace(collect=counted,
                                                                                   get_objects=gc.get_objects))
    return calls


def _leave_a_cycle(n: int) -> None:
    """Code that finished: a bigger model and its optimizer, alive only through a reference cycle."""
    old = torch.nn.Sequential(torch.nn.Linear(n, n), torch.nn.Linear(n, n))
    opt = torch.optim.SGD(old.parameters(), lr=0.1)
    _step(opt, old)
    old.me = [old, opt]  # type: ignore[assignment]  # the cycle


def test_one_optimizer_one_model_needs_no_collection(collect_calls, monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # A script's process, without the optimizers and models other tests left alive in this worker
    real = triggers.live_objects
    ours = {id(opt), *(id(m) for m in model.modules())}
    monkeypatch.setattr(triggers, "live_objects", lambda *types: [o for o in real(*types) if id(o) in ours])
    trigger, session = _choose(opt)
    assert trigger.chosen is opt
    assert session.attached[0][0] is model  # the outermost, not one of its Linear layers
    assert collect_calls == []


def test_the_largest_of_two_optimizers_is_chosen_and_named(collect_calls):
    gen = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    disc = torch.nn.Sequential(torch.nn.Linear(16, 1))
    g_opt, d_opt = torch.optim.Adam(gen.parameters()), torch.optim.SGD(disc.parameters(), lr=0.1)
    _step(d_opt, disc)  # the discriminator steps first
    trigger, session = _choose(d_opt)
    assert trigger.chosen is g_opt and session.attached[0][0] is gen
    assert any("2 optimizers" in n and "Adam" in n and "not stepping the model: SGD" in n for n in session.notes), \
        session.notes
    assert len(collect_calls) == 1  # two candidates: leftovers could matter, so the collector ran


def test_an_optimizer_of_finished_code_is_not_counted():
    gc.collect()
    gc.disable()  # the leftover must still be there when lmprof looks, as between two collections
    try:
        _leave_a_cycle(64)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        leftovers = [o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer) and o is not opt]
        assert leftovers, "the test's leftover was collected before lmprof looked"
        del leftovers
        trigger, session = _choose(opt)
    finally:
        gc.enable()
    assert trigger.chosen is opt and session.attached[0][0] is model
    assert not any("optimizers" in n for n in session.notes), session.notes


def test_a_dead_wrapper_of_the_model_is_not_taken_for_it():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gc.collect()
    gc.disable()
    try:
        # Finished code wrapped the same layers in a bigger module: it holds the same parameters and
        # has more submodules, so only the collection keeps it from being "the outermost".
        dead = torch.nn.Sequential(model[0], model[1], torch.nn.ReLU())
        dead.me = dead  # type: ignore[assignment]
        del dead
        trigger, session = _choose(opt)
    finally:
        gc.enable()
    assert session.attached[0][0] is model


def test_a_dead_weakref_proxy_in_the_process_changes_nothing():
    # isinstance() on a proxy whose object died raises ReferenceError (a GradScaler / compile run
    # leaves such proxies about): the scan must not ask them for their class.
    import weakref

    class Thing:
        pass

    thing = Thing()
    proxies = [weakref.proxy(thing)]
    del thing
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trigger, session = _choose(opt)
    assert trigger.chosen is opt and session.attached[0][0] is model
    assert len(proxies) == 1


def test_a_failure_while_choosing_is_one_line_and_the_users_step_goes_on(tmp_path, monkeypatch, capsys):
    from lmprof.pipeline.protocol.session import Session
    from lmprof.pipeline.protocol.spec import Spec

    def boom(*types: type) -> list[Any]:
        raise RuntimeError("scan failed")

    monkeypatch.setattr(triggers, "live_objects", boom)
    session = Session(Spec(out=tmp_path, verbose=False))
    trigger = OptimizerTrigger(session)
    trigger.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            _step(opt, model)  # raises nothing
    finally:
        trigger.remove()
    assert session.failed
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("lmprof: stopped measuring") and "scan failed" in err[0], err


def test_after_the_window_the_optimizer_hooks_return_at_once_unless_a_window_records(tmp_path, monkeypatch):
    """Under the whole-run watch the hooks run in every optimizer step of the user's loop until it ends:
    after the profiled window, with nothing recording, they reach none of the session's scopes (each
    call walked every window for probes); a capture (a window whose probes() is not None) gets them again."""
    import lmprof
    from lmprof.pipeline.protocol.windows import Windows

    calls: list[str] = []
    real = Windows.recording
    monkeypatch.setattr(Windows, "recording", lambda self: (calls.append("recording"), real(self))[1])
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with lmprof.profile(model, out=tmp_path, report=False, verbose=False, warmup=1, steps=2, profile_steps=1,
                        watch=True, watch_max_captures=0) as prof:
        for _ in range(30):  # the plan's steps (figures, FLOPs, gaps) until the profiled window is collected
            _step(opt, model)
            prof.step()
            if prof.session.collected:
                break
        assert prof.session.collected and calls  # the window's steps had their scopes
        calls.clear()
        for _ in range(3):
            _step(opt, model)
            prof.step()
        assert calls == []
        trigger = OptimizerTrigger(prof.session, boundaries=False)  # the door's, as it judges
        recording = SimpleNamespace(probes=lambda: object(), steps_after_window=False)
        prof.session.windows.more.append(recording)
        try:
            assert trigger._scoping()
        finally:
            prof.session.windows.more.remove(recording)
        assert not trigger._scoping()
