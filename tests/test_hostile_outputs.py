"""Hostile input, round 3 (issue 29, items 1, 3-8): where runs write, what they print, how they stop.

Each class ends in one line on stderr and exit 2 (or the documented code), with nothing finished
lost. The CLI runs in-process (the ``cli`` fixture) except where a real process is under test
(parallel runs, signals, an import-time failure). docs/reliability.md lists the guarantee each test
holds.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lmprof.atomic import WriteError, atomic_path, write_bytes
from lmprof.errors import DataError
from lmprof.record.store import DB_NAME, Store
from sweep_fakes import _run, fake_sweep
from tests.test_usercode_ending import sigint_default

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
# The cheapest real training run: one layer, 8 tokens, one timed and one profiled step, no plots.
TINY = ["--preset", "tiny", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "-t", "8", "--warmup", "0",
        "--profile-steps", "1", "--energy", "off", "--no-report"]


from conftest import one_line_error  # noqa: E402  (the no_measuring fixture is in conftest too)


def no_tmp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp" in p.name]


def _cli_train_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("plots: false\n")
    return cfg


# == 1. parallel runs into one --out ==================================================================

def _cpu():
    from lmprof.hardware.devices import resolve_device

    return resolve_device("cpu")


def test_concurrent_claims_get_distinct_existing_folders(tmp_path):
    from lmprof.pipeline.protocol.folder import run_folder

    device, barrier, got = _cpu(), threading.Barrier(8), []

    def claim() -> None:
        barrier.wait()
        got.append(run_folder(tmp_path / "race", "train", "tiny", device, batch=4))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 8, got
    assert all(p.is_dir() for p in got)  # claimed, not merely named


def test_folder_name_has_batch_size_and_device_index(tmp_path):
    from types import SimpleNamespace

    from lmprof.pipeline.protocol.folder import run_folder

    cuda1 = SimpleNamespace(kind="cuda", torch_device=torch.device("cuda", 1))
    cuda0 = SimpleNamespace(kind="cuda", torch_device=torch.device("cuda", 0))
    a = run_folder(tmp_path, "train", "tiny", cuda0, batch=8)  # type: ignore[arg-type]
    b = run_folder(tmp_path, "train", "tiny", cuda1, batch=8)  # type: ignore[arg-type]
    assert a.name.endswith("-train-tiny-b8-cuda0") and b.name.endswith("-train-tiny-b8-cuda1")


@pytest.mark.slow
def test_four_parallel_trains_into_one_out_keep_four_complete_folders(tmp_path):
    cfg = _cli_train_config(tmp_path)
    batches = [1, 1, 2, 2]  # pairs with the same name: the claim must tell them apart
    # no report: its plots cost each run 1.8 s of CPU, and the race is for the folder, claimed before it
    procs = [subprocess.Popen([sys.executable, "-m", "lmprof", "train", *TINY, "-b", str(b), "--steps", "1",
                               "--no-report", "-c", str(cfg), "--out", str(tmp_path / "race[v2]")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
             for b in batches]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [o[1][-2000:] for o in outs]
    folders = sorted(p for p in (tmp_path / "race[v2]").iterdir())
    assert len(folders) == 4, folders
    seen = []
    for folder in folders:
        assert {"run.json", "trace.json.gz"} <= {p.name for p in folder.iterdir()}, folder
        assert not (folder / "INCOMPLETE").exists()
        record = json.loads((folder / "run.json").read_text())
        assert record["id"] == folder.name
        seen.append(record["config"]["batch_size"])
    assert sorted(seen) == batches
    printed = {line.split("run folder: ", 1)[1].strip() for o in outs
               for line in o[0].decode().splitlines() if "run folder: " in line}
    assert printed == {str(f) for f in folders}


# == 3. a broken peak file ============================================================================

def test_broken_peaks_file_leaves_help_working():
    env = {**ENV, "LMPROF_PEAKS": "/nonexistent/peaks.yaml"}
    done = subprocess.run([sys.executable, "-m", "lmprof", "--help"], capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "lmprof", "memory", "--help"], capture_output=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_broken_peaks_file_is_one_line_for_commands_that_need_it(cli, monkeypatch, tmp_path):
    bad = tmp_path / "peaks.yaml"
    bad.write_text("devices: [unclosed\n")
    monkeypatch.setenv("LMPROF_PEAKS", str(bad))
    code, _, err = cli("memory", "--device", "h100")
    one_line_error(code, err, "peak file")
    monkeypatch.setenv("LMPROF_PEAKS", "/nonexistent/peaks.yaml")
    code, _, err = cli("roofline", "--device", "h100")
    one_line_error(code, err, "LMPROF_PEAKS")


# == 4. outputs written over inputs ===================================================================

def test_results_csv_onto_the_store_is_refused(cli, tmp_path):
    sweep = fake_sweep(tmp_path / "sw")
    store = sweep / DB_NAME
    before = store.read_bytes()
    code, _, err = cli("results", sweep, "--csv", store)
    one_line_error(code, err, "--csv", "results.sqlite")
    link = tmp_path / "link.csv"
    link.symlink_to(store)
    code, _, err = cli("results", sweep, "--parquet", link)
    one_line_error(code, err, "--parquet")
    assert store.read_bytes() == before


def test_report_out_onto_the_record_or_trace_is_refused(cli, tmp_path):
    folder = tmp_path / "R"
    _run("r1", "train", "tiny", 2, 32).save(folder)
    (folder / "trace.json.gz").write_bytes(b"not read")
    record = (folder / "run.json").read_bytes()
    for target in (folder / "run.json", folder / "trace.json.gz", folder / "." / "run.json"):
        code, _, err = cli("report", folder, "--out", target)
        one_line_error(code, err, "--out")
    assert (folder / "run.json").read_bytes() == record
    code, _, err = cli("report", folder, "--out", folder / "elsewhere.html")  # beside the inputs: fine
    assert code == 0, err


def test_roofline_out_onto_its_model_config_is_refused(cli, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64,
                                  "vocab_size": 256, "n_positions": 64}))
    before = config.read_bytes()
    code, _, err = cli("roofline", "--model", config, "--device", "h100", "--out", config)
    one_line_error(code, err, "--out", "input")
    assert config.read_bytes() == before


# == 5. rich markup and mathtext in names and paths ===================================================

def test_cli_console_prints_brackets_as_they_are(capsys):
    from lmprof.cli.common import console

    console.print("run folder: runs[v2]/x[/]/[bold]b[/]")
    assert "run folder: runs[v2]/x[/]/[bold]b[/]" in capsys.readouterr().out


def test_summary_of_a_model_named_like_markup(tmp_path):
    from lmprof.show.summary import render
    from rich.console import Console
    import io

    run = _run("b[/]", "train", "m[/]", 2, 32)
    run.config["model_name"] = "m[/]"
    run.notes.append("a note with [red]markup[/red] and [/]")
    buf = io.StringIO()
    render(run, Console(file=buf, width=200, markup=True), folder="runs[v2]/b[/]")  # even a markup console
    text = buf.getvalue()
    assert "runs[v2]/b[/]" in text and "[red]markup[/red] and [/]" in text


def test_the_report_line_of_a_users_run_keeps_brackets_in_its_path(cli, tmp_path):
    """`lmprof run --out 'runs[bold]x'` printed "report: .../runsx/.../report.html": rich read the folder's
    '[bold]' as markup, and the path it printed was not the report's."""
    script = tmp_path / "loop.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(8):\n    m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()\n")
    out = tmp_path / "runs[bold]x[/]"
    code, _, err = cli("run", "--out", str(out), "--warmup", "1", "--steps", "2", "--profile-steps", "1", str(script))
    assert code == 0, err
    (folder,) = out.iterdir()
    (line,) = [ln for ln in err.splitlines() if ln.startswith("report: ")]
    assert line.startswith(f"report: {folder / 'report.html'}  ("), line
    assert (folder / "report.html").is_file()


