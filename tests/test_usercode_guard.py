"""lmprof never raises into the user's code: bad --out fails before the script starts (exit 2, one
line); a failure inside a hook or at the end is one line and the script's output and exit code stay
its own; names from the user's code stay inside the output folder and print as text.

The truth for each: the script's own stdout, its exit code, and a marker file it writes when it runs."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from lmprof.cli.main import main
from lmprof.record.run import Run
from tiny_loops import sgd_steps
from tests.test_usercode import write

SCRIPT = """
import sys, torch
from torch import nn
open(sys.argv[1], "w").write("ran")
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("a$b", nn.Linear(8, 8))
        self.add_module("c[/]d", nn.Linear(8, 8))
    def forward(self, x):
        return getattr(self, "c[/]d")(getattr(self, "a$b")(x))
Net.__name__ = Net.__qualname__ = sys.argv[3] if len(sys.argv) > 3 else "Net"
m = Net(); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(int(sys.argv[2])):
    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
print("script done")
sys.exit(4)
"""

FAST = ["--steps", "2", "--warmup", "1", "--profile-steps", "1", "--no-report"]


def _bad_outs(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "afile").write_text("x")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    return {"file": str(tmp_path / "afile"), "under a file": str(tmp_path / "afile" / "runs"),
            "symlink loop": str(tmp_path / "loop" / "runs"), "not utf-8": os.fsdecode(str(tmp_path).encode() + b"/r\xff"),
            "pseudo filesystem": "/proc/lmprof-runs"}


@pytest.mark.parametrize("kind", ["file", "under a file", "symlink loop", "not utf-8", "pseudo filesystem"])
def test_bad_out_fails_before_the_script_starts(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(tmp_path, "t.py", SCRIPT)
    marker = tmp_path / "marker"
    code = main(["run", "--out", _bad_outs(tmp_path)[kind], *FAST, str(script), str(marker), "6"])
    err = capsys.readouterr().err
    assert code == 2 and not marker.exists()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("kind", ["file", "symlink loop", "not utf-8"])
def test_bad_out_for_profile(tmp_path: Path, kind: str) -> None:
    import torch

    import lmprof
    from lmprof.errors import ConfigError

    with pytest.raises(ConfigError):
        lmprof.profile(torch.nn.Linear(2, 2), out=_bad_outs(tmp_path)[kind])


@pytest.mark.parametrize("when", ["mid-script", "at the end"])
def test_disk_full_is_one_line_and_the_script_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], when: str) -> None:
    """Every lmprof write goes through lmprof.atomic, which fsyncs before the rename: a disk that
    fills up fails there. The window completes mid-script (10 steps) or only when the script ends (4)."""
    script = write(tmp_path, "t.py", SCRIPT)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    steps = "10" if when == "mid-script" else "4"
    code = main(["run", "--out", str(tmp_path / "runs"), *FAST, str(script), str(tmp_path / "m"), steps])
    out, err = capsys.readouterr()
    assert code == 4 and out == "script done\n"
    lines = [line for line in err.splitlines() if line.startswith("lmprof:")]
    # A window that completes mid-script is written there (a script killed later keeps it): the disk
    # fills up inside the script, which goes on; else at its end.
    going_on = "; your script continues" if when == "mid-script" else ""
    assert lines == [f"lmprof: could not write the report (disk full){going_on}"], err
    assert "Traceback" not in err
    # Nothing half-written is left behind: atomic writes leave the old state or nothing.
    assert not [p for p in (tmp_path / "runs").rglob("*") if ".tmp" in p.name]


def test_hostile_names_stay_inside_out_and_print_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(tmp_path, "t.py", SCRIPT)
    out = tmp_path / "runs"
    code = main(["run", "--out", str(out), "--steps", "2", "--warmup", "1", "--profile-steps", "1", str(script),
                 str(tmp_path / "m"), "6", "x/y$[b]"])
    captured = capsys.readouterr()
    assert code == 4 and captured.out == "script done\n"
    assert "could not" not in captured.err and "lmprof train — x/y$[b]" in captured.err
    (folder,) = out.iterdir()
    run = Run.load(folder)
    assert {"a$b", "c[/]d"} <= {b.name for b in run.blocks} and (folder / "report.html").is_file()


def test_profile_label_and_class_name_cannot_leave_out(tmp_path: Path) -> None:
    import torch

    import lmprof

    cls = type("evil/../../name", (torch.nn.Linear,), {})
    for label in ("../../x", None):
        model = cls(4, 4)
        out = tmp_path / "a" / "b" / "runs"
        with lmprof.profile(model, out=out, label=label, warmup=0, steps=2, profile_steps=1, report=False,
                            verbose=False) as prof:
            sgd_steps(model, prof)
        assert prof.folder is not None and prof.folder.parent == out
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_dir()) == sorted(["a", "b", "runs", *(p.name for p in out.iterdir())])


def test_relative_out_survives_chdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = write(tmp_path, "t.py", "import os\nos.makedirs('elsewhere', exist_ok=True)\nos.chdir('elsewhere')\n" + SCRIPT)
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--out", "runs", *FAST, str(script), str(tmp_path / "m"), "6"])
    assert code == 4
    assert len([p for p in (tmp_path / "runs").iterdir() if (p / "run.json").is_file()]) == 1
    assert not (tmp_path / "elsewhere" / "runs").exists()


def test_missing_module_and_package_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--out", "runs", "-m", "no_such_module_xyz"]) == 2
    err = capsys.readouterr().err
    assert "no module named 'no_such_module_xyz'" in err and "Traceback" not in err
    pkg = tmp_path / "pkgdir"
    pkg.mkdir()
    (pkg / "helper.py").write_text("VALUE = 41\n")
    (pkg / "__main__.py").write_text("import sys, helper\nprint('main of', sys.argv[1:], helper.VALUE + 1)\n")
    assert main(["run", "--out", "runs", str(pkg), "x"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "main of ['x'] 42\n"
    (tmp_path / "empty").mkdir()
    assert main(["run", "--out", "runs", str(tmp_path / "empty")]) == 2


def test_the_scripts_traceback_is_the_one_python_prints(tmp_path: Path) -> None:
    """An uncaught (chained) exception of the script: the same traceback as `python script.py`
    prints, from the script's first frame, with no frame of lmprof's or runpy's."""
    import subprocess
    import sys

    script = write(tmp_path, "boom.py", """
        def inner():
            raise ValueError("inner")
        try:
            inner()
        except ValueError as exc:
            raise KeyError("outer") from exc
        """)
    plain_run = subprocess.run([sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True,
                               timeout=120)
    under = subprocess.run([sys.executable, "-m", "lmprof", "run", "--no-report", "--out", "runs", script.name],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plain_run.returncode == under.returncode == 1
    # python names the script by its absolute path (its __file__); under lmprof, as typed
    expected = plain_run.stderr.replace(str(script), script.name).splitlines()
    got = under.stderr.splitlines()
    assert got[: len(expected)] == expected, under.stderr
    assert "lmprof" not in "\n".join(got[: len(expected)]) and "runpy" not in under.stderr
