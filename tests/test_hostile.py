"""Hostile input, replayed (issue 14): every class of attack ends in exit 2 and one line, nothing finished
is lost, nothing from a record executes in a report.

Each test crafts its input here. The CLI runs in-process (the ``cli`` fixture) except where the exit
code of a real process is the thing under test. Measurement entry points are replaced by a function
that fails the test, so "refused before measuring" is checked, not assumed.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lmprof.errors import ConfigError, DataError
from lmprof.record.store import DB_NAME, Store
from sweep_fakes import _run, fake_sweep

SRC = Path(__file__).resolve().parents[1] / "src"


from conftest import one_line_error  # noqa: E402  (the no_measuring fixture is in conftest too)


def saved_run(folder: Path, **changes) -> Path:
    run = _run("r1", "train", "tiny", 2, 32)
    for k, v in changes.items():
        setattr(run, k, v)
    run.save(folder)
    return folder


# == 1. script injection ============================================================================

HOSTILE_NAMES = ["javascript:alert(1)", "JaVaScRiPt:alert(1)", "data:text/html,<script>alert(1)</script>",
                 "https://evil.example/x", "/etc/passwd", "../../outside.json.gz", "//evil.example/x",
                 "~/x", 'x"><script>alert(1)</script>']


def assert_inert(html: str, scripts: int = 0) -> list[str]:
    """No element or attribute a browser would run: at most ``scripts`` <script> tags (lmprof's own), no
    on* handlers, every href/src a section anchor, an embedded PNG or a relative path without a scheme.
    Returns the links."""
    from html.parser import HTMLParser

    found: dict[str, list] = {"script": [], "links": [], "handlers": []}

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag in ("script", "iframe", "object", "embed", "base", "meta") and tag != "meta":
                found["script"].append(tag)
            for k, v in attrs:
                if k.startswith("on"):
                    found["handlers"].append(k)
                if k in ("href", "src", "action", "formaction"):
                    found["links"].append(v or "")

    Parser().feed(html)
    assert len(found["script"]) <= scripts, found["script"]
    assert not found["handlers"], found["handlers"]
    for link in found["links"]:
        ok = link.startswith(("#", "data:image/png;base64,")) or not (
            re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", link) or link.startswith(("/", "\\")))
        assert ok, link
    return found["links"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_report_never_links_outside_the_run_folder(tmp_path, cli, name):
    folder = saved_run(tmp_path / "run", files={"trace": name, "roofline": name + ".png"})
    code, out, err = cli("report", folder)
    assert code == 0, err
    links = assert_inert((folder / "report.html").read_text())
    assert name not in links and not any(h.lower().startswith("javascript") for h in links), links


def test_a_real_trace_inside_the_run_is_linked_relatively(tmp_path, cli):
    folder = saved_run(tmp_path / "run", files={"trace": "trace.json.gz"})
    (folder / "trace.json.gz").write_bytes(b"\x1f\x8b")
    out = tmp_path / "elsewhere" / "r.html"
    code, _, err = cli("report", folder, "--out", out)
    assert code == 0, err
    assert 'href="../run/trace.json.gz"' in out.read_text()


def test_a_symlink_out_of_the_run_is_not_followed(tmp_path, cli):
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG secret")
    folder = saved_run(tmp_path / "run", files={"roofline": "plot.png"})
    (folder / "plot.png").symlink_to(secret)
    cli("report", folder)
    import base64

    assert base64.b64encode(b"\x89PNG secret").decode() not in (folder / "report.html").read_text()


def test_sweep_report_links_only_run_folders_inside_the_sweep(tmp_path, cli):
    sweep = fake_sweep(tmp_path / "sw")
    conn = sqlite3.connect(sweep / DB_NAME)
    with conn:
        conn.execute("UPDATE points SET run_dir = 'javascript:alert(1)' WHERE rowid = 1")
        conn.execute("UPDATE points SET run_dir = '/etc' WHERE rowid = 2")
        conn.execute("UPDATE points SET run_dir = '../../x' WHERE rowid = 3")
    conn.close()
    code, _, err = cli("report", sweep)
    assert code == 0, err
    links = assert_inert((sweep / "report.html").read_text(), scripts=1)
    assert not any(".." in h or h.startswith("/") for h in links), links


# == 2. finished measurements are never thrown away ===============================================

@pytest.mark.parametrize("content", [b'{"schema": "lmprof.calibration/1", "device": "cpu", "matm', b"[]",
                                     b'{"schema": "lmprof.calibration/1", "device": 5}', b"\xff\xfe",
                                     json.dumps({"schema": "lmprof.calibration/1", "device": "cpu",
                                                 "device_name": "x", "hostname": "h", "created": "c",
                                                 "torch": "t", "threads": 1, "seconds": 1.0,
                                                 "matmul": {"fp32": {"flops_per_s": "fast"}}}).encode()])
def test_a_corrupt_calibration_cache_is_ignored_with_a_note(tmp_path, content):
    from lmprof.hardware import calibrate as cal

    path = cal.cache_path("Weird CPU", "cpu", tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    peak = cal.resolve_peak("Weird CPU", "cpu", "fp32", directory=tmp_path)
    assert peak.flops_per_s is None
    assert "ignored the calibration cache" in peak.note


@pytest.mark.parametrize("where", ["file", "/proc/lmprof-x", "under-file"])
def test_a_bad_out_is_refused_before_measuring(tmp_path, cli, no_measuring, where):
    f = tmp_path / "a-file"
    f.write_text("x")
    out = {"file": f, "under-file": f / "sub", "/proc/lmprof-x": Path("/proc/lmprof-x")}[where]
    for verb in ("train", "infer"):
        code, _, err = cli(verb, "--out", out, "--no-report")
        one_line_error(code, err, "--out")


def test_an_unwritable_out_is_refused(tmp_path, monkeypatch):
    import lmprof.outdir as od

    monkeypatch.setattr(od, "_cannot_write", lambda folder: "permission denied")
    with pytest.raises(ConfigError, match="not writable"):
        od.check_output_dir(tmp_path)


def test_every_write_goes_through_atomic():
    """No module writes a file by itself: write_text/write_bytes/open-for-write/savefig/to_csv/gzip.open
    appear only in lmprof/atomic.py or on an atomic temporary path."""
    pattern = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*['\"][wax]b?['\"]|\.savefig\(|\.to_csv\(|"
                         r"\.to_parquet\(|gzip\.open\([^)]*['\"]w|json\.dump\(|\.open\(['\"]w")
    offenders = []
    for path in (SRC / "lmprof").rglob("*.py"):
        if path.name == "atomic.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and "tmp" not in line and "buf" not in line and "worker.log" not in line:
                offenders.append(f"{path.relative_to(SRC)}:{i}: {line.strip()}")
    # The worker's log is a stream, not a record; it is opened once for the child process.
    offenders = [o for o in offenders if "log.open" not in o]
    assert not offenders, "\n".join(offenders)


# == 3. one writer per sweep store ================================================================

def test_a_second_sweep_on_the_same_folder_is_refused(tmp_path, cli):
    from lmprof.sweep.lock import sweep_lock

    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\nbatch_sizes: [1]\ndevices: [cpu]\n")
    with sweep_lock(tmp_path / "out"):
        code, _, err = cli("sweep", spec, "--out", tmp_path / "out", "--resume")
    one_line_error(code, err, "another lmprof sweep", f"pid {os.getpid()}")


def test_the_lock_dies_with_its_process(tmp_path):
    from lmprof.sweep.lock import sweep_lock

    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from lmprof.sweep.lock import sweep_lock
            with sweep_lock({str(tmp_path)!r}):
                print("held", flush=True)
                time.sleep(60)
        """)], stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert holder.stdout.readline().strip() == b"held"
    with pytest.raises(ConfigError, match="another lmprof sweep"):
        with sweep_lock(tmp_path):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    with sweep_lock(tmp_path):  # no stale lock after kill -9
        pass


