"""Shared test set-up: one torch thread per xdist worker (2 workers on 2 cores), tiny everything."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("LMPROF_CACHE_DIR", os.path.join(os.path.dirname(__file__), ".cache-unused"))

import pytest  # noqa: E402
import torch  # noqa: E402

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
