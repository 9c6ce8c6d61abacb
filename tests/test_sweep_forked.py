"""How sweep workers start: forked from a server with torch imported, or a new Python per point.
Either way a worker is a process of its own that sees the runner's environment as it is when the
point starts (the truth: a variable set after the server started reaches the worker)."""
from __future__ import annotations

import multiprocessing.forkserver

import pytest

from lmprof.errors import ConfigError
from lmprof.sweep import forked
from lmprof.sweep.runner import FORKSERVER, START_ENV, SUBPROCESS, LocalExecutor, run_point
from lmprof.sweep.spec import parse_spec
from lmprof.sweep.worker import FAKE_OOM_ENV

POINT = {"models": [{"name": "mini", "n_layer": 1, "n_head": 2, "n_embd": 32}], "batch_sizes": [2], "seq_lens": [16],
         "devices": ["cpu"], "steps": 1, "warmup": 0, "profile_steps": 1, "energy": "off"}


@pytest.mark.parametrize("start", [FORKSERVER, SUBPROCESS])
def test_a_worker_sees_the_runners_environment_as_it_is_now(tmp_path, monkeypatch, start):
    (point,) = parse_spec(POINT).expand().points
    if start == FORKSERVER:
        assert forked.available()
        forked._server()
        multiprocessing.forkserver.ensure_running()  # the server starts (and takes its environment) now
    # Set after the server started: only a worker that takes the runner's environment sees it. The fake
    # OOM is raised after the imports, before the model is built: the cheapest real outcome there is.
    monkeypatch.setenv(FAKE_OOM_ENV, point.id)
    outcome = run_point(point, tmp_path / point.id, timeout_s=300, start=start)
    assert outcome.status == "oom" and FAKE_OOM_ENV in (outcome.message or ""), outcome
    log = (tmp_path / point.id / "worker.log").read_text()
    last = log.rstrip().splitlines()[-1]
    assert last.startswith("lmprof.sweep: ") and f"(simulated by {FAKE_OOM_ENV} for point {point.id})" in last, log


def test_the_start_method_is_checked(monkeypatch):
    monkeypatch.setenv(START_ENV, "fork")
    with pytest.raises(ConfigError, match=START_ENV):
        LocalExecutor()
    monkeypatch.setenv(START_ENV, SUBPROCESS)
    assert LocalExecutor().start == SUBPROCESS
    monkeypatch.delenv(START_ENV)
    assert LocalExecutor().start == FORKSERVER


def test_forked_workers_collect_with_the_servers_imports_frozen():
    """The server imported torch and lmprof's pipeline with the collector held, then froze them: a
    worker forked from it collects as any process does, without walking those objects (exit code 0
    says what the worker saw: collection on, and torch's objects among the frozen)."""
    ctx = forked._server()
    check = ("import gc, os, sys\n"
             "os._exit(0 if gc.isenabled() and gc.get_freeze_count() > 100_000 and 'torch' in sys.modules else 3)")
    proc = ctx.Process(target=exec, args=(check,))  # type: ignore[attr-defined]
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