def test_the_runner_never_empties_a_folder_a_worker_still_holds(tmp_path):
    from lmprof.sweep.lock import hold_point_lock, wait_point_free

    run_dir = tmp_path / "runs" / "abc"
    child = subprocess.Popen(
        [sys.executable, "-c", f"from lmprof.sweep.lock import hold_point_lock; from pathlib import Path; "
                               f"hold_point_lock(Path({str(run_dir)!r})); print('held', flush=True); "
                               f"import time; time.sleep(60)"],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert child.stdout.readline().strip() == b"held"
    assert not wait_point_free(run_dir, timeout_s=0.3)
    child.kill()
    child.wait(10)
    assert wait_point_free(run_dir, timeout_s=5)
    assert hold_point_lock is not None


# == 4. bounded specs =============================================================================

BOMB = textwrap.dedent("""\
    models: [tiny]
    devices: [cpu]
    exclude:
      - device: &a [x, x, x, x, x, x, x, x, x, x]
      - device: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
      - device: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
      - device: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
      - device: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
      - device: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
      - device: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
      - device: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
      - device: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
    """)


@pytest.mark.parametrize("text, needles", [
    (BOMB, ("expands to", "LMPROF_YAML_MAX_NODES")),
    ("models: [tiny]\nrepeats: 1000000000\n", ("max_points", "1,000,000,000 points")),
    ("batch_sizes: " + str(list(range(1, 1001))) + "\nseq_lens: " + str(list(range(1, 1001))) + "\n",
     ("max_points", "1,000,000 points")),
    ("exclude: &r [*r]\n", ("recursive",)),
    ("models: " + "[" * 5000 + "]" * 5000 + "\n", ("nested too deeply",)),
    ("steps: true\n", ("steps", "true")),
    ("timeout_s: .nan\n", ("timeout_s",)),
    ("seed: 1180591620717411303424\n", ("seed",)),
])
def test_unbounded_specs_fail_fast_in_one_line(tmp_path, cli, text, needles):
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    t0 = time.monotonic()
    code, out, err = cli("sweep", spec, "--out", tmp_path / "o", "--dry-run")
    assert time.monotonic() - t0 < 20
    line = one_line_error(code, err, *needles)
    assert len(line) < 600  # never a huge repr
    assert not (tmp_path / "o").exists()


def test_the_grid_bound_can_be_raised_in_the_spec(tmp_path, cli):
    spec = tmp_path / "s.yaml"
    spec.write_text("devices: [cpu]\nbatch_sizes: [1, 2, 3]\nmax_points: 2\n")
    one_line_error(*cli("sweep", spec, "--dry-run")[::2], "max_points: 3")
    spec.write_text("devices: [cpu]\nbatch_sizes: [1, 2, 3]\nmax_points: 3\n")
    assert cli("sweep", spec, "--dry-run")[0] == 0


def test_unused_rule_note_is_short(tmp_path, cli):
    spec = tmp_path / "s.yaml"
    spec.write_text("devices: [cpu]\nexclude:\n  - {device: " + str(["cuda"] * 5000) + "}\n")
    code, out, err = cli("sweep", spec, "--dry-run")
    assert code == 0, err
    assert max(len(ln) for ln in out.splitlines()) < 400


# == 6. corrupt results store =====================================================================

def _corrupt(kind: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / DB_NAME
    if kind == "random":
        db.write_bytes(os.urandom(8192))
    elif kind == "truncated":
        fake_sweep(folder)
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 3])
        for side in ("-wal", "-shm"):
            Path(str(db) + side).unlink(missing_ok=True)
    elif kind == "directory":
        db.mkdir()
    elif kind == "foreign":
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()


