"""docs/examples/perf-gate.yml, run end to end on a tiny script: the workflow a user copies works.

The workflow's own shell steps run in bash exactly as the file writes them, in order, with the env
its `env:` block sets (the user's knobs: the script's steps kept few here). What GitHub provides is
done by the test: the two checkouts (the baseline a fast script, the change the same script with a
20 ms sleep per step, or an identical one), setup-python (nothing), the upload (its path must
exist); `python -m pip install` is recorded, not run (no network). `lmprof` on the PATH is the local
lmprof, served by this test process, which has torch imported already: a fresh process per command
would add seconds of imports to the suite.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmprof.cli.main import main

WORKFLOW = Path(__file__).resolve().parents[1] / "docs" / "examples" / "perf-gate.yml"

SCRIPT = """
import time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(40):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step(); opt.zero_grad()
    time.sleep(SLEEP)
"""

# `lmprof` for the workflow's bash steps: hands its argv and folder to the test process and waits.
LMPROF_SHIM = """#!/bin/bash
req=$(mktemp -d "$LMPROF_TEST_SERVER/req.XXXXXX")
{ printf '%s\\0' "$PWD"; printf '%s\\0' "$@"; } > "$req/argv"
touch "$req/ready"
while [ ! -f "$req/code" ]; do sleep 0.02; done
cat "$req/out"; cat "$req/err" >&2
exit "$(cat "$req/code")"
"""
# `python -m pip ...` is recorded (no network, and never into this venv); anything else is Python.
PYTHON_SHIM = """#!/bin/bash
if [ "$1 $2" = "-m pip" ]; then printf '%s\\n' "$*" >> "$PIP_LOG"; exit 0; fi
exec "{python}" "$@"
"""


class Served:
    """Runs the workflow's steps; serves their `lmprof` calls in this process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.server = root / "server"
        self.server.mkdir()
        shims = root / "shims"
        shims.mkdir()
        for name, text in (("lmprof", LMPROF_SHIM), ("python", PYTHON_SHIM.replace("{python}", sys.executable))):
            (shims / name).write_text(text)
            (shims / name).chmod(0o755)
        self.path = f"{shims}{os.pathsep}{os.environ['PATH']}"
        self.calls: list[list[str]] = []

    def run(self, script: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
        """One `run:` step as GitHub's bash runs it (-e, no profile); returns its exit code and output."""
        path = self.root / "step.sh"
        path.write_text(script)
        log = self.root / "step.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-e", str(path)], cwd=cwd, stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, **env, "PATH": self.path,
                                                                   "LMPROF_TEST_SERVER": str(self.server)})
            deadline = time.monotonic() + 120
            while proc.poll() is None:
                for ready in sorted(self.server.glob("req.*/ready")):
                    self._serve(ready.parent)
                if time.monotonic() > deadline:
                    proc.kill()
                    raise AssertionError(f"step did not finish:\n{script}")
                time.sleep(0.01)
        return proc.returncode, log.read_text()

    def _serve(self, req: Path) -> None:
        (req / "ready").unlink()
        cwd, *argv = [os.fsdecode(a) for a in (req / "argv").read_bytes().split(b"\0")[:-1]]
        self.calls.append(argv)
        here = os.getcwd()
        with open(req / "out", "w") as out, open(req / "err", "w") as err, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            os.chdir(cwd)
            try:
                code = main(argv)
            except SystemExit as exc:  # what the console script would exit with
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                os.chdir(here)
        (req / "code.tmp").write_text(str(code))
        (req / "code.tmp").rename(req / "code")


