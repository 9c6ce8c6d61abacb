"""Cost of the whole-run watch per step, as wired (goal: at most 1% of a 10 ms step).

    .venv/bin/python benchmarks/watch_cost.py [--steps 300] [--rounds 5] [--width 96] [--threads 1]

A CPU training loop (an MLP stack, about 10 ms a step at the default width on one thread) runs two
copies of its model in turn, one step each per pass, one of them under ``lmprof.profile(model,
watch=True)`` (then, in a second loop, without the watch): the wired path, with everything the
protocol keeps in the loop after its window (the optimizer hooks, the forward pre-hook, the recorder
at each ``prof.step(loss=loss)``, the detectors every N steps, the capture-request poll; no panel:
``verbose=False``). Each pass gives a pair of step times taken a few milliseconds apart, so the
machine's own drifts (on a shared VM, batches of 100 steps vary by 10%) hit both sides of the pair;
which goes first alternates. The steps of lmprof's measured window (and the one after it) are left
out. The watch is told the plain step's length once its window ends (``_true_step``): between two of its
boundaries the plain copy steps too, so it would otherwise pace its periodic work for a step twice as
long, and look cheaper than on a real step of this length. The pairs are taken in blocks of ``BLOCK``
consecutive ones, each block's ratio the sum of its steps under lmprof over the sum of its plain ones:
the watch's periodic work (a memory read every few steps, the detectors every N) falls in each block,
where a median of single steps would leave it out. Printed: the median of the blocks' ratios and their
interquartile range, with and without the watch, and the watch's own share (the difference); the
``prof.step()`` call timed inside the loop (per step, averaged per block the same way); the calls alone,
timed over many repetitions (a figure machine load barely moves): step_end per step, and take + feed per
call.

Not a test: timings depend on the machine. Run it on a quiet one; the lead takes the figures.
"""
from __future__ import annotations

import argparse
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
from lmprof.pipeline.protocol.windows.watch import FEED_SHARE, watch_of
from lmprof.record.run import Baseline

# Paired steps per block: a block's ratio holds the watch's periodic work (memory reads, the detectors).
BLOCK = 16
# lmprof's measured window, then the first watched step (left out of the series: the profiler's teardown)
WINDOW = sum(DEFAULT_COUNTS["train"]) + 1 + 1


def _model(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * width, width)) for _ in range(4)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def paired(steps: int, width: int, out: Path, watch: bool) -> tuple[list[float], list[float], list[float]]:
    """(plain, under lmprof, prof.step() alone) seconds per step, paired: two copies of the model step in
    turn in one loop, one of them under ``lmprof.profile`` (watched when ``watch``), so a change in the
    machine's speed hits both sides of a pair; which side goes first alternates. The steps of lmprof's
    measured window (and the one after it) are left out. The third list is the ``prof.step()`` call
    timed by itself inside the loop: what the whole step pays beyond it is in the hooks."""
    plain_m, plain_o = _model(width)
    model, opt = _model(width)
    x = torch.randn(8, 32, width)
    kw: dict[str, Any] = {"watch": True, "watch_max_captures": 0} if watch else {}
    plain: list[float] = []
    under: list[float] = []
    calls: list[float] = []
    clock = time.perf_counter

    def watched() -> tuple[float, float]:
        t0 = clock()
        loss = _step(model, opt, x)
        t1 = clock()
        prof.step(loss=loss)
        t2 = clock()
        return t2 - t0, t2 - t1

    with lmprof.profile(model, out=out, report=False, verbose=False, **kw) as prof:
        for i in range(WINDOW + steps):
            if i % 2:
                t0 = clock()
                _step(plain_m, plain_o, x)
                p = clock() - t0
                u, c = watched()
            else:
                u, c = watched()
                t0 = clock()
                _step(plain_m, plain_o, x)
                p = clock() - t0
            plain.append(p)
            under.append(u)
            calls.append(c)
            if watch and i == WINDOW - 1:
                _true_step(prof, statistics.median(plain[-10:]))
        if watch:
            window = watch_of(prof.session.windows)
            assert window is not None and window.w is not None
            IN_LOOP.append((statistics.fmean(window._costs), window._every, window.w.memory_every or 1))
    return plain[WINDOW:], under[WINDOW:], calls[WINDOW:]