@pytest.mark.parametrize("kind", ["random", "truncated", "directory", "foreign"])
def test_a_corrupt_store_is_one_line(tmp_path, cli, kind):
    folder = tmp_path / "sw"
    _corrupt(kind, folder)
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\nbatch_sizes: [1]\ndevices: [cpu]\n")
    for args in (("sweep", spec, "--out", folder), ("sweep", spec, "--out", folder, "--resume"),
                 ("report", folder), ("results", folder)):
        code, _, err = cli(*args)
        one_line_error(code, err, str(folder))


# == 7. run records that are not records ==========================================================

def _record(tmp_path: Path, data: object) -> Path:
    folder = tmp_path / f"r{abs(hash(json.dumps(data, default=str))) % 10**8}"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("data, field", [
    ([], "array"), (None, "null"), (5, "number"), ("x", "string"),
    ("tables", "tables"), ("metrics", "metrics"), ("blocks", "blocks"), ("files", "files"),
])
def test_bad_records_name_the_problem(tmp_path, cli, data, field):
    if isinstance(data, str) and data != "x":
        good = saved_run(tmp_path / "good")
        record = json.loads((good / "run.json").read_text())
        record[data] = "not the right type"
        data = record
    bad = _record(tmp_path, data)
    good = saved_run(tmp_path / "good2")
    for args in (("report", bad), ("compare", good, bad)):
        code, _, err = cli(*args)
        one_line_error(code, err, field)


