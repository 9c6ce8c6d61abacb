"""Cost of the whole-run watch per step (goal: at most 1% of a 10 ms step).

    .venv/bin/python benchmarks/watch_cost.py [--steps 300] [--rounds 5] [--width 96] [--threads 1]

A CPU training loop (an MLP stack, about 10 ms a step at the default width on one thread) runs
alternately without and with the watch, ``--rounds`` times each, in this process. With the watch, each
step calls what the protocol will call: ``forward_start()`` before the forward, ``step_end()`` after the
optimizer step (the loss tensor passed), and every ``feed_every`` steps ``take()`` into the detectors,
the live panel (plain lines, to /dev/null) and the capture-request poll; the series is spilled to a
temporary folder. The loop's own stopwatch gives each step's time; the ratio of the medians (watched /
plain) is the watch's cost. Also printed: the calls alone, timed over many repetitions (a figure that
machine load barely moves): step_end per step, and take + feed per call.

Not a test: timings depend on the machine. Run it on a quiet one; the lead takes the figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lmprof.analysis.watch_detect import WatchAnalyzer
from lmprof.measure.watch import CaptureRequests, Watcher, period_for
from lmprof.record.run import Baseline
from lmprof.record.watch import StepSummary
from lmprof.show.watch_panel import WatchPanel

FEED_SHARE = 0.0025  # the detectors may take this share of a step


def loop(steps: int, width: int, watch: Path | None, baseline: Baseline | None) -> list[float]:
    """Per-step seconds of the loop's own stopwatch (``watch``: a folder to watch it into)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * width, width)) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 32, width)
    w = an = panel = reqs = None
    every = 1
    if watch is not None and baseline is not None:
        w = Watcher(watch, tokens_per_step=8 * 32, step_s_hint=baseline.step_s_median)
        an = WatchAnalyzer(baseline)
        panel = WatchPanel(open(os.devnull, "w"), live=False)
        reqs = CaptureRequests(watch, signals=False)
        every = period_for(feed_cost(baseline), baseline.step_s_median, FEED_SHARE)
        w.start(0)
    ends = [time.perf_counter()]
    for k in range(steps):
        if w is not None:
            w.forward_start()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if w is not None and an is not None and panel is not None and reqs is not None:
            w.step_end(loss=loss)
            if k % every == 0:
                t0 = time.perf_counter()
                rows = w.take()
                if rows is not None:
                    panel.update(StepSummary.from_row(rows), an.feed(rows))
                reqs.poll(t0)
                w.add_own(time.perf_counter() - t0)
        ends.append(time.perf_counter())
    if w is not None:
        w.close()
    return [b - a for a, b in zip(ends, ends[1:])]


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
        clean = loop(30, args.width, None, None)[5:]  # the clean window the baseline comes from
        baseline = Baseline.from_samples(clean)
        plain: list[float] = []
        watched: list[float] = []
        for r in range(args.rounds):  # alternated, so a change in machine load hits both
            plain += loop(args.steps, args.width, None, None)[10:]
            watched += loop(args.steps, args.width, Path(tmp) / f"w{r}", baseline)[10:]
        p, w = statistics.median(plain), statistics.median(watched)
        end_s = step_end_cost(Path(tmp) / "alone")
        feed_s = feed_cost(baseline)
        every = period_for(feed_s, baseline.step_s_median, FEED_SHARE)
    print(f"step, median of {len(plain)} steps: plain {p * 1e3:.3f} ms, watched {w * 1e3:.3f} ms, "
          f"ratio {w / p:.4f} ({100 * (w / p - 1):+.2f}%; goal at most +1% for steps of 10 ms and longer)")
    print(f"forward_start + step_end alone: {end_s * 1e6:.1f} µs per step "
          f"({100 * end_s / p:.3f}% of this loop's step)")
    print(f"take + detectors' feed of 16 rows: {feed_s * 1e6:.1f} µs per call, every {every} step(s): "
          f"{100 * feed_s / every / p:.3f}% of this loop's step")


if __name__ == "__main__":
    main()