def run_workflow(tmp_path: Path, head_sleep: float) -> dict[str, Any]:
    flow = yaml.safe_load(WORKFLOW.read_text())
    env = {k: str(v) for k, v in flow["env"].items()}
    # The user's knobs, set as a user of a tiny script would: few steps (the script runs 40).
    env["LMPROF_RUN"] = "--warmup 2 --steps 5 --profile-steps 1"
    repos = {}
    for name, sleep in (("base", 0.0), ("head", head_sleep)):
        repos[name] = tmp_path / f"repo-{name}"
        repos[name].mkdir()
        (repos[name] / env["SCRIPT"]).write_text(SCRIPT.replace("SLEEP", repr(sleep)))
    (repos["head"] / "requirements.txt").write_text("torch\n")
    ws = tmp_path / "workspace"
    ws.mkdir()
    served = Served(tmp_path)
    env.update(GITHUB_STEP_SUMMARY=str(ws / "summary.md"), PIP_LOG=str(tmp_path / "pip.log"))
    (job,) = flow["jobs"].values()
    results, failed = [], False
    for step in job["steps"]:
        if failed and step.get("if") != "always()":
            continue
        uses = step.get("uses", "")
        if uses.startswith("actions/checkout@"):
            ref = (step.get("with") or {}).get("ref")
            if ref is not None:  # the baseline: the pull request's base, else the default branch
                assert "pull_request.base.sha" in ref and "default_branch" in ref
            shutil.copytree(repos["base" if ref else "head"], ws / step["with"]["path"])
        elif uses.startswith("actions/upload-artifact@"):
            assert (ws / step["with"]["path"]).is_dir()
        elif "run" in step:
            code, log = served.run(step["run"], ws, env)
            results.append((step.get("name", ""), code, log))
            failed = code != 0
    summary = (ws / "summary.md").read_text() if (ws / "summary.md").exists() else ""
    return {"steps": results, "calls": served.calls, "summary": summary, "ws": ws,
            "pip": (tmp_path / "pip.log").read_text().splitlines()}


@pytest.mark.slow
def test_example_workflow_fails_a_20ms_per_step_regression(tmp_path: Path) -> None:
    res = run_workflow(tmp_path, head_sleep=0.02)
    names = [(name, code) for name, code, _ in res["steps"]]
    assert [n for n, _ in names] == ["Install lmprof and the script's requirements", "Profile the baseline",
                                     "Profile the change", "Gate"]
    assert [c for _, c in names] == [0, 0, 0, 1], res["steps"][-1][2]
    # pip was asked for lmprof and the change's requirements, once, in one environment.
    assert res["pip"] == ["-m pip install lmprof", "-m pip install -r head/requirements.txt"]
    # Each run is `lmprof run` of the user's script in its own checkout; the gate compares them.
    runs = [c for c in res["calls"] if c[0] == "run"]
    assert len(runs) == 2 and all(c[-1] == "train.py" and "--stop-after" in c for c in runs)
    compare = next(c for c in res["calls"] if c[0] == "compare")
    assert "runs/base/" in compare[1] and "runs/head/" in compare[2] and compare.count("--fail-on") == 2
    # The verdict, in the job summary and the log: step_time failed, beyond both spreads.
    assert res["summary"].startswith("## lmprof performance gate: ❌ fail")
    step_row = next(line for line in res["summary"].splitlines() if line.startswith("| step_time>+5%"))
    assert "❌ fail" in step_row
    assert "environment: the same in every run" in res["summary"]  # one runner, one environment
    assert (res["ws"] / "runs" / "gate.md").read_text() in res["steps"][-1][2]


@pytest.mark.slow
def test_example_workflow_on_an_unchanged_script_never_fails_without_saying_why(tmp_path: Path) -> None:
    res = run_workflow(tmp_path, head_sleep=0.0)
    gate_code, log = res["steps"][-1][1], res["steps"][-1][2]
    head = res["summary"].splitlines()[0]
    assert head.startswith("## lmprof performance gate: ")
    if gate_code == 0:  # a pass, or exit 3 turned into a warning annotation
        assert "❌" not in head
        assert ("cannot decide" in head) == ("::warning::lmprof cannot decide" in log)
    else:  # the same script can fail only where lmprof marked a run noisy, and the verdict says so
        assert gate_code == 1, log
        assert "warning: a run is marked noisy" in res["summary"] or "warning: both runs are marked noisy" in res["summary"]


def test_a_script_new_in_the_change_is_not_gated(tmp_path: Path) -> None:
    flow = yaml.safe_load(WORKFLOW.read_text())
    steps = {s.get("name"): s for s in flow["jobs"]["gate"]["steps"]}
    ws = tmp_path / "ws"
    (ws / "base").mkdir(parents=True)
    served = Served(tmp_path)
    env = {k: str(v) for k, v in flow["env"].items()} | {"SCRIPT": "my train.py"}  # quoted where it is used
    (ws / "base" / "my").write_text("")  # a file named like the script's first word must not be taken for it
    code, log = served.run(steps["Profile the baseline"]["run"], ws, env)
    assert code == 0 and "::notice::my train.py is not on the baseline yet" in log
    code, _ = served.run(steps["Gate"]["run"], ws, {**env, "GITHUB_STEP_SUMMARY": str(ws / "s.md")})
    assert code == 0 and served.calls == []