def test_an_unreadable_record_is_one_line(tmp_path, cli, monkeypatch):
    folder = saved_run(tmp_path / "run")
    real = Path.read_bytes

    def denied(self):
        if self.name == "run.json":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    one_line_error(*cli("report", folder)[::2], "permission denied")


# == 8. out of memory =============================================================================

CPU_OOM = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to "
           "allocate 327680000000 bytes. Error code 12 (Cannot allocate memory)")


def test_cpu_oom_is_one_line_with_what_fits(cli, monkeypatch):
    import lmprof.pipeline.train as train

    def oom(*a, **k):
        raise RuntimeError(CPU_OOM)

    monkeypatch.setattr(train, "run_training", oom)
    code, _, err = cli("train", "-b", "100000", "--device", "cpu", "--no-report")
    one_line_error(code, err, "out of memory training tiny at batch 100000", "305.2 GiB", "--batch-size")


def test_calibrate_oom_says_which_sizes_fit(cli, monkeypatch):
    import lmprof.hardware.calibrate as cal

    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError(CPU_OOM)))
    code, _, err = cli("calibrate", "--sizes", "60000", "--no-save")
    one_line_error(code, err, "out of memory calibrating", "--sizes")


def test_a_sweep_records_cpu_oom_as_oom():
    from lmprof.sweep.runner import classify
    from lmprof.errors import is_oom

    assert is_oom(RuntimeError(CPU_OOM))
    assert classify(1, ["Traceback ...", f"RuntimeError: {CPU_OOM}", "lmprof.sweep: RuntimeError: x"], False)[0] == "oom"


# == 9. I/O and parse errors ======================================================================

def test_invalid_utf8_config_spec_and_peaks(tmp_path, cli, no_measuring, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"steps: 3\nname: \xff\xfe\n")
    one_line_error(*cli("train", "-c", bad)[::2], "not UTF-8")
    one_line_error(*cli("sweep", bad, "--dry-run")[::2], "not UTF-8")
    monkeypatch.setenv("LMPROF_PEAKS", str(bad))
    one_line_error(*cli("roofline", "--device", "h100", "--out", tmp_path / "r.png")[::2], "not UTF-8")


def test_outputs_that_are_folders_or_files(tmp_path, cli):
    run = saved_run(tmp_path / "run")
    (tmp_path / "d").mkdir()
    one_line_error(*cli("report", run, "--out", tmp_path / "d")[::2], "is a folder")
    one_line_error(*cli("roofline", "--device", "h100", "--out", tmp_path / "d")[::2], "is a folder")
    f = tmp_path / "f"
    f.write_text("x")
    spec = tmp_path / "s.yaml"
    spec.write_text("models: [tiny]\nbatch_sizes: [1]\ndevices: [cpu]\n")
    one_line_error(*cli("sweep", spec, "--out", f)[::2], "is a file")


@pytest.fixture
def hf_bad(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50, n_positions=32, bos_token_id=0,
                            eos_token_id=0).save_pretrained(folder)
    marker = tmp_path / "PWNED"

    class Payload:  # what an attacker ships as weights: unpickling it runs a shell command
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps({"weight": Payload()})
    (folder / "pytorch_model.bin").write_bytes(payload)
    truncated = tmp_path / "config.json"
    truncated.write_text('{"model_type": "gpt2", "n_la')
    return folder, truncated, marker


def test_hf_folders_that_attack(cli, hf_bad):
    folder, truncated, marker = hf_bad
    code, _, err = cli("infer", "--hf", str(folder), "--no-report", "--device", "cpu")
    one_line_error(code, err, "nothing was executed")
    assert not marker.exists()
    code, _, err = cli("infer", "--hf-config", str(truncated), "--no-report", "--device", "cpu")
    one_line_error(code, err, "config.json", "not a valid JSON")


# == 10. numbers ==================================================================================

@pytest.mark.parametrize("args, needle", [
    (("--seed", str(2**70)), "seed"),
    (("--tdp-w", "nan", "--energy", "estimate"), "tdp_w"),
    (("--tdp-w", "inf", "--energy", "estimate"), "tdp_w"),
    (("--nproc", "0"), "nproc"),
    (("--nproc", "-1"), "nproc"),
    (("-b", str(10**30)), "batch_size"),
])
def test_numbers_out_of_range_are_refused(cli, no_measuring, args, needle):
    one_line_error(*cli("train", "--no-report", *args)[::2], needle)