def test_compare_runs_with_markup_ids(cli, tmp_path):
    a, b = tmp_path / "a[/]", tmp_path / "runs[v2]"
    _run("b[/]", "train", "tiny", 2, 32).save(a)
    _run("c[bold]", "train", "tiny", 2, 32).save(b)
    code, out, err = cli("compare", a, b, "--no-trace")
    assert code == 0, err
    assert "b[/]" in out and "runs[v2]" in out and "c[bold]" in out


def test_sweep_progress_line_with_markup_label(capsys):
    from rich.console import Console

    from lmprof.sweep.progress import ConsoleProgress
    from types import SimpleNamespace

    progress = ConsoleProgress(Console(file=sys.stdout, width=200))
    point = SimpleNamespace(id="p[/]", label="m[/] b1")
    outcome = SimpleNamespace(status="error", duration_s=1.0, message="failed [/] here")
    progress.t_point = time.monotonic()
    progress.task = progress.progress.add_task("sweep", total=1, current="x", counts="", left="")
    progress.point_finished(point, outcome, "")
    out = capsys.readouterr().out
    assert "m[/] b1" in out and "failed [/] here" in out


@pytest.mark.slow
def test_plots_draw_dollar_names_literally(cli, tmp_path):
    """A model named like mathtext: `lmprof plots` draws every plot, the texts keep parse_math off."""
    import lmprof.show.sweep_plots as sp
    from lmprof.sweep.spec import parse_spec
    from sweep_fakes import SPEC

    spec = parse_spec({**SPEC, "models": [{"name": "x$\\frac{$y", "n_layer": 1, "n_head": 2, "n_embd": 16},
                                          {"name": "cost $5 vs $10", "n_layer": 1, "n_head": 2, "n_embd": 32}],
                       "seq_lens": [32], "modes": ["train"]})
    folder = tmp_path / "sw"
    with Store(folder / DB_NAME) as store:
        store.plan(spec.expand().points, spec.model_dump_json())
        for p in spec.expand().points:
            store.mark_running(p.id, f"runs/{p.id}", "2026-01-01T00:00:00+00:00")
            store.finish(p.id, "ok", None, "2026-01-01T00:00:01+00:00", 1.0,
                         _run(p.id, p.mode, p.model, p.batch_size, p.seq_len))
    code, out, err = cli("plots", folder)
    assert code == 0, err
    assert list((folder / "plots").glob("*.png"))
    for fn in (sp.make_plots,):
        assert hasattr(fn, "__wrapped__")


