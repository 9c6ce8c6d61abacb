"""A loop that compiles its optimizer step (PyTorch's "compiling the optimizer" recipe:
``torch.compile`` around a function that calls ``opt.step()``).

Found by running that recipe under ``lmprof run``: dynamo traced lmprof's global optimizer hooks into
its graph and failed on them, so lmprof stopped with "InternalTorchDynamoError: TypeError: descriptor
'__mro__' ..." and measured nothing. The hooks now return at once while dynamo traces (they are
nothing in the graph, so the user's step compiles as it does alone), and:

* under ``lmprof run``, whose steps end at optimizer steps, nothing is measured and the one line
  says why (a compiled optimizer step runs no hooks) and what to use instead;
* under ``lmprof.profile()``, whose steps are ``prof.step()``, the run is whole; the optimizer,
  which no hook sees step now, is found among live objects, so its state is measured (without that
  it read 0 B; before, dynamo traced the hooks through there).

Truths: the script alone (its output and how many graphs dynamo compiled), and the optimizer's state
tensors summed by the script.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LOOP = """
import json, sys, torch
import torch.nn as nn
import torch.nn.functional as F
torch.manual_seed(0)
V, D = 64, 32
model = nn.Sequential(nn.Embedding(V, D), nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, V))
opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3))

@torch.compile
def opt_step():
    opt.step()

x = torch.randint(0, V, (4, 16))

def one():
    loss = F.cross_entropy(model(x).reshape(-1, V), x.reshape(-1))
    loss.backward()
    opt_step()
    opt.zero_grad(set_to_none=True)
    return loss

{loop}
state = sum(t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
print(json.dumps({{"loss": round(loss.item(), 5), "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
                  "state": state}}))
"""
PLAIN = "for _ in range(12):\n    loss = one()"
PROFILED = ("import lmprof\n"
            "with lmprof.profile(model, out=sys.argv[1], report=False, verbose=False, warmup=3, steps=2,"
            " profile_steps=1) as prof:\n"
            "    for _ in range(12):\n        loss = one()\n        prof.step()\n"
            "print(prof.folder, file=sys.stderr)")


def _script(tmp_path: Path, name: str, loop: str) -> Path:
    path = tmp_path / name
    path.write_text(LOOP.format(loop=loop))
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """The loop without lmprof: its losses, graphs and optimizer state (one run for both tests)."""
    done = _run(str(_script(tmp_path_factory.mktemp("alone"), "loop.py", PLAIN)))
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, float] = json.loads(done.stdout)
    return out


def test_lmprof_run_leaves_a_compiled_optimizer_step_as_it_is_and_says_why_nothing_was_measured(
        tmp_path: Path, alone: dict[str, float]) -> None:
    script = _script(tmp_path, "loop.py", PLAIN)
    under = _run("-m", "lmprof", "run", "--no-report", "--out", str(tmp_path / "runs"), str(script))
    assert under.returncode == 0, under.stderr[-2000:]
    assert json.loads(under.stdout) == alone  # the same losses, one graph as alone
    lines = [ln for ln in under.stderr.splitlines() if ln.startswith("lmprof:")]
    assert len(lines) == 1 and "compiled with torch.compile runs no hooks" in lines[0], under.stderr[-2000:]
    assert "lmprof.profile(model)" in lines[0]


def test_lmprof_profile_measures_a_loop_whose_optimizer_step_is_compiled(tmp_path: Path, alone: dict[str, float]) -> None:
    from lmprof.record.run import Run

    under = _run(str(_script(tmp_path, "profiled.py", PROFILED)), str(tmp_path / "runs"))
    assert under.returncode == 0, under.stderr[-2000:]
    out = json.loads(under.stdout)
    assert out == alone, (out, alone)  # the loop's losses and graphs as alone
    run = Run.load(Path(under.stderr.strip().splitlines()[-1]))
    assert run.metrics["memory.optimizer"].value == out["state"]  # 0 B when no optimizer is known
    assert any(n.startswith("no optimizer step was seen") for n in run.notes), run.notes