@pytest.mark.parametrize("args, needle", [
    (("--prompt-len", str(10**30)), "prompt_len"),
    (("--new-tokens", str(10**30)), "new_tokens"),
    (("-b", str(10**30)), "batch_size"),
    (("--seed", "-1"), "seed"),
])
def test_infer_numbers_out_of_range_are_refused(cli, no_measuring, args, needle):
    one_line_error(*cli("infer", "--no-report", *args)[::2], needle)


def test_bool_where_a_number_is_meant(tmp_path, cli, no_measuring):
    c = tmp_path / "c.yaml"
    c.write_text("steps: true\n")
    one_line_error(*cli("train", "-c", c)[::2], "steps", "expected a number")


@pytest.mark.parametrize("args, needle", [
    (("memory", "--memory-gb", "inf"), "memory-gb"),
    (("memory", "--memory-gb", "nan"), "memory-gb"),
    (("memory", "-b", str(10**30), "--json"), "batch-size"),
    (("calibrate", "--seconds", "nan", "--no-save"), "seconds"),
    (("memory", "--n-layer", str(10**30)), "n-layer"),
    (("roofline", "--device", "h100", "-b", str(10**30)), "batch-size"),
])
def test_other_verbs_numbers(cli, args, needle):
    one_line_error(*cli(*args)[::2], needle)


def test_a_run_that_would_take_ages_asks_for_force():
    from lmprof.pipeline.budget import check_duration

    calls = []
    check_duration(lambda: calls.append(1), 10**3, lambda: None, force=False)  # short runs are not timed
    assert calls == []
    with pytest.raises(ConfigError, match=r"would take about .* --force"):
        check_duration(lambda: time.sleep(0.002), 10**12, lambda: None, force=False)
    check_duration(lambda: None, 10**12, lambda: None, force=True)


def test_steps_1e12_on_the_cli(cli):
    code, _, err = cli("train", "--steps", str(10**12), "--no-report", "--device", "cpu", "-b", "1", "-t", "8",
                       "--out", "/tmp/lmprof-never-written")
    one_line_error(code, err, "would take about", "--force")


# == 11. messages =================================================================================

def test_data_that_is_not_a_file_says_what_it_is(tmp_path, cli, no_measuring):
    one_line_error(*cli("train", "--data", "/dev/null")[::2], "character device")
    one_line_error(*cli("train", "--data", tmp_path)[::2], "a directory")
    one_line_error(*cli("train", "--data", tmp_path / "missing.txt")[::2], "not found")


def test_a_read_only_store_says_read_only(tmp_path, monkeypatch):
    import lmprof.record.store as store_mod

    fake_sweep(tmp_path)
    real = sqlite3.connect

    def read_only(path, **kw):  # root ignores permission bits: open it read-only the way SQLite sees it
        return real(f"file:{path}?mode=ro", uri=True, **kw)

    monkeypatch.setattr(store_mod.sqlite3, "connect", read_only)
    with pytest.raises(DataError, match="read-only"):
        Store(tmp_path / DB_NAME)


def test_interrupted_points_keep_their_attempts(tmp_path):
    from lmprof.sweep.spec import parse_spec

    spec = parse_spec({"models": ["tiny"], "batch_sizes": [1, 2], "devices": ["cpu"]})
    points = spec.expand().points
    with Store(tmp_path / DB_NAME) as store:
        store.plan(points, "{}")
        store.mark_running(points[0].id, "runs/x", "t")
        store.mark_pending(points[0].id, "interrupted")
        store.plan(points, "{}")  # what --resume does
        attempts = dict(store.conn.execute("SELECT id, attempts FROM points").fetchall())
    assert attempts[points[0].id] == 1 and attempts[points[1].id] == 0


def test_atomic_files_get_the_usual_permissions(tmp_path):
    """A file written atomically is readable like any other new file (mkstemp alone makes it 0600)."""
    import os

    from lmprof.atomic import write_text

    mask = os.umask(0o022)
    try:
        path = write_text(tmp_path / "x.json", "{}")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644