def test_literal_text_turns_mathtext_off_only_inside():
    import matplotlib
    from matplotlib.figure import Figure

    from lmprof.show.literal import literal_text
    from lmprof.show.memory_plot import plot_memory_timeline
    from lmprof.show.roofline_plot import plot_roofline
    from lmprof.show.run_report import block_chart_png

    @literal_text
    def draw() -> tuple[bool, bytes]:
        fig = Figure()
        text = fig.text(0.1, 0.5, "x$\\frac{$y and cost $5 vs $10")
        import io
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return text.get_parse_math(), buf.getvalue()

    parse_math, png = draw()
    assert parse_math is False and png.startswith(b"\x89PNG")
    assert matplotlib.rcParams["text.parse_math"] is True  # the caller's setting is left as it was
    for fn in (plot_memory_timeline, plot_roofline, block_chart_png):
        assert hasattr(fn, "__wrapped__"), fn


# == 6. disk full, read-only places ===================================================================

def test_atomic_write_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "report.html"
    target.write_text("the old report")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("lmprof.atomic.os.fsync", full)
    with pytest.raises(WriteError) as info:
        write_bytes(target, b"<html>new</html>")
    assert str(info.value).startswith(f"cannot write {target}: no space left on device")
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert target.read_text() == "the old report"
    assert not no_tmp_files(tmp_path) and [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_cli_write_on_a_full_disk_is_one_line(cli, tmp_path, monkeypatch):
    sweep = fake_sweep(tmp_path / "sw")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("lmprof.atomic.os.fsync", full)
    code, _, err = cli("results", sweep, "--csv", tmp_path / "all.csv")
    one_line_error(code, err, str(tmp_path / "all.csv"), "no space left on device")
    assert not (tmp_path / "all.csv").exists() and not no_tmp_files(tmp_path)


def test_read_only_place_is_one_line(tmp_path):
    def refuse(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    with pytest.raises(WriteError, match="read-only file system"):
        with atomic_path(tmp_path / "x.json") as tmp:
            refuse(tmp)


def test_profiled_window_trace_export_is_atomic(tmp_path, monkeypatch):
    """A full disk while the trace is exported: no truncated trace.json.gz, no temporary file."""
    from torch.profiler import profile

    from lmprof.measure.window import ProfilerWindow

    def half_then_full(self, path):
        Path(path).write_bytes(b"\x1f\x8b truncated")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(profile, "export_chrome_trace", half_then_full)
    window = ProfilerWindow(torch.device("cpu"), tmp_path / "trace.json.gz")
    window.start()
    window.open_step()
    torch.ones(4) @ torch.ones(4)
    window.close_step()
    window.stop()
    with pytest.raises(WriteError, match="trace.json: no space left"):
        window.export()
    assert list(tmp_path.iterdir()) == []


def test_store_on_a_full_disk_is_one_line_and_keeps_earlier_points(tmp_path):
    sweep = fake_sweep(tmp_path / "sw")
    store = Store(sweep / DB_NAME)
    before = dict(store.statuses())
    real = store.conn

    class Full:
        def __getattr__(self, name):
            return getattr(real, name)

        def __enter__(self):
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

        def execute(self, sql, *args):
            if sql.startswith("UPDATE"):
                raise sqlite3.OperationalError("database or disk is full")
            return real.execute(sql, *args)

    store.conn = Full()  # type: ignore[assignment]
    pid = next(iter(before))
    with pytest.raises(DataError, match="disk is full.*--resume"):
        store.finish(pid, "ok", None, "2026-01-01T00:00:02+00:00", 1.0)
    store.conn = real
    assert store.statuses() == before
    store.close()


def test_tiny_tmpfs_fills_up_in_one_line(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or done.returncode})")
    try:
        with pytest.raises(WriteError, match="no space left on device"):
            write_bytes(mnt / "trace.json.gz", b"x" * (1 << 20))
        assert list(mnt.iterdir()) == []  # no truncated file, no temporary file
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


# == 7. paths that pass a naive check and fail after measuring ========================================

def test_symlink_loop_out_says_so(cli, tmp_path, no_measuring):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    code, _, err = cli("train", "--out", tmp_path / "a")
    one_line_error(code, err, "symlink loop")
    code, _, err = cli("train", "--out", tmp_path / "a" / "sub")
    one_line_error(code, err, "symbolic links")


def test_non_utf8_out_is_refused_up_front(cli, tmp_path, no_measuring):
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/runs\xff")
    code, _, err = cli("train", "--out", out)
    one_line_error(code, err, "not UTF-8", "runs\\xff")
    code, _, err = cli("infer", "--out", out)
    one_line_error(code, err, "not UTF-8")


def test_overlong_name_is_refused_with_the_limit(cli, tmp_path, no_measuring):
    code, _, err = cli("train", "--out", tmp_path / ("n" * 300))
    one_line_error(code, err, "300 bytes", "255")
    code, _, err = cli("train", "--out", tmp_path / "/".join(["d" * 200] * 25))
    one_line_error(code, err, "path limit")


def test_claiming_a_run_folder_in_a_read_only_place_is_one_line(tmp_path, monkeypatch):
    from lmprof.pipeline.protocol.folder import run_folder

    def refuse(path, *a):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr("lmprof.pipeline.protocol.folder.os.mkdir", refuse)
    with pytest.raises(WriteError, match="permission denied"):
        run_folder(tmp_path, "train", "tiny", _cpu(), batch=1)


# == 8. Ctrl-C and SIGTERM ============================================================================

def test_interrupted_run_keeps_what_was_measured_marked_incomplete(tmp_path):
    from lmprof.pipeline.protocol.folder import INCOMPLETE, RunInterrupted, incomplete_until_saved

    folder = tmp_path / "run"
    folder.mkdir()
    with pytest.raises(RunInterrupted) as info:
        with incomplete_until_saved(folder):
            (folder / "trace.json.gz").write_bytes(b"measured")
            raise KeyboardInterrupt
    assert info.value.folder == folder and info.value.kept == ["trace.json.gz"]
    assert (folder / INCOMPLETE).is_file()

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RunInterrupted) as info:
        with incomplete_until_saved(empty):
            raise KeyboardInterrupt
    assert info.value.folder is None and not empty.exists()  # nothing measured: nothing left behind

    done = tmp_path / "done"
    done.mkdir()
    with incomplete_until_saved(done):
        (done / "run.json").write_text("{}")
    assert sorted(p.name for p in done.iterdir()) == ["run.json"]