# Per watched round, as the watch chose them in the loop: (the detectors' feed cost, mean of its last calls,
# s; their period, steps; the memory read's period, steps)
IN_LOOP: list[tuple[float, int, int]] = []


def _true_step(prof: Any, step_s: float) -> None:
    """Tell the watch the step it would see without the pairing. Its boundaries are ``prof.step()``'s, and
    between two of them the plain copy steps too: left alone, it would think its step twice as long and
    run its periodic work (memory reads, the detectors) half as often as on a real step of this length."""
    window = watch_of(prof.session.windows)
    assert window is not None and window.w is not None and window.base is not None, "the watch did not start"
    window.base = window.base.model_copy(update={"step_s_median": step_s})
    window.w.step_s_hint = step_s


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
        paired(20, args.width, Path(tmp) / "warm", watch=False)  # the first loop pays for torch's first calls
        ratios: dict[bool, list[float]] = {True: [], False: []}
        calls: dict[bool, list[float]] = {True: [], False: []}
        plain_all: list[float] = []
        for r in range(args.rounds):
            for watch in (True, False):
                plain, under, call = paired(args.steps, args.width, Path(tmp) / f"{'w' if watch else 'u'}{r}", watch)
                plain_all += plain
                for k in range(0, len(plain) - BLOCK + 1, BLOCK):
                    ratios[watch].append(sum(under[k:k + BLOCK]) / sum(plain[k:k + BLOCK]))
                    calls[watch].append(statistics.fmean(call[k:k + BLOCK]))
        p = statistics.median(plain_all)
        baseline = Baseline.from_samples(plain_all[:30])
        end_s = step_end_cost(Path(tmp) / "alone")
        feed_s = feed_cost(baseline)
        every = period_for(feed_s, baseline.step_s_median, FEED_SHARE)
    for watch, label in ((True, "watched (lmprof.profile(watch=True))"), (False, "lmprof.profile without the watch")):
        r = np.array(ratios[watch])
        lo, hi = np.percentile(r, [25, 75])
        print(f"{label}: median of {len(r)} blocks' ratios of {BLOCK} paired steps {np.median(r):.4f} "
              f"({100 * (np.median(r) - 1):+.2f}%; interquartile {lo:.3f}-{hi:.3f}); plain step median {p * 1e3:.3f} ms")
    w, u = float(np.median(ratios[True])), float(np.median(ratios[False]))
    print(f"the watch's own share: {100 * (w - u):+.2f}% of a step (watched minus unwatched); "
          "goal: the watched loop at most +1% for steps of 10 ms and longer")
    cw, cu = (statistics.median(calls[k]) for k in (True, False))
    print(f"prof.step() timed inside the loop (mean of each block, median of blocks): {cw * 1e6:.1f} µs watched, {cu * 1e6:.1f} µs without the watch "
          f"({100 * (cw - cu) / p:.2f}% of a step; the rest of the watch's share is its hooks: the forward "
          "pre-hook, the optimizer's)")
    print(f"forward_start + step_end alone: {end_s * 1e6:.1f} µs per step "
          f"({100 * end_s / p:.3f}% of this loop's step)")
    print(f"take + detectors' feed of 16 rows alone: {feed_s * 1e6:.1f} µs per call (at that cost it would run every "
          f"{every} step(s): {100 * feed_s / every / p:.3f}% of this loop's step)")
    cost, period, mem = (statistics.median(v) for v in zip(*IN_LOOP))
    print(f"in the loop, as the watch chose (median of the rounds): a feed {cost * 1e6:.0f} µs every {period:.0f} steps "
          f"({100 * cost / period / p:.3f}% of a step), memory read every {mem:.0f} steps")


if __name__ == "__main__":
    main()
