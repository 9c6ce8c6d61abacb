"""``make demo`` on a busy machine: a calibration refused (exit 2, its own line says why) must not stop
the demo (found by running it right after the test suite: "calibration refused ... the machine was
disturbed", and make stopped before the training run)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_refused_calibration_does_not_stop_the_demo(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.txt"
    fake = venv / "bin" / "lmprof"
    # A stand-in lmprof: the calibration is refused as on a busy machine, the training run succeeds.
    fake.write_text(f'#!/bin/sh\necho "$1" >> {log}\n[ "$1" = calibrate ] && exit 2\nexit 0\n')
    fake.chmod(0o755)
    proc = subprocess.run(["make", "-o", "setup-run", "demo", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert log.read_text().split() == ["calibrate", "train"]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_checkout_whose_path_holds_a_dollar_is_refused_in_one_line_before_anything_is_installed(
        tmp_path: Path) -> None:
    """setuptools reads '$x' in the install prefix as a variable: in a checkout under 'a $x [y]', the C
    reader's build failed with a distutils traceback after the whole set-up. make now says so first,
    and makes no venv."""
    checkout = tmp_path / "a $x [y]" / "lmprof"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "requirements").mkdir()
    for f in ("Makefile", "scripts/venv_path_ok.py", "requirements/uv.lock"):
        shutil.copy(ROOT / f, checkout / f)
    proc = subprocess.run(["make", "setup"], cwd=checkout, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    venv = checkout / ".venv"
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("make: lmprof")]
    assert lines == [f"make: lmprof cannot be installed into {venv}: setuptools reads the '$' in that path as a "
                     "variable; put the venv elsewhere, e.g. make VENV=/tmp/lmprof-venv test"], proc.stderr
    assert "Traceback" not in proc.stderr and not venv.exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_venv_path_with_a_space_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """make splits target names at spaces: VENV='... a b/venv' became several targets, and a stray
    venv was made under the checkout. Refused at once now, in make's own one line."""
    venv = tmp_path / "a b" / "venv"
    proc = subprocess.run(["make", "setup", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"VENV must be one path without spaces (make cannot name targets with them), not '{venv}'" in proc.stderr
    assert not (tmp_path / "a b").exists() and not (ROOT / "b").exists()
