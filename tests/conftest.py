"""Shared test set-up: one torch thread per xdist worker (2 workers on 2 cores), tiny everything."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("LMPROF_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache-unused"))
# No quick bandwidth check in a CPU run (hardware/quick_bandwidth.py): it would cost every test run 0.4 s
# and leave a file in the shared cache above, making runs depend on the tests before them;
# tests/test_quick_calibration.py turns it back on with a cache of its own.
os.environ.setdefault("LMPROF_NO_QUICK_CALIBRATION", "1")
# Inductor checks each vector ISA the CPU reports by building and loading a probe library with it: six
# g++ runs and 6.6 s of CPU in the first test that compiles. The check guards against a compiler that
# cannot build for an ISA the CPU has; the tests trust the CPU's own list (cpuid), as inductor does
# for the ISA it then picks.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import sys  # noqa: E402

import pytest  # noqa: E402

# pytest rewrites each test file's asserts (4.3 s of a worker's 8.5 s collection) and caches the result
# beside it, unless bytecode writing is off, as PYTHONDONTWRITEBYTECODE turns it off on CI machines.
# On for this process only (the tests' subprocesses keep the environment's setting): xdist's second
# worker then reads what the first one wrote, and the stopwatch stage what both did.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        # Two xdist workers already keep both cores busy: inductor's compile pool would start two more
        # processes per worker, each importing torch. Compiling in the worker itself, a cold machine's
        # parallel stage took 187-193 s instead of 203 s (the two compile tests: 61 s instead of 69 s).
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # torch only where tests run: xdist's controller process runs none, and importing torch there
    # (1.5 s) delayed the start of both workers.
    elif config.getoption("numprocesses", None):
        return
    # Collection imports torch, transformers and every test module (and compiles their bytecode, on a
    # fresh clone): without the collector walking the growing heap meanwhile, a cold collection took
    # 9.3-10.3 s of CPU instead of 12.2-12.4 s. pytest_collection_finish releases it, frozen, as the
    # lmprof command does after its own start-up.
    from lmprof import gc_hold

    gc_hold.hold()
    import torch

    torch.set_num_threads(1)


@pytest.fixture
def cli(capsys):
    """Run the lmprof CLI in-process: returns (exit code, stdout, stderr)."""
    from lmprof.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run



class ScriptRun:
    """What ``lmprof run`` of a script did: exit code, stdout, stderr, its run folder and that folder's run.json
    (None: none written), and what the script wrote to the JSON file named by its first argument (None: nothing)."""

    def __init__(self, code: int, out: str, err: str, folder, record: dict | None, own) -> None:  # noqa: ANN001
        self.code, self.out, self.err, self.folder, self.record, self.own = code, out, err, folder, record, own

    def rows(self) -> dict[tuple[str, str], float]:
        """The run's block rows: (name, phase) -> time_ms."""
        assert self.record is not None, self.err
        return {(b["name"], b["phase"]): b["time_ms"] for b in self.record["blocks"]}


@pytest.fixture
def run_script(cli, tmp_path):
    """``lmprof run --no-report`` in-process on a script's text (``flags`` before the script, ``args`` after its first
    argument, a JSON file for its own stopwatch): a :class:`ScriptRun`."""
    import json

    def run(body: str, *flags: str, args: tuple[str, ...] = (), name: str = "loop.py") -> ScriptRun:
        script, own, runs = tmp_path / name, tmp_path / "own.json", tmp_path / "runs"
        script.write_text(body)
        code, out, err = cli("run", "--no-report", "--out", str(runs), *flags, str(script), str(own), *args)
        folder = sorted(runs.iterdir())[-1] if runs.exists() and any(runs.iterdir()) else None
        record = json.loads((folder / "run.json").read_text()) if folder is not None else None
        return ScriptRun(code, out, err, folder, record, json.loads(own.read_text()) if own.exists() else None)

    return run


# The hostile suites' shared checks: a refusal is one line, exit 2, before anything is measured.
def one_line_error(code: int, err: str, *needles: str) -> str:
    """Exit 2, exactly one non-empty stderr line starting 'lmprof: error:', no traceback, naming the problem."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("lmprof: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), lines[0]
    return lines[0]


@pytest.fixture
def no_measuring(monkeypatch):
    """Any measurement fails the test: refusals must come before the timed steps."""
    def boom(*a, **k):
        raise AssertionError("measured although the input was invalid")

    import lmprof.pipeline.infer as infer
    import lmprof.pipeline.train as train

    monkeypatch.setattr(train, "run_training", boom)
    monkeypatch.setattr(infer, "run_inference", boom)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (torch, transformers, lmprof and the test modules: it lives until
    the worker exits), so the collector stops walking it at each full collection: seven in-process test
    files took 36.7-38.5 s of CPU instead of 40.7-41.0 s. What the tests themselves create is collected
    as before: collection, held off since pytest_configure, is on again from here."""
    import gc

    from lmprof import gc_hold

    gc.collect()  # collection's own garbage is not frozen with the rest
    gc_hold.release()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
    """At the end of each test file, collect its garbage and freeze what is left (module caches, objects
    some library keeps), as the lmprof command freezes its start-up. Every lmprof run passes over what the
    collector tracks (live_objects: the models and optimizers alive; a full collection where two
    optimizers are alive) and paid for the whole worker's heap, which the files before it had grown:
    the parallel stage took 223 s, and 196 s with each file's leftovers frozen (get_objects: 12.6 s of
    the workers' CPU before, 0.2 s after; the collections in lmprof's runs: 13.8 s, 0.1 s)."""
    yield
    if nextitem is None or nextitem.path != item.path:
        import gc

        gc.collect()
        gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs the stopwatch stage on the files that say ``mark.stopwatch`` (it greps for it):
    a stopwatch test marked any other way would silently not run there.

    Under xdist the files with ``slow`` tests run first. Its worksteal hands each worker a contiguous
    share and lets an idle worker take the far end of the other's: with the long tests at the front,
    what is left to share at the end is short, and no worker waits out another's 30-second compile
    test alone."""
    for item in items:
        if item.get_closest_marker("stopwatch") is not None and "mark.stopwatch" not in item.path.read_text():
            raise pytest.UsageError(f"{item.nodeid}: mark stopwatch tests with @pytest.mark.stopwatch in their own "
                                    "file, where make test's stopwatch stage finds them")
    # xdist's workers only: the stopwatch stage keeps file order, where the compiled stopwatch test (its
    # inductor compile pool still starting up after it) comes after the noise-window tests, whose quiet
    # runs must see a quiet machine. Whole files move, in their own order: a module-scoped fixture is
    # built once only while its file's tests run together.
    if hasattr(config, "workerinput"):
        slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
        items.sort(key=lambda item: item.path not in slow_files)  # stable: file order otherwise
