"""What lmprof's clean window costs a user's own generation loop, and so the error of its e2e latency.

    .venv/bin/python benchmarks/generation_overhead.py [--rounds 5] [--layers 2] [--width 64] [--call forward]
                                                       [--device cpu]

A decode loop as the lecture writes it (GPT-2 from a config, random weights, greedy, 8 forwards a
generation, its own stopwatch), ``--call forward`` calling ``model.forward(x)`` (lmprof then hooks two
submodules) or ``--call model`` calling ``model(x)`` (lmprof hooks the model). Each round runs 20
generations plain, then 22 under ``lmprof.profile(infer=True, warmup=1, steps=20, profile_steps=1)``.
Printed, medians over the rounds' generations:

* the script's own stopwatch, plain and in lmprof's clean window: what lmprof's hooks cost the loop;
* lmprof's ``e2e_latency`` (run.json) against the plain stopwatch: the error of the figure it reports;
* the same cost measured inside one session, generations alternating with lmprof's hooks taken off the
  modules and put back (no change of process state between them: the most precise figure), per forward.

On CUDA the script's stopwatch synchronizes the device before each read, as lmprof's marks do; lmprof's
marks also synchronize at every forward's end, which a loop that does not itself wait for each token
(this one: argmax and cat stay on the device) would not do: the figures show what that costs too.

Not a test: timings depend on the machine; run it on a quiet one, nothing else on its cores.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

import lmprof

FORWARDS = 8  # a generation: the prefill and 7 decode forwards


def _model(layers: int, width: int, device: torch.device) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_head=max(2, width // 64), n_embd=width, vocab_size=512, n_positions=64)
    return GPT2LMHeadModel(config).eval().to(device)


def _generation(model: Any, prompt: torch.Tensor, call: str) -> Callable[[], float]:
    run = model.forward if call == "forward" else model
    sync = torch.cuda.synchronize if prompt.device.type == "cuda" else (lambda: None)

    def generate() -> float:
        ids = prompt
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            for _ in range(FORWARDS):
                logits = run(ids).logits
                ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
        sync()
        return time.perf_counter() - t

    return generate


def _hooks(model: torch.nn.Module) -> list[tuple[dict[int, Any], int, Any]]:
    # torch keeps a module's hooks in these dicts; taking an entry out and putting it back is the only way
    # to switch lmprof's hooks off and on without ending its session
    return [(d, k, h) for m in model.modules() for d in (m._forward_pre_hooks, m._forward_hooks)
            for k, h in d.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--call", choices=("forward", "model"), default="forward")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = _model(args.layers, args.width, device)
    generate = _generation(model, torch.randint(0, 512, (1, 6), device=device), args.call)
    for _ in range(10):
        generate()
    plain: list[float] = []
    watched: list[float] = []
    reported: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            plain += [generate() for _ in range(20)]
            with lmprof.profile(model, out=Path(tmp), infer=True, report=False, verbose=False, warmup=1, steps=20,
                                profile_steps=1) as prof:
                times = []
                for _ in range(22):
                    times.append(generate())
                    prof.step()
            watched += times[1:21]  # the clean window's generations
            if prof.run is None:
                raise SystemExit(f"generation_overhead: lmprof measured nothing: {prof.message}")
            reported.append(prof.run.metrics["e2e_latency"].value / 1e3)  # ms in the record
        on, off = [], []
        with lmprof.profile(model, out=Path(tmp), infer=True, report=False, verbose=False, warmup=1, steps=10**6,
                            profile_steps=1) as prof:
            for _ in range(4):
                generate()
                prof.step()
            hooks = _hooks(model)
            for _ in range(6 * args.rounds):
                for d, k, _h in hooks:
                    del d[k]
                off += [generate() for _ in range(5)]
                for d, k, h in hooks:
                    d[k] = h
                for _ in range(5):
                    on.append(generate())
                    prof.step()
    p, w, r = (statistics.median(x) * 1e3 for x in (plain, watched, reported))
    call = "model.forward(x)" if args.call == "forward" else "model(x)"
    print(f"GPT-2 {args.layers} x {args.width} on {device}, {FORWARDS} forwards a generation, {call}, "
          f"{torch.get_num_threads()} thread(s), {args.rounds} rounds")
    print(f"{'':44s} {'ms':>8s} {'vs plain':>9s}")
    print(f"{'plain (the script stopwatch)':44s} {p:8.3f}")
    print(f"{'in lmprof clean window (the script stopwatch)':44s} {w:8.3f} {100 * (w - p) / p:+8.2f}%")
    print(f"{'e2e_latency lmprof reports':44s} {r:8.3f} {100 * (r - p) / p:+8.2f}%")
    a, b = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    print(f"one session, hooks off / on: {a:.3f} / {b:.3f} ms = {100 * (b - a) / a:+.2f}%, "
          f"{(b - a) * 1e3 / FORWARDS:.1f} us a forward ({len(hooks)} hooks)")


if __name__ == "__main__":
    main()
