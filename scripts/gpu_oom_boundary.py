"""The real out-of-memory boundary of `lmprof train`'s own step on this GPU, by bisection with real
allocations: the largest batch whose two training steps (the second with the optimizer state, as the
estimate's peak assumes) run, and the smallest that runs out of memory. Used by scripts/gpu_check.py
against `lmprof memory`'s largest batch.

    python scripts/gpu_oom_boundary.py --start 131 [--preset gpt2 --seq-len 1024 --dtype bf16 ...]

Prints one JSON line: largest_ok, smallest_oom, exact (they are one batch apart) and every probe
(batch, ok, peak_bytes = torch.cuda.max_memory_allocated over the two steps, wall_s). Bounded by
--time-limit: each probe builds the model afresh and gives every byte back before the next.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import time
from typing import Any, Callable

GROWTH = 1.5  # how far each probe steps out while the boundary is not yet bracketed


def bisect_boundary(fits: Callable[[int], bool], start: int, time_left: Callable[[], float],
                    cap: int = 1 << 16) -> tuple[int | None, int | None]:
    """(largest batch that fits, smallest that does not), from ``start``: stepping out by GROWTH until
    the boundary is bracketed, then halving the bracket. Either end is None when it was not reached
    (time ran out, ``cap`` fits, or not even batch 1 does)."""
    lo: int | None = None
    hi: int | None = None
    b = max(1, start)
    while time_left() > 0:
        if fits(b):
            lo = b
            if hi is None:
                if b >= cap:
                    break
                b = min(cap, max(b + 1, math.ceil(b * GROWTH)))
                continue
        else:
            hi = b
            if lo is None:
                if b == 1:
                    break
                b = max(1, min(b - 1, int(b / GROWTH)))
                continue
        if lo is not None and hi is not None:
            if hi - lo <= 1:
                break
            b = (lo + hi) // 2
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", type=int, required=True, help="first batch to try (the fit check's largest)")
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--attention", default="sdpa")
    ap.add_argument("--time-limit", type=float, default=90.0, help="seconds; no probe starts after it")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the rehearsal, the same probes on the CPU with 'out of memory' past --cpu-max-batch")
    ap.add_argument("--cpu-max-batch", type=int, default=8)
    args = ap.parse_args()
    cuda = args.device == "cuda"

    import torch

    from lmprof.config import TrainConfig
    from lmprof.hardware.devices import resolve_device
    from lmprof.workloads.builders import gpt_train_workload
    from lmprof.workloads.training import TrainStep

    device = resolve_device(args.device)
    probes: list[dict[str, Any]] = []

    def fits(batch: int) -> bool:
        t0 = time.monotonic()
        ok, peak = True, None
        try:
            cfg = TrainConfig(preset=args.preset, batch_size=batch, seq_len=args.seq_len, dtype=args.dtype,
                              attention=args.attention, device=args.device, energy="off")
            work, _ = gpt_train_workload(cfg, device)
            step = TrainStep(work, args.dtype)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            elif batch > args.cpu_max_batch:
                raise torch.OutOfMemoryError(f"rehearsal: batch {batch} > --cpu-max-batch {args.cpu_max_batch}")
            step()
            step()  # the second step holds the optimizer state the estimate's peak counts
            peak = int(torch.cuda.max_memory_allocated()) if cuda else None
        except torch.OutOfMemoryError:
            ok = False
        finally:
            work = step = None  # noqa: F841  # drop the model, optimizer and activations before the next probe
            gc.collect()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        probes.append({"batch": batch, "ok": ok, "peak_bytes": peak, "wall_s": round(time.monotonic() - t0, 2)})
        return ok

    end = time.monotonic() + args.time_limit
    lo, hi = bisect_boundary(fits, args.start, lambda: end - time.monotonic())
    print(json.dumps({"largest_ok": lo, "smallest_oom": hi, "exact": lo is not None and hi is not None and hi - lo == 1,
                      "device_memory_bytes": int(torch.cuda.get_device_properties(0).total_memory) if cuda else None,
                      "preset": args.preset, "seq_len": args.seq_len, "dtype": args.dtype, "attention": args.attention,
                      "probes": probes}))


if __name__ == "__main__":
    main()
