"""Cost of the whole-run watch per step, as wired (goal: at most 1% of a 10 ms step).

    .venv/bin/python benchmarks/watch_cost.py [--steps 300] [--rounds 5] [--width 96] [--threads 1]

A CPU training loop (an MLP stack, about 10 ms a step at the default width on one thread) runs
alternately without lmprof and under ``lmprof.profile(model, watch=True)``, ``--rounds`` times each, in
this process: the wired path, with everything the protocol keeps in the loop after its window (the
optimizer hooks, the forward pre-hook, the recorder at each ``prof.step(loss=loss)``, the detectors
every N steps, the capture-request poll; no panel: ``verbose=False``). The loop's own stopwatch gives
each step's time; the steps of lmprof's measured window (and the one after it) are left out of both,
so the watched steps are compared with the same steps run plain. Printed: the ratio of the medians
and of the means (watched / plain); the mean holds the detectors' periodic runs, the median does not.
A third arm runs the loop under ``lmprof.profile`` without the watch, so the watch's own share is told from
what the protocol leaves in the loop either way. Also printed: the calls alone, timed over many repetitions (a figure machine load barely moves):
step_end per step, and take + feed per call.

Not a test: timings depend on the machine. Run it on a quiet one; the lead takes the figures.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import lmprof
from lmprof.analysis.watch_detect import WatchAnalyzer
from lmprof.counts import DEFAULT_COUNTS
from lmprof.measure.watch import Watcher, period_for
from lmprof.record.run import Baseline

FEED_SHARE = 0.0025  # the detectors may take this share of a step (windows/watch.py)
# lmprof's measured window, then the first watched step (left out of the series: the profiler's teardown)
WINDOW = sum(DEFAULT_COUNTS["train"]) + 1 + 1


def loop(steps: int, width: int, out: Path | None, watch: bool = True) -> list[float]:
    """Per-step seconds of the loop's own stopwatch, after lmprof's window (``out``: profiled into there,
    watched unless ``watch`` is False)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * width, width)) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 32, width)
    kw: dict[str, Any] = {"watch": True, "watch_max_captures": 0} if watch else {}
    watched: Any = (lmprof.profile(model, out=out, report=False, verbose=False, **kw)
                    if out is not None
                    else contextlib.nullcontext())
    ends = [time.perf_counter()]
    with watched as prof:
        for _ in range(WINDOW + steps):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if prof is not None:
                prof.step(loss=loss)
            ends.append(time.perf_counter())
    return [b - a for a, b in zip(ends, ends[1:])][WINDOW:]


def _rows(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    rows = {"step": np.arange(n), "step_s": 0.01 * rng.lognormal(0, 0.03, n), "own_s": np.zeros(n),
            "input_wait_s": np.full(n, 1e-4), "input_stall_s": np.full(n, np.nan), "rss_B": np.full(n, 5e8)}
    return rows


def feed_cost(baseline: Baseline, n: int = 16, calls: int = 300) -> float:
    """Seconds per detectors' feed of ``n`` rows (median of ``calls``)."""
    rng = np.random.default_rng(0)
    rows = _rows(n * calls, rng)
    an = WatchAnalyzer(baseline)
    costs = []
    for i in range(calls):
        part = {k: v[i * n:(i + 1) * n] for k, v in rows.items()}
        t = time.perf_counter()
        an.feed(part)
        costs.append(time.perf_counter() - t)
    return statistics.median(costs)


def step_end_cost(folder: Path, n: int = 20_000) -> float:
    """Seconds per forward_start + step_end of a watcher alone (spills included)."""
    w = Watcher(folder, tokens_per_step=256)
    w.start(0)
    t = time.perf_counter()
    for _ in range(n):
        w.forward_start()
        w.step_end(loss=1.0)
    dt = (time.perf_counter() - t) / n
    w.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--width", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        loop(20, args.width, None)  # warm: the first loop in a process pays for torch's own first calls
        plain: list[float] = []
        watched: list[float] = []
        unwatched: list[float] = []
        for r in range(args.rounds):  # alternated, so a change in machine load hits all three
            plain += loop(args.steps, args.width, None)
            watched += loop(args.steps, args.width, Path(tmp) / f"w{r}")
            unwatched += loop(args.steps, args.width, Path(tmp) / f"u{r}", watch=False)
        p, w, u = statistics.median(plain), statistics.median(watched), statistics.median(unwatched)
        pm, wm = statistics.fmean(plain), statistics.fmean(watched)
        baseline = Baseline.from_samples(plain[:30])
        end_s = step_end_cost(Path(tmp) / "alone")
        feed_s = feed_cost(baseline)
        every = period_for(feed_s, baseline.step_s_median, FEED_SHARE)
    print(f"step after lmprof's window, {len(plain)} steps each: plain median {p * 1e3:.3f} ms, watched "
          f"{w * 1e3:.3f} ms, ratio {w / p:.4f} ({100 * (w / p - 1):+.2f}%); means {pm * 1e3:.3f} / {wm * 1e3:.3f} "
          f"ms, ratio {wm / pm:.4f} ({100 * (wm / pm - 1):+.2f}%; goal at most +1% for steps of 10 ms and longer)")
    print(f"the same loop under lmprof.profile without the watch: median {u * 1e3:.3f} ms, ratio {u / p:.4f} "
          f"({100 * (u / p - 1):+.2f}%): what lmprof leaves in the loop after its window besides the watch; "
          f"watched / unwatched {w / u:.4f} ({100 * (w / u - 1):+.2f}%)")
    print(f"forward_start + step_end alone: {end_s * 1e6:.1f} µs per step "
          f"({100 * end_s / p:.3f}% of this loop's step)")
    print(f"take + detectors' feed of 16 rows: {feed_s * 1e6:.1f} µs per call, every {every} step(s): "
          f"{100 * feed_s / every / p:.3f}% of this loop's step")


if __name__ == "__main__":
    main()
