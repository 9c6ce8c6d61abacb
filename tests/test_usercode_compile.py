"""A user's compiled model gets the compile report lmprof train gives: compilations per phase,
recompilations with dynamo's reason, and the 'recompiles every step' warning.

The truth is dynamo's own bookkeeping, read in the test: ``torch._dynamo.utils.counters`` counts each
frame compilation, and a model fed a new sequence length each step with ``dynamic=False`` must
recompile on every one of those steps (dynamo's eager backend: the same events, no code generation).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import lmprof
from lmprof.cli.main import main

pytestmark = pytest.mark.slow


def test_profile_of_a_model_that_recompiles_every_step_says_so(tmp_path: Path) -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 8)
    model = torch.compile(net, backend="eager", dynamic=False)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with lmprof.profile(model, warmup=1, steps=3, profile_steps=1, out=tmp_path, verbose=False, report=False) as prof:
        for length in range(2, 8):  # 6 steps: warm-up 1, 3 clean, the profiler's warm-up step, 1 profiled
            x = torch.randn(length, 8)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    run = prof.run
    assert run is not None
    compiled = counters["stats"]["unique_graphs"]
    rows = run.tables["compile"]
    assert len(rows) == compiled  # every compilation dynamo made in the with-block, none missed or added
    measured = [r for r in rows if r["phase"] == "measured"]
    assert len(measured) == 3 and all(r["kind"] == "recompile" for r in measured)
    assert all("size mismatch at index 0" in r["reason"] for r in measured)
    assert run.value("compile.per_step") == 1.0
    assert any("recompiles every step" in n for n in run.notes)
    torch._dynamo.reset()


def test_lmprof_run_counts_the_compilation_before_the_model_was_found(tmp_path: Path) -> None:
    """Under lmprof run the session finds the model at the first optimizer step, after that step
    compiled it: the first compilation still counts (the process is the script's)."""
    import torch._dynamo

    # dynamo's caches are the worker's: a Linear compiled by an earlier test would make this one a
    # recompilation (the code object is torch's, shared by every Linear)
    torch._dynamo.reset()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 8)
        model = torch.compile(net, backend="eager")
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        x = torch.randn(4, 8)
        for _ in range(8):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        from torch._dynamo.utils import counters
        print("frames", counters["stats"]["unique_graphs"])
    """))
    out = tmp_path / "runs"
    code = main(["run", "--out", str(out), "--no-report", "--warmup", "1", "--steps", "2", "--profile-steps", "1",
                 str(script)])
    assert code == 0
    (folder,) = [p for p in out.iterdir() if (p / "run.json").is_file()]
    run = lmprof.load_run(folder)
    rows = run.tables["compile"]
    assert [(r["kind"], r["phase"]) for r in rows] == [("compile", "warm-up")]
    assert run.value("compile.recompiles") == 0
