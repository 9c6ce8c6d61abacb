"""The sweep folder's lock and the workers' point locks, now taken through filelock.

The behaviour tests (a second sweep refused naming the holder's pid, no stale lock after kill -9, the
runner waiting for a live worker) are in test_hostile.py; these pin what the library swap could break.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lmprof.errors import ConfigError
from lmprof.sweep import lock as sweep_lock_mod
from lmprof.sweep.lock import LOCK_NAME, PID_NAME, hold_point_lock, sweep_lock, wait_point_free

SRC = Path(__file__).resolve().parents[1] / "src"


def test_the_holders_pid_is_written_while_held_and_removed_on_release(tmp_path):
    with sweep_lock(tmp_path):
        assert (tmp_path / PID_NAME).read_text() == str(os.getpid())
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / PID_NAME).exists()
    with sweep_lock(tmp_path):  # released: the same process takes it again
        pass


def test_a_pid_file_left_by_a_killed_sweep_neither_blocks_nor_misleads(tmp_path):
    (tmp_path / PID_NAME).write_text("999999")  # a sweep killed with -9 leaves its pid file, never its lock
    with sweep_lock(tmp_path):
        assert (tmp_path / PID_NAME).read_text() == str(os.getpid())


def test_the_refusal_names_no_pid_when_the_pid_file_is_missing_or_junk(tmp_path):
    with sweep_lock(tmp_path):
        for content in (None, "not a pid\n"):
            pid_file = tmp_path / PID_NAME
            pid_file.unlink(missing_ok=True)
            if content is not None:
                pid_file.write_text(content)
            with pytest.raises(ConfigError) as info:
                with sweep_lock(tmp_path):
                    pass
            assert "(pid" not in str(info.value) and "another lmprof sweep is running" in str(info.value)


@pytest.mark.skipif(sys.platform == "win32", reason="a raw flock holder is POSIX only")
def test_a_sweep_of_the_earlier_flock_based_lmprof_still_excludes(tmp_path):
    """filelock takes the kernel's flock on the same file, so an older lmprof (raw fcntl.flock) running
    on the folder during an upgrade and this one exclude each other."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(tmp_path / LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(ConfigError, match="another lmprof sweep"):
            with sweep_lock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait(10)
    with sweep_lock(tmp_path):
        pass


def test_a_point_lock_outlives_its_dropped_return_value(tmp_path, monkeypatch):
    """The worker calls hold_point_lock() for its effect only: garbage collection must not release it."""
    monkeypatch.setattr(sweep_lock_mod, "_HELD", [])
    run_dir = tmp_path / "runs" / "p1"
    hold_point_lock(run_dir)
    gc.collect()
    assert not wait_point_free(run_dir, timeout_s=0.2)
    sweep_lock_mod._HELD[0].release()
    assert wait_point_free(run_dir, timeout_s=1)


def test_a_point_never_run_is_free_without_creating_a_lock_file(tmp_path):
    run_dir = tmp_path / "runs" / "never"
    assert wait_point_free(run_dir, timeout_s=0.1)
    assert not run_dir.parent.exists()


def test_a_worker_whose_runner_died_before_it_started_leaves_at_once(tmp_path):
    """The race behind test_killed_midway_then_resumed_loses_nothing's failures under load: a sweep
    SIGKILLed just after starting a worker, before the worker's first line ran. The worker used to read
    its runner's pid with os.getppid() once it was up, got the reaper's, and so ran its whole point
    unwatched while holding the point lock (the resumed sweep gave up waiting and recorded an error)."""
    from lmprof.sweep.spec import parse_spec
    from lmprof.sweep.worker import RESULT_PREFIX

    (point,) = parse_spec({"models": [{"name": "mini", "n_layer": 1, "n_head": 2, "n_embd": 32}],
                           "devices": ["cpu"], "steps": 1, "warmup": 0}).expand().points
    run_dir = tmp_path / "runs" / point.id
    run_dir.mkdir(parents=True)
    point_json = run_dir / "point.json"
    point_json.write_text(point.model_dump_json())
    log = run_dir / "worker.log"
    # A stand-in runner that starts the worker exactly as the runner does, then dies at once.
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from pathlib import Path
        from lmprof.sweep.runner import start_worker
        with open({str(log)!r}, "wb") as fh:
            start_worker(Path({str(point_json)!r}), Path({str(run_dir)!r}), fh)
        os._exit(0)
    """)], check=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    deadline = time.monotonic() + 60  # a liveness bound only: the worker leaves in well under a second
    while "is gone; leaving" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    assert f"{RESULT_PREFIX}the sweep that started this worker" in text, text[-2000:]
    assert not (run_dir / "run.json").exists()
    assert wait_point_free(run_dir, timeout_s=10)  # it is gone, and holds nothing