def test_sigterm_inside_interruptible_is_143_and_ctrl_c_130():
    from lmprof.cli.common import Interrupted, interruptible

    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or what a test before installed (ray.init installs one)
    with pytest.raises(Interrupted) as info:
        with interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert info.value.code == 143 and "SIGTERM" in str(info.value)
    assert signal.getsignal(signal.SIGTERM) == before
    from lmprof.pipeline.protocol.folder import RunInterrupted

    with pytest.raises(Interrupted) as info:
        with interruptible():
            raise RunInterrupted(None, [])
    assert info.value.code == 130 and "nothing kept" in str(info.value)
    with pytest.raises(Interrupted) as info:
        with interruptible():
            raise KeyboardInterrupt
    assert info.value.code == 130 and "did not finish" in str(info.value)


def test_train_interrupted_prints_one_line_and_exits_130(cli, monkeypatch, tmp_path):
    import lmprof.pipeline.train as train
    from lmprof.pipeline.protocol.folder import RunInterrupted

    def interrupted(cfg, out_dir=None):
        raise RunInterrupted(tmp_path / "runs" / "x", ["trace.json.gz"])

    monkeypatch.setattr(train, "run_training", interrupted)
    code, _, err = cli("train", "--out", tmp_path / "runs")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 130 and len(lines) == 1, err
    assert lines[0].startswith("lmprof: interrupted: kept ") and "INCOMPLETE" in lines[0], lines[0]


def _start_train(tmp_path: Path, steps: int) -> subprocess.Popen[bytes]:
    cfg = _cli_train_config(tmp_path)
    return subprocess.Popen([sys.executable, "-m", "lmprof", "train", *TINY, "-b", "1", "--steps", str(steps),
                             "--force", "-c", str(cfg), "--out", str(tmp_path / "runs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, preexec_fn=sigint_default)


def _wait_for(pred, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() < end, "timed out waiting for the run"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_a_real_run(tmp_path, sig, code):
    proc = _start_train(tmp_path, steps=100000)
    runs = tmp_path / "runs"
    _wait_for(lambda: runs.is_dir() and any((p / "INCOMPLETE").exists() for p in runs.iterdir()), proc)
    time.sleep(0.5)  # inside the timed window
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    # Progress lines (a run past its first seconds says how far it has come) are not the message.
    lines = [ln for ln in err.decode().splitlines() if ln.strip() and not ln.startswith("lmprof: profiling ")]
    assert proc.returncode == code, err.decode()[-2000:]
    assert len(lines) == 1 and lines[0].startswith("lmprof: "), lines
    assert "Traceback" not in err.decode()
    assert not no_tmp_files(tmp_path)
    left = list(runs.iterdir())
    for folder in left:  # a folder kept is marked; one with nothing measured is gone
        assert (folder / "INCOMPLETE").is_file() and not (folder / "run.json").exists()
    if left:
        assert f"kept {left[0]}" in lines[0], lines[0]
    else:
        assert "nothing kept" in lines[0], lines[0]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device whose every write fails: ENOSPC)")
@pytest.mark.parametrize("args", [["analyze", "TRACE", "--json"], ["analyze", "TRACE"], ["--help"]],
                         ids=["analyze-json-fast-path", "analyze-table-typer", "help"])
def test_standard_output_on_a_full_disk_is_one_line(args):
    """`lmprof ... > file` on a full disk: one line on stderr and exit 2, not a traceback (nor the
    interpreter's own report when its last flush fails too)."""
    trace = str(Path(__file__).parent / "data" / "traces" / "cpu_only_tiny.json.gz")
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "lmprof", *[trace if a == "TRACE" else a for a in args]],
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == ["lmprof: error: cannot write to standard output: No space left on device"]


def test_ctrl_c_in_a_verb_that_keeps_nothing_says_interrupted(cli, monkeypatch, tmp_path):
    """A Ctrl-C while `lmprof memory` / `roofline --model` read a model off meta (two minutes for a full-size
    Jamba): typer, out of standalone mode, turned it into exit 130 and said nothing; now one line."""
    import lmprof.measure.model_facts.resolve as resolve

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(resolve, "describe_entry", ctrl_c)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "jamba", "num_hidden_layers": 2}))
    code, out, err = cli("memory", "--model", config, "--device", "h100")
    assert code == 130 and [ln for ln in err.splitlines() if ln.strip()] == [
        "lmprof: interrupted: reading the model off the meta device did not finish"], err
    code, out, err = cli("roofline", "--model", config, "--device", "h100")
    assert code == 130 and [ln for ln in err.splitlines() if ln.strip()] == [
        "lmprof: interrupted: reading the model off the meta device did not finish"], err


@pytest.mark.skipif(signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
                    reason="the test process has its own SIGINT handler")
@pytest.mark.parametrize("json_out", [False, True])
def test_ctrl_c_in_any_other_verb_is_one_line_and_130(cli, monkeypatch, tmp_path, json_out):
    """A real SIGINT while `lmprof analyze` reads a trace, through typer and through its fast path
    (--json): both said nothing and exited 130, where docs/reliability.md promises one line."""
    import lmprof.cli._analyze_run as analyze_run
    import lmprof.cli.analyze as analyze

    def ctrl_c(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the signal arrives before this ends

    monkeypatch.setattr(analyze_run, "run_analyze", ctrl_c)
    monkeypatch.setattr(analyze, "run_analyze", ctrl_c)
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    code, out, err = cli("analyze", trace, *(["--json"] if json_out else []))
    assert code == 130 and [ln for ln in err.splitlines() if ln.strip()] == ["lmprof: interrupted"], err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
