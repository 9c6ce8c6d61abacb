"""One-shot CUDA validation of lmprof (issue 51): every CUDA check in a fixed order, most valuable first,
under one time budget, each step's figures and pass/fail written to one JSON summary.

    bash scripts/gpu_check.sh                          # on the GPU machine (sets up, then runs this)
    python scripts/gpu_check.py --device cpu --out DIR # the rehearsal: CUDA-only steps are skipped
    python scripts/gpu_check.py --plan --out DIR       # list the steps, write a planned summary (no torch)

Everything goes under --out: summary.json (schema lmprof.gpu_check/1: every figure with its unit and
source, every check with its threshold), summary.md (the section for docs/gpu-validation.md), env/
(nvidia-smi -q, pip freeze, versions), logs/ (each command's stdout and stderr), runs/ (the run
folders), traces/ (the runs' traces under 2 MB, for tests/data/traces), analyze/ (`lmprof analyze
--json` of each trace). --bundle DIR (default $OUT, the device tool's return folder) receives at most
five flat files, refreshed after every step so a run killed at its limit still brings back what was
done: summary.json, summary.md, results.tar.gz (the whole --out but traces, files under 2 MB),
traces.tar (the small traces) and nvidia-smi-q.txt.

A step that fails, errs or times out is recorded and the next one runs. A step is skipped, with the
reason, when the budget left is below what it needs or when it needs CUDA on a CPU rehearsal. This
script imports neither torch nor lmprof: whatever breaks in them, the summary is still written.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from gpu_check_summary import brief, fmt, markdown  # beside this script (sys.path[0] when it runs)

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "lmprof.gpu_check/1"
STATUSES = ("planned", "pass", "fail", "error", "timeout", "skipped")
SOURCES = ("measured", "estimated", "derived", "reported", "reference")
SMALL_TRACE = 2 * 1024 * 1024  # bytes: what tests/data/traces keeps (issue 51)
BUNDLE_FILE_MAX = 15 * 1024 * 1024  # the device tool brings back files of up to 16 MiB
SETUP_PREFIX = "GPU_CHECK_SETUP_"
RESERVE_S = 20.0  # kept back from the budget for the final summary and bundle

# Dense bf16 tensor-core peaks from the vendor datasheets (FLOP/s, without sparsity): the independent
# figure lmprof's own peak table and MFU are checked against. Longest name first: "H100 PCIe" before "H100".
DATASHEET_BF16 = (
    ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12),
    ("H100", 989.4e12), ("H200", 989.4e12), ("A100", 312e12),
)
MFU_TARGET_PCT = 40.0  # nanoGPT-class GPT-2 training with torch.compile (issue 51)
MEMORY_TOLERANCE = 0.05  # measured peak against the estimate (issue 51)


# ----------------------------------------------------------------------------------------------- records
@dataclass
class Figure:
    name: str
    value: float | int | str | None  # None: n/a, the note says why
    unit: str
    source: str  # one of SOURCES
    note: str = ""


@dataclass
class Check:
    name: str
    value: float | int | str | None
    unit: str
    threshold: str  # what was asked, e.g. ">= 40 %" or "= 2400" or "within 5% of 9.4 GB"
    ok: bool | None  # None: not applicable here (note says why) or no value to judge
    note: str = ""


@dataclass
class Command:
    argv: list[str]
    rc: int | None  # None: never started
    wall_s: float
    timed_out: bool
    stdout: str  # log file paths, relative to --out
    stderr: str
    stdout_tail: str
    stderr_tail: str


@dataclass
class StepRecord:
    name: str
    title: str
    needs_cuda: bool
    status: str
    reason: str = ""
    wall_s: float = 0.0
    commands: list[Command] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shapes:
    """What each step runs: the GPU sizes, or the CPU rehearsal's (same commands, smaller models)."""

    train: tuple[str, ...]  # model and batch of the built-in GPT's training runs
    train_steps: tuple[str, ...]
    infer_layers: int  # --n-layer of --hf-config gpt2 (12 is GPT-2 small itself)
    new_tokens: int
    infer_steps: tuple[str, ...]
    user_train: tuple[str, ...]  # scripts/gpu_user_train.py's own arguments
    user_generate: tuple[str, ...]
    run_train_steps: tuple[str, ...]  # lmprof run's window for the training script
    run_infer_steps: tuple[str, ...]
    graphs: tuple[str, ...]  # the CUDA-graph inference run's model
    graphs_tokens: int
    graphs_steps: tuple[str, ...]
    overhead: tuple[str, ...]  # benchmarks/overhead.py
    generation: tuple[str, ...]  # benchmarks/generation_overhead.py
    calibrate: tuple[str, ...]
    oom: tuple[str, ...]  # model of the out-of-memory bisection (the fit check's and the probes')
    small_layers: int  # --n-layer of the re-runs that make small traces
    timeout_scale: float  # step limits are sized for the GPU; a shared CPU is slower (the budget still bounds)


GPU = Shapes(
    train=("--preset", "gpt2", "-b", "16", "-t", "1024"),
    train_steps=("--steps", "10", "--warmup", "3", "--profile-steps", "3"),
    infer_layers=12, new_tokens=50, infer_steps=("--steps", "5", "--warmup", "1", "--profile-steps", "1"),
    user_train=("--n-layer", "12", "--batch-size", "8", "--seq-len", "512", "--steps", "20"),
    user_generate=("--n-layer", "12", "--new-tokens", "32", "--generations", "12"),  # > lmprof run's 1 + 5 + 1 + 1
    run_train_steps=("--steps", "10", "--warmup", "3", "--profile-steps", "2"),
    run_infer_steps=("--steps", "5", "--warmup", "1", "--profile-steps", "1"),
    graphs=("--preset", "gpt2", "--dtype", "bf16", "--attention", "sdpa"), graphs_tokens=64,
    graphs_steps=("--steps", "5", "--warmup", "2", "--profile-steps", "1"),
    overhead=("--presets", "tiny,small,gpt2", "--steps", "10"),
    generation=("--layers", "12", "--width", "768", "--rounds", "3"),
    calibrate=("--dtypes", "bf16,tf32", "--seconds", "10"),
    oom=("--preset", "gpt2", "--seq-len", "1024"),
    small_layers=2, timeout_scale=1.0,
)
REHEARSAL = Shapes(
    train=("--preset", "tiny", "-b", "8", "-t", "64"),
    train_steps=("--steps", "3", "--warmup", "1", "--profile-steps", "1"),
    infer_layers=2, new_tokens=8, infer_steps=("--steps", "2", "--warmup", "1", "--profile-steps", "1"),
    user_train=("--n-layer", "2", "--batch-size", "2", "--seq-len", "64", "--steps", "8"),
    user_generate=("--n-layer", "2", "--new-tokens", "6", "--generations", "8"),
    run_train_steps=("--steps", "3", "--warmup", "2", "--profile-steps", "1"),
    run_infer_steps=("--steps", "2", "--warmup", "1", "--profile-steps", "1"),
    graphs=("--preset", "tiny", "--dtype", "bf16", "--attention", "sdpa"), graphs_tokens=8,
    graphs_steps=("--steps", "2", "--warmup", "1", "--profile-steps", "1"),
    overhead=("--presets", "tiny", "--steps", "3"),
    generation=("--rounds", "1"),
    calibrate=("--dtypes", "fp32", "--seconds", "2"),
    oom=("--preset", "tiny", "--seq-len", "64"),
    small_layers=1, timeout_scale=3.0,
)


# ----------------------------------------------------------------------------------------------- helpers
def write_atomic(path: Path, data: bytes | str) -> None:
    """Write a whole file or nothing (a temporary file renamed over it). Not lmprof.atomic: this script
    must write its summary even when lmprof itself does not import."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def tail(path: Path, n: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def card_peak(device_name: str) -> float | None:
    """The datasheet dense bf16 peak of a card, by name; None for a card not in the list."""
    for key, peak in DATASHEET_BF16:
        if key.lower() in device_name.lower():
            return peak
    return None


def load_trace(path: Path) -> dict[str, Any]:
    """A Kineto trace read with the json module alone: the independent count lmprof's figures meet."""
    with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")) as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {"traceEvents": data}


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # device work in a Kineto trace


def trace_counts(path: Path) -> dict[str, Any]:
    """Kernels, graph launches, NCCL kernels and CPU ops of a trace, counted event by event."""
    events = [e for e in load_trace(path).get("traceEvents", []) if isinstance(e, dict)]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    # The trace also holds the profiler's warm-up step: operators are counted inside the ProfilerStep windows
    steps = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0)) for e in events
             if str(e.get("name", "")).startswith("ProfilerStep#") and "ts" in e]
    ops: dict[str, int] = {}
    for e in events:
        if e.get("cat") == "cpu_op" and "ts" in e and any(a <= float(e["ts"]) <= b for a, b in steps):
            ops[str(e.get("name"))] = ops.get(str(e.get("name")), 0) + 1
    runtime = [str(e.get("name")) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    names = [str(e.get("name") or "") for e in kernels]
    # Device work launched inside the profiled steps (its runtime call, found by correlation id, in a
    # ProfilerStep window), summed: per step, what a device-clock block table must account for.
    launched = {(e.get("args") or {}).get("correlation"): float(e["ts"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "ts" in e}
    device_us = 0.0
    for e in events:
        if e.get("cat") in DEVICE_CATS:
            ts = launched.get((e.get("args") or {}).get("correlation"))
            if ts is not None and any(a <= ts <= b for a, b in steps):
                device_us += float(e.get("dur") or 0)
    return {
        "events": len(events),
        "kernels": len(kernels),
        "device_events": sum(1 for e in events if e.get("cat") in DEVICE_CATS),
        "kernels_unnamed": sum(1 for n in names if not n.strip()),
        "kernel_names": len(set(names)),
        "nccl_kernels": sum(1 for n in names if "nccl" in n.lower()),
        "graph_launches": sum(1 for n in runtime if n.startswith("cudaGraphLaunch")),
        "profiler_steps": len(steps),
        "device_ms_per_step": device_us / 1e3 / len(steps) if steps else None,
        "ops": ops,  # CPU operators inside the profiler steps, by name
    }


# ----------------------------------------------------------------------------------------------- one run
class Context:
    """The check's options, paths and clock, shared by every step."""

    def __init__(self, args: argparse.Namespace):
        self.device: str = args.device
        self.cuda = self.device == "cuda"
        self.shapes = GPU if self.cuda else REHEARSAL
        self.out = Path(args.out).resolve()
        self.bundle = Path(args.bundle).resolve() if args.bundle else None
        self.python = args.python or sys.executable
        self.lmprof = shlex.split(args.lmprof_cmd) if args.lmprof_cmd else [self.python, "-m", "lmprof"]
        started = float(os.environ.get("GPU_CHECK_STARTED") or time.time())  # gpu_check.sh's start: set-up counts
        self.started = started
        self.deadline: float = started + float(args.budget)
        self.budget = float(args.budget)
        self.env_info: dict[str, Any] = {}
        self.setup: dict[str, Any] = {}
        self.big_traces: list[tuple[str, Path]] = []  # (label, trace) too large to keep: small_traces re-runs them
        self.runs: dict[str, Path] = {}  # step label -> run folder, for later steps (energy reads them)
        self.child: subprocess.Popen[bytes] | None = None
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", LMPROF_CACHE_DIR=str(self.out / "cache"))

    def left(self) -> float:
        return self.deadline - time.time() - RESERVE_S


class StepFailed(Exception):
    """A command of the step failed: the step is recorded as an error and the check goes on."""


class StepRun:
    """What a step function gets: commands with timeouts and logs, figures, checks, traces."""

    def __init__(self, ctx: Context, rec: StepRecord, deadline: float):
        self.ctx, self.rec, self.deadline = ctx, rec, deadline
        self.sh = ctx.shapes
        self.dev = ctx.device

    # commands -------------------------------------------------------------------------------------
    def run(self, argv: list[str], label: str = "", timeout: float | None = None, ok_rc: Iterable[int] = (0,),
            must: bool = True) -> Command:
        """Run one command (its own process group, killed at the timeout); its output goes to logs/."""
        n = len(self.rec.commands) + 1
        stem = f"{self.rec.name}-{n}{'-' + label if label else ''}"
        logs = self.ctx.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out_p, err_p = logs / f"{stem}.stdout", logs / f"{stem}.stderr"
        limit = max(1.0, min(timeout or 1e9, self.deadline - time.time()))
        t0 = time.monotonic()
        rc: int | None = None
        timed_out = False
        with open(out_p, "wb") as out, open(err_p, "wb") as err:
            err.write(f"$ {shlex.join(argv)}\n".encode())
            err.flush()
            try:
                proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, env=self.ctx.env, start_new_session=True)
            except OSError as exc:
                err.write(f"could not start: {exc}\n".encode())
                proc = None
            if proc is not None:
                self.ctx.child = proc
                try:
                    rc = proc.wait(timeout=limit)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    rc = stop(proc)
                finally:
                    self.ctx.child = None
        cmd = Command(argv=[str(a) for a in argv], rc=rc, wall_s=round(time.monotonic() - t0, 2), timed_out=timed_out,
                      stdout=str(out_p.relative_to(self.ctx.out)), stderr=str(err_p.relative_to(self.ctx.out)),
                      stdout_tail=tail(out_p), stderr_tail=tail(err_p))
        self.rec.commands.append(cmd)
        if timed_out:
            raise TimeoutError(f"{shlex.join(argv[:6])}... ran past its {limit:.0f} s")
        if must and rc not in set(ok_rc):
            last = (cmd.stderr_tail.strip().splitlines() or ["(no output)"])[-1]
            raise StepFailed(f"exit {rc}: {last[:300]}")
        return cmd

    def lmprof(self, args: list[str], label: str = "", **kw: Any) -> Command:
        return self.run([*self.ctx.lmprof, *args], label or args[0], **kw)

    def python(self, args: list[str], label: str = "", **kw: Any) -> Command:
        return self.run([self.ctx.python, *args], label, **kw)

    def folder(self, sub: str) -> Path:
        p = self.ctx.out / "runs" / sub
        p.mkdir(parents=True, exist_ok=True)
        return p

    def read(self, cmd: Command) -> str:
        return (self.ctx.out / cmd.stdout).read_text(encoding="utf-8", errors="replace")

    # figures and checks ----------------------------------------------------------------------------
    def figure(self, name: str, value: Any, unit: str, source: str, note: str = "") -> None:
        assert source in SOURCES, source
        self.rec.figures.append(Figure(name, value, unit, source, note))

    def check(self, name: str, value: Any, unit: str, threshold: str, ok: bool | None, note: str = "",
              cuda_only: bool = False) -> None:
        """Record a check; ``cuda_only`` makes it n/a on the CPU rehearsal. The helpers below count a
        missing value as a failure: a figure a check needs that lmprof did not write is a finding."""
        if cuda_only and not self.ctx.cuda:
            ok, note = None, ("not applicable on the CPU rehearsal" + (f"; {note}" if note else ""))
        self.rec.checks.append(Check(name, value, unit, threshold, ok, note))

    def check_min(self, name: str, value: float | None, minimum: float, unit: str, **kw: Any) -> None:
        self.check(name, value, unit, f">= {minimum:g} {unit}".strip(), value is not None and value >= minimum, **kw)

    def check_equal(self, name: str, value: Any, expected: Any, unit: str = "", **kw: Any) -> None:
        shown = int(expected) if isinstance(expected, float) and expected.is_integer() else expected
        self.check(name, value, unit, f"= {shown}", value is not None and value == expected, **kw)

    def check_close(self, name: str, value: float | None, ref: float | None, tol: float, unit: str,
                    **kw: Any) -> None:
        """``value`` within ``tol`` (a fraction) of the independent ``ref``; n/a without a reference."""
        if not ref:
            kw["note"] = ("no reference figure here; " + kw.get("note", "")).rstrip("; ")
            self.check(name, value, unit, f"within {tol:.0%} of a reference", None, **kw)
            return
        if value is None:
            self.check(name, value, unit, f"within {tol:.0%} of {fmt(ref)} {unit}".rstrip(), False, **kw)
            return
        dev = value / ref - 1
        self.check(name, value, unit, f"within {tol:.0%} of {fmt(ref)} {unit}".rstrip(), abs(dev) <= tol,
                   note=(f"{dev:+.2%}; " + kw.pop("note", "")).rstrip("; "), **kw)

    # run folders -----------------------------------------------------------------------------------
    def run_folder(self, out: Path) -> tuple[Path, dict[str, Any]]:
        """The one finished run folder under ``out`` (lmprof names it) and its run.json."""
        found = sorted(p.parent for p in out.glob("*/run.json")) or sorted(p.parent for p in out.glob("*/*/run.json"))
        if not found:
            raise StepFailed(f"no run.json under {out.relative_to(self.ctx.out)}")
        folder = found[-1]
        self.rec.files.append(str(folder.relative_to(self.ctx.out)))
        run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        self.matches_schema(run)
        return folder, run

    def matches_schema(self, run: dict[str, Any]) -> None:
        """Check a run.json against docs/run.schema.json with jsonschema (a CUDA run writes keys a CPU run
        cannot: device_ms, the env's gpu facts, NVML's energy rows); each problem in the note."""
        try:
            import jsonschema
        except ImportError:
            self.check("run.json matches docs/run.schema.json", None, "", "valid", None, "jsonschema not installed")
            return
        schema = json.loads((ROOT / "docs" / "run.schema.json").read_text(encoding="utf-8"))
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"[:200]
                  for e in jsonschema.Draft202012Validator(schema).iter_errors(run)]
        self.check("run.json matches docs/run.schema.json", len(errors), "problems", "0", not errors,
                   "; ".join(errors[:5]))

    def metric(self, run: dict[str, Any], name: str, label: str | None = None) -> float | None:
        """Record a run metric as a figure (value, unit, source, note as lmprof wrote them); its value."""
        m = run.get("metrics", {}).get(name)
        if not isinstance(m, dict):
            self.figure(label or name, None, "", "measured", "not in run.json")
            return None
        self.figure(label or name, m.get("value"), str(m.get("unit") or ""), str(m.get("source") or "measured"),
                    str(m.get("note") or ""))
        v = m.get("value")
        return float(v) if isinstance(v, (int, float)) else None

    def blocks_add_up(self, run: dict[str, Any], step_metric: str, label: str = "") -> None:
        """The profiled window completed, the block rows sum to the clean step (time_ms) and to the mean
        profiled step (profiled_ms), on the device's clock; ``label`` prefixes the names (two runs a step)."""
        pre = f"{label}: " if label else ""
        short = [n for n in run.get("notes", []) if "profiled window completed" in n]  # session.py's note
        self.check(f"{pre}profiled window completed", not short, "", "no 'profiled window' note", not short,
                   note=" ".join(short)[:200])
        blocks = run.get("blocks") or []
        step = (run.get("metrics", {}).get(step_metric) or {}).get("value")
        total = sum(float(b.get("time_ms") or 0) for b in blocks)
        self.check_close(f"{pre}blocks add up to {step_metric}", total, step, 0.01, "ms")
        att = (run.get("tables", {}).get("attribution") or [{}])[0]
        prof = att.get("profiled_step_ms") or []
        # lmprof's own hooks inside a profiled step are in it and in no block (reconcile.py: timed by their own
        # ranges, on the attribution's clock; about nothing on the device clock, 0.17 ms a CPU decode step)
        own = float(att.get("lmprof_ms_per_step") or 0.0)
        mean = sum(prof) / len(prof) - own if prof else None
        self.check_close(f"{pre}profiled blocks add up to the profiled step less lmprof's own hooks",
                         sum(float(b.get("profiled_ms") or 0) for b in blocks), mean, 0.01, "ms")
        self.check_equal(f"{pre}attribution clock", att.get("clock"), "device" if self.ctx.cuda else "cpu")
        by_name: dict[str, float] = {}
        for b in blocks:
            by_name[b["name"]] = by_name.get(b["name"], 0.0) + float(b.get("time_ms") or 0)
        for name in ("idle", "other"):
            share = 100 * by_name.get(name, 0.0) / total if total else None
            self.figure(f"{pre}share of the step in '{name}'", share, "%", "derived", "sum of its rows over all rows")
        flagged = [f"{b['name']} ({b['phase']})" for b in blocks if b.get("uncertain")]
        self.figure(f"{pre}blocks off their stopwatch", len(flagged), "count", "measured", ", ".join(flagged[:12]))

    def device_time_adds_up(self, run: dict[str, Any], trace: Path | None, label: str) -> None:
        """Device-clock blocks (all rows but idle) against the device work the trace file holds per
        profiled step, summed event by event; one stream, so a sum is the busy time (CUDA only)."""
        if trace is None or not self.ctx.cuda:
            self.check(f"{label}: device time in blocks vs the trace file's kernels", None, "ms", "within 2%", None,
                       cuda_only=True)
            return
        busy = sum(float(b.get("profiled_ms") or 0) for b in run.get("blocks", []) if b.get("name") != "idle")
        self.check_close(f"{label}: device time in blocks vs the trace file's kernels", busy,
                         trace_counts(trace)["device_ms_per_step"], 0.02, "ms",
                         note="kernels, copies and memsets launched in the profiled steps, summed")

    def keep_trace(self, folder: Path, label: str) -> Path | None:
        """Copy the run's trace to traces/ when under 2 MB; else remember it for small_traces."""
        trace = folder / "trace.json.gz"
        if not trace.is_file():
            traces = sorted(folder.glob("rank*/trace.json.gz"))
            if not traces:
                self.figure(f"{label} trace", None, "B", "measured", "no trace.json.gz in the run folder")
                return None
            trace = traces[0]
        size = trace.stat().st_size
        self.figure(f"{label} trace size", size, "B", "measured", "gzip")
        if size < SMALL_TRACE:
            dest = self.ctx.out / "traces" / f"lmprof_{self.dev}_{label}.json.gz"
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dest, trace.read_bytes())
            self.rec.files.append(str(dest.relative_to(self.ctx.out)))
        else:
            self.ctx.big_traces.append((label, trace))
        return trace

    def analyze(self, trace: Path | None, label: str) -> dict[str, Any] | None:
        """``lmprof analyze --json`` of a trace: it reads lmprof's own trace; its kernel count against the file's."""
        if trace is None:
            return None
        cmd = self.lmprof(["analyze", str(trace), "--json", "--include-last-step"], label=f"analyze-{label}",
                          must=False, timeout=120)
        self.check_equal(f"analyze {label}: exit code", cmd.rc, 0)
        if cmd.rc != 0:
            return None
        text = self.read(cmd)
        write_atomic(self.ctx.out / "analyze" / f"{label}.json", text)
        try:
            data: dict[str, Any] = json.loads(text)
            dev = data["traces"][0]["device"] or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self.check(f"analyze {label}: JSON", None, "", "parses", False, note=repr(exc)[:200])
            return None
        counts = trace_counts(trace)
        k = (dev.get("kernels") or {}).get("count")
        self.figure(f"{label}: device events (analyze)", k, "count", "measured", "kernels, copies, memsets analysed")
        self.figure(f"{label}: device events (trace file)", counts["device_events"], "count", "measured",
                    "events of cat kernel, gpu_memcpy, gpu_memset")
        self.figure(f"{label}: device idle", (dev.get("temporal") or {}).get("idle_pct"), "%", "measured")
        if self.ctx.cuda:
            self.check(f"analyze {label}: device events found", k, "count",
                       f"> 0 and <= {counts['device_events']} (the file's)",
                       k is not None and 0 < k <= counts["device_events"])
        return data


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    """End a command's process group (it was started in a session of its own): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return None


# ----------------------------------------------------------------------------------------------- steps
VERSIONS_PY = r"""
import importlib, importlib.metadata as md, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import torch
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(device_name=p.name, device_memory_bytes=int(p.total_memory), sm_count=p.multi_processor_count,
                   capability=f"{p.major}.{p.minor}", cudnn=str(torch.backends.cudnn.version()),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
except Exception as exc:
    out["torch_error"] = repr(exc)[:300]
for dist in ("triton", "transformers", "numpy", "pandas", "pydantic", "typer", "rich", "nvidia-ml-py", "msgspec", "orjson"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
try:
    import lmprof.cli.main
    from lmprof.version import __version__
    out.update(lmprof=__version__, lmprof_path=lmprof.__file__)
except Exception as exc:
    out["lmprof_error"] = repr(exc)[:300]
for mod in ("lmprof.trace.kineto.scan", "lmprof.trace.scan"):  # where the C reader's switch lives (it moved)
    try:
        out["lmprof_native_reader"] = bool(importlib.import_module(mod).NATIVE)
        break
    except Exception:
        continue
unmet = []
try:
    from packaging.requirements import Requirement
    for line in md.requires("lmprof") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": "hf"}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{req.name}: missing")
            continue
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req.name} {have} (lmprof asks {req.specifier})")
except Exception as exc:
    unmet.append(f"could not check: {exc!r}"[:300])
out["requirements_unmet"] = unmet
print(json.dumps(out))
"""


def step_env(s: StepRun) -> None:
    env = s.ctx.out / "env"
    env.mkdir(parents=True, exist_ok=True)
    smi = s.run(["nvidia-smi", "-q"], "nvidia-smi", must=False, timeout=30)
    if smi.rc == 0:
        write_atomic(env / "nvidia-smi-q.txt", s.read(smi))
    q = s.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,pci.bus_id",
               "--format=csv,noheader"], "nvidia-smi-query", must=False, timeout=30)
    if q.rc == 0 and s.read(q).strip():
        parts = [p.strip() for p in s.read(q).splitlines()[0].split(",")]
        s.ctx.env_info.update(zip(("smi_name", "driver", "smi_memory", "power_limit", "pci_bus_id"), parts))
    freeze = s.python(["-m", "pip", "freeze", "--all"], "pip-freeze", must=False, timeout=60)
    write_atomic(env / "pip-freeze.txt", s.read(freeze))
    v = s.python(["-c", VERSIONS_PY], "versions", timeout=120)
    info = json.loads(s.read(v).strip().splitlines()[-1])
    s.ctx.env_info.update(info)
    write_atomic(env / "versions.json", json.dumps(s.ctx.env_info, indent=2))
    for key in ("device_name", "driver", "torch", "torch_cuda", "cudnn", "nccl", "triton", "transformers", "python",
                "lmprof", "lmprof_native_reader"):
        s.figure(key, s.ctx.env_info.get(key), "", "reported")
    s.check("lmprof imports", info.get("lmprof"), "", "imports", "lmprof_error" not in info, note=info.get("lmprof_error", ""))
    unmet = info.get("requirements_unmet") or []
    s.check("lmprof's requirements met", len(unmet), "count", "= 0", not unmet, note="; ".join(unmet))
    s.check("torch sees CUDA", info.get("cuda_available"), "", "= True", info.get("cuda_available") is True,
            note=info.get("torch_error", ""), cuda_only=True)
    if s.ctx.cuda and info.get("cuda_available") is not True:
        raise StepFailed("torch sees no CUDA device: every CUDA step would fail")


def hand_model_flops(model: dict[str, Any], batch: int, seq: int) -> float:
    """PaLM appendix B / nanoGPT's estimate_mfu for the built-in GPT: B·T·(6N + 12·L·d·T), N the
    non-embedding parameters (position embeddings out, the tied token embedding in), counted by hand:
    per layer 12d² + 13d (qkv 3d²+3d, proj d²+d, fc 4d²+4d, proj 4d²+d, two layer norms 4d)."""
    L, d, V = int(model["n_layer"]), int(model["n_embd"]), int(model["vocab_size"])
    n = L * (12 * d * d + 13 * d) + V * d + 2 * d
    return batch * seq * (6 * n + 12 * L * d * seq)


# The commands, each built in one place: the steps run them, small_traces runs them again smaller.
SMALL_STEPS = ("--steps", "2", "--warmup", "2", "--profile-steps", "1")


def train_args(s: StepRun, out: Path, compiled: bool, steps: tuple[str, ...], *extra: str) -> list[str]:
    return ["train", *s.sh.train, "--dtype", "bf16", "--attention", "sdpa", *(["--compile"] if compiled else []),
            *steps, *extra, "--device", s.dev, "--no-report", "--out", str(out)]


def lesson_args(s: StepRun, out: Path, n_layer: int, new_tokens: int, steps: tuple[str, ...]) -> list[str]:
    return ["infer", "--hf-config", "gpt2", "--n-layer", str(n_layer), "--new-tokens", str(new_tokens),
            "--prompt", "The future of artificial intelligence is", *steps, "--device", s.dev, "--no-report",
            "--out", str(out)]


def graphs_args(s: StepRun, out: Path, new_tokens: int, steps: tuple[str, ...], *extra: str) -> list[str]:
    return ["infer", *s.sh.graphs, "--new-tokens", str(new_tokens), "--compile", "--compile-mode", "reduce-overhead",
            *steps, *extra, "--device", s.dev, "--no-report", "--out", str(out)]


def user_args(s: StepRun, out: Path, label: str, steps: tuple[str, ...], script_args: tuple[str, ...]) -> list[str]:
    """``lmprof run`` of scripts/gpu_user_{train,generate}.py (label user_train, user_generate, ddp_nccl)."""
    infer = label == "user_generate"
    script = "scripts/gpu_user_generate.py" if infer else "scripts/gpu_user_train.py"
    return ["run", *(["--infer"] if infer else []), *steps, "--no-report", "--out", str(out), script,
            "--device", s.dev, *(["--ddp"] if label == "ddp_nccl" else []), *script_args]


def check_train_figures(s: StepRun, run: dict[str, Any]) -> None:
    cfg = run.get("config", {})
    step = s.metric(run, "step_time")
    s.metric(run, "tokens_per_s")
    flops = s.metric(run, "flops.model_per_step")
    hand = hand_model_flops(cfg["model"], int(cfg["batch_size"]), int(cfg["seq_len"]))
    s.check_close("model FLOPs per step vs B·T·(6N+12LdT) by hand", flops, hand, 0.01, "FLOP")
    peak = s.metric(run, "peak.flops")
    sheet = card_peak(str(run.get("env", {}).get("device_name") or ""))
    s.check_close("peak FLOP/s vs the card's datasheet dense bf16", peak, sheet, 0.01, "FLOP/s", cuda_only=True)
    mfu = s.metric(run, "mfu")
    s.check_min("MFU (nanoGPT-class)", mfu, MFU_TARGET_PCT, "%", cuda_only=True)
    if step and sheet:
        s.figure("MFU by hand", 100 * hand / (step / 1e3) / sheet, "%", "derived",
                 "hand FLOPs / clean step time / datasheet dense bf16 peak")
    s.metric(run, "profiler_overhead")
    s.metric(run, "profiled_step_time")
    smi = s.ctx.env_info.get("driver")  # nvidia-smi's driver_version (the env step)
    s.check_equal("env.driver (NVML) vs nvidia-smi's driver_version", run.get("env", {}).get("driver"), smi,
                  cuda_only=True)


def step_train_compiled(s: StepRun) -> None:
    out = s.folder("train_compiled")
    s.lmprof(train_args(s, out, True, s.sh.train_steps))
    folder, run = s.run_folder(out)
    s.ctx.runs["train_compiled"] = folder
    check_train_figures(s, run)
    s.blocks_add_up(run, "step_time")
    for name in ("compile.time", "compile.compilations"):
        s.metric(run, name)
    s.check_equal("compile.graph_breaks", s.metric(run, "compile.graph_breaks"), 0, "count")
    s.check_equal("compile.recompiles", s.metric(run, "compile.recompiles"), 0, "count")
    fused = run.get("tables", {}).get("fused_kernels") or []
    s.figure("fused kernels", len(fused), "count", "measured", "tables.fused_kernels rows")
    s.check("compiled_kernels.json written", (folder / "compiled_kernels.json").is_file(), "", "exists",
            (folder / "compiled_kernels.json").is_file())
    s.analyze(s.keep_trace(folder, "train_compiled"), "train_compiled")


def step_infer_lesson(s: StepRun) -> None:
    out = s.folder("infer_lesson")
    n_layer, new = s.sh.infer_layers, s.sh.new_tokens
    s.lmprof(lesson_args(s, out, n_layer, new, s.sh.infer_steps))
    folder, run = s.run_folder(out)
    s.ctx.runs["infer_lesson"] = folder
    for name in ("ttft", "tpot", "decode_tokens_per_s", "e2e_latency", "prefill.mfu", "decode.mbu", "profiler_overhead",
                 "kv_cache"):
        s.metric(run, name)
    calls = {o["name"]: 0.0 for o in run.get("ops", [])}
    for o in run.get("ops", []):
        calls[o["name"]] += float(o.get("calls") or 0)
    # Hugging Face GPT-2's four Conv1D layers per block are addmm; one per generated token (prefill included)
    s.check_equal("aten::addmm calls per generation (ops table)", calls.get("aten::addmm"), float(n_layer * 4 * new),
                  "count", note=f"{n_layer} layers x 4 linears x {new} tokens")
    s.check_equal("aten::mm calls per generation (lm_head)", calls.get("aten::mm"), float(new), "count")
    trace = s.keep_trace(folder, "infer_gpt2")
    if trace is not None:
        c = trace_counts(trace)
        steps = max(1, c["profiler_steps"])
        s.check_equal("aten::addmm events in the trace file per profiled generation",
                      c["ops"].get("aten::addmm", 0) / steps, float(n_layer * 4 * new), "count")
        s.figure("kernels in the trace", c["kernels"], "count", "measured")
        s.figure("distinct kernel names", c["kernel_names"], "count", "measured")
        s.check("every kernel named", c["kernels_unnamed"], "count", "= 0 unnamed, > 0 kernels",
                c["kernels_unnamed"] == 0 and c["kernels"] > 0, cuda_only=True)
    s.blocks_add_up(run, "e2e_latency")
    s.device_time_adds_up(run, trace, "infer_gpt2")
    check_memory(s, run)
    s.analyze(trace, "infer_gpt2")


def check_memory(s: StepRun, run: dict[str, Any]) -> None:
    measured = s.metric(run, "memory.peak")
    estimated = s.metric(run, "memory.estimated.peak")
    s.check_close("measured peak memory vs the estimate", measured, estimated, MEMORY_TOLERANCE, "B",
                  note="issue 51 asks within 5%")


def step_train_eager(s: StepRun) -> None:
    out = s.folder("train_eager")
    s.lmprof(train_args(s, out, False, s.sh.train_steps))
    folder, run = s.run_folder(out)
    s.ctx.runs["train_eager"] = folder
    check_train_figures(s, run)
    s.blocks_add_up(run, "step_time")
    check_memory(s, run)
    for row in run.get("tables", {}).get("memory") or []:
        s.figure(f"memory {row.get('category')}: measured - estimate", row.get("diff_pct"), "%", "derived",
                 f"measured {row.get('measured_bytes')} B, estimated {row.get('estimated_bytes')} B")
    snap = folder / (run.get("files", {}).get("memory_snapshot") or "memory_snapshot.pickle")
    s.check("CUDA memory snapshot written", snap.is_file(), "", "exists", snap.is_file(), cuda_only=True)
    if snap.is_file():
        cmd = s.lmprof(["analyze", str(snap), "--json"], "analyze-snapshot", must=False, timeout=60)
        s.check_equal("analyze of the snapshot: exit code", cmd.rc, 0)
        if cmd.rc == 0:
            rep = json.loads(s.read(cmd))
            write_atomic(s.ctx.out / "analyze" / "train_eager_snapshot.json", s.read(cmd))
            dev = (rep.get("devices") or [{}])[0]
            peak = dev.get("peak_allocated_bytes")
            s.figure("snapshot: peak allocated (replayed history)", peak, "B", "measured")
            s.check_close("snapshot peak vs memory.peak", peak,
                          (run["metrics"].get("memory.peak") or {}).get("value"), 0.02, "B",
                          note="the allocator's history replayed against its peak counter, same step")
    trace = s.keep_trace(folder, "train_eager")
    s.device_time_adds_up(run, trace, "train_eager")
    s.analyze(trace, "train_eager")


def nvml_reading(s: StepRun, polling: bool) -> float | None:
    cmd = s.python(["-m", "lmprof.measure.energy.nvml", "--seconds", "3", *(["--polling"] if polling else [])],
                   "nvml-polling" if polling else "nvml-counter", must=False, timeout=60)
    for line in s.read(cmd).splitlines():
        if " J over " in line and " = " in line:
            try:
                watts = float(line.split(" = ")[1].split()[0])
            except (ValueError, IndexError):
                continue
            s.figure(f"idle power, NVML {'power polling' if polling else 'energy counter'}", watts, "W", "measured",
                     line.strip())
            return watts
    s.figure(f"idle power, NVML {'polling' if polling else 'counter'}", None, "W", "measured",
             (s.read(cmd).strip() or cmd.stderr_tail.strip())[-300:])
    return None


def smi_power(s: StepRun) -> float | None:
    cmd = s.run(["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits"], "smi-power", must=False,
                timeout=30)
    try:
        watts = float(s.read(cmd).split()[0])
    except (ValueError, IndexError):
        return None
    s.figure("idle power, nvidia-smi power.draw", watts, "W", "reported")
    return watts


def step_energy(s: StepRun) -> None:
    before = smi_power(s)
    counter = nvml_reading(s, polling=False)
    polling = nvml_reading(s, polling=True)
    s.check_close("NVML counter vs power polling (idle)", counter, polling, 0.15, "W")
    s.check_close("NVML counter vs nvidia-smi power.draw (idle)", counter, before, 0.25, "W")
    limit = str(s.ctx.env_info.get("power_limit") or "").split()
    cap = float(limit[0]) if limit and limit[0].replace(".", "", 1).isdigit() else None
    for label, per in (("train_eager", "energy.per_step"), ("train_compiled", "energy.per_step"),
                       ("infer_lesson", "energy.per_generated_token")):
        folder = s.ctx.runs.get(label)
        if folder is None:
            s.figure(f"{label}: {per}", None, "", "derived", "that step did not leave a run")
            continue
        run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
        value = s.metric(run, per, f"{label}: {per}")
        s.check(f"{label}: {per} measured", value, "J", "not n/a", value is not None)
        avg = s.metric(run, "energy.power.avg", f"{label}: energy.power.avg")
        idle = s.metric(run, "energy.power.idle", f"{label}: energy.power.idle")
        other = "energy.per_token" if label.startswith("train") else "energy.per_generation"
        s.metric(run, other, f"{label}: {other}")
        if avg is not None and idle is not None:
            s.check(f"{label}: idle < average power <= power limit", avg, "W",
                    f"> {idle:.0f} W and <= {cap or 'n/a'} W", avg > idle and (cap is None or avg <= cap * 1.05))


def step_user_scripts(s: StepRun) -> None:
    ok = 0
    for label, steps, args, marker in (
        ("user_train", s.sh.run_train_steps, s.sh.user_train, "gpu_user_train: done"),
        ("user_generate", s.sh.run_infer_steps, s.sh.user_generate, "gpu_user_generate: done"),
    ):
        out = s.folder(label)
        cmd = s.lmprof(user_args(s, out, label, steps, args), label, must=False)
        s.check_equal(f"{label}: exit code (the script's)", cmd.rc, 0)
        s.check(f"{label}: the script's own stdout intact", marker in s.read(cmd), "", f"'{marker}' on stdout",
                marker in s.read(cmd))
        try:
            folder, run = s.run_folder(out)
        except StepFailed as exc:
            s.check(f"{label}: run folder", None, "", "written", False, note=str(exc))
            continue
        ok += 1
        s.ctx.runs[label] = folder
        s.check(f"{label}: device of the run", run.get("env", {}).get("device"), "", f"starts with {s.dev}",
                str(run.get("env", {}).get("device", "")).startswith(s.dev))
        s.blocks_add_up(run, "e2e_latency" if label == "user_generate" else "step_time", label)
        for name in ("step_time", "mfu", "memory.peak") if label == "user_train" else ("ttft", "tpot", "memory.peak"):
            s.metric(run, name, f"{label}: {name}")
        if label == "user_train":  # the script trains under bf16 autocast with fp32 weights
            cfg, note = run.get("config", {}), str(run.get("metrics", {}).get("mfu", {}).get("note") or "")
            s.check(f"{label}: dtype read off its forwards", (cfg.get("dtype"), cfg.get("param_dtype")), "",
                    "('bf16', 'fp32')", (cfg.get("dtype"), cfg.get("param_dtype")) == ("bf16", "fp32"), cuda_only=True)
            s.check(f"{label}: MFU against the bf16 peak", "peak bf16" in note, "", "'peak bf16' in the note",
                    "peak bf16" in note, note=note[:120], cuda_only=True)
        s.analyze(s.keep_trace(folder, label), label)
    if ok < 2:
        raise StepFailed(f"{2 - ok} of the two user scripts left no run")


def step_ddp_nccl(s: StepRun) -> None:
    out = s.folder("ddp_nccl")
    s.lmprof(user_args(s, out, "ddp_nccl", s.sh.run_train_steps, s.sh.user_train), "run-ddp")
    folder, run = s.run_folder(out)
    names = {(b["name"], b["phase"]) for b in run.get("blocks", [])}
    s.check("allreduce block in the backward", ("allreduce", "backward") in names, "", "present",
            ("allreduce", "backward") in names, note="DDP's gradient all-reduce, one rank")
    s.blocks_add_up(run, "step_time")
    trace = s.keep_trace(folder, "ddp_nccl")
    if trace is not None:
        c = trace_counts(trace)
        s.check_min("NCCL kernels in the trace", c["nccl_kernels"], 1, "count", cuda_only=True)
    data = s.analyze(trace, "ddp_nccl")
    if data is not None:
        comm = (data["traces"][0].get("device") or {}).get("communication") or {}
        s.figure("collectives (analyze)", comm.get("collectives"), "count", "measured")
    s.figure("lmprof train --nproc 1", "single process", "", "reported",
             "one rank never launches torchrun (pipeline/train.py: nproc > 1), so NCCL is exercised through a "
             "user script's one-rank DDP instead")


def step_infer_cuda_graphs(s: StepRun) -> None:
    out = s.folder("infer_cuda_graphs")
    s.lmprof(graphs_args(s, out, s.sh.graphs_tokens, s.sh.graphs_steps))
    folder, run = s.run_folder(out)
    for name in ("ttft", "tpot", "decode_tokens_per_s", "compile.time", "compile.compilations"):
        s.metric(run, name)
    s.check_equal("compile.recompiles", s.metric(run, "compile.recompiles"), 0, "count")
    s.check_equal("compile.after_warmup", s.metric(run, "compile.after_warmup"), 0, "count")
    s.blocks_add_up(run, "e2e_latency")
    decode = [b for b in run.get("blocks", []) if b.get("phase") == "decode"]
    busy = sum(float(b.get("profiled_ms") or 0) for b in decode if b["name"] != "idle")
    named = sum(float(b.get("profiled_ms") or 0) for b in decode if b["name"] not in ("idle", "other", "compiled_call"))
    share = 100 * named / busy if busy else None
    s.check_min("decode device time attributed to blocks", share, 80.0, "%", cuda_only=True,
                note="kernels replayed by CUDA graphs, outside idle; 'other' and compiled_call count against it")
    trace = s.keep_trace(folder, "infer_cuda_graphs")
    if trace is not None:
        s.check_min("cudaGraphLaunch calls in the trace", trace_counts(trace)["graph_launches"], 1, "count",
                    cuda_only=True)
    s.analyze(trace, "infer_cuda_graphs")


def step_oom_boundary(s: StepRun) -> None:
    """The fit check's largest batch against a bisection with real allocations (the rehearsal runs the
    same plumbing on the CPU, where 'out of memory' is faked past batch 6)."""
    preset, seq = s.sh.oom[1], s.sh.oom[3]
    base = ["--preset", preset, "--dtype", "bf16", "--attention", "sdpa", "-s", seq, "--device", s.dev, "--json"]
    fit = s.lmprof(["memory", *base, "-b", "8"], "fit-check")
    largest = json.loads(s.read(fit)).get("largest_batch")
    s.figure("fit check: largest batch", largest, "sequences", "estimated",
             f"{preset}, bf16 autocast, sdpa, seq {seq}, AdamW")
    if not isinstance(largest, int) or largest < 1:
        raise StepFailed(f"the fit check gave no largest batch ({largest!r})")
    limit = max(20.0, min(120.0, s.deadline - time.time() - 40))
    start = largest if s.ctx.cuda else 4
    cmd = s.python(["scripts/gpu_oom_boundary.py", *s.sh.oom, "--start", str(start), "--time-limit", f"{limit:.0f}",
                    "--device", s.dev, "--cpu-max-batch", "6"], "bisect", timeout=limit + 60)
    res = json.loads(s.read(cmd).strip().splitlines()[-1])
    write_atomic(s.ctx.out / "runs" / "oom_boundary.json", json.dumps(res, indent=2))
    real, oom = res.get("largest_ok"), res.get("smallest_oom")
    s.figure("real boundary: largest batch that ran", real, "sequences", "measured" if s.ctx.cuda else "reported",
             f"smallest that ran out of memory: {oom}; {len(res.get('probes', []))} probes, "
             f"{'exact' if res.get('exact') else 'not narrowed to one batch'}"
             + ("" if s.ctx.cuda else "; rehearsal: out of memory faked past batch 6"))
    s.check("bisection found the boundary", res.get("exact"), "", "largest ok + 1 = smallest out of memory",
            res.get("exact") is True)
    s.check("fit check does not promise more than fits", largest, "sequences", f"<= {real}",
            real is not None and largest <= real, cuda_only=True)
    s.check_min("fit check's largest batch / the real one", None if not real else largest / real, 0.85, "",
                note="conservative by less than 15%", cuda_only=True)
    if real:
        est = s.lmprof(["memory", *base, "-b", str(real)], "estimate-at-boundary")
        peak_est = json.loads(s.read(est)).get("peak")
        peak_meas = next((p.get("peak_bytes") for p in res.get("probes", []) if p.get("batch") == real and p.get("ok")),
                         None)
        s.figure("measured peak at the boundary", peak_meas, "B", "measured", "torch.cuda.max_memory_allocated, 2 steps")
        s.check_close("estimated peak at the boundary vs measured", peak_meas, peak_est, MEMORY_TOLERANCE, "B",
                      cuda_only=True)


def step_overhead(s: StepRun) -> None:
    cmd = s.python(["benchmarks/overhead.py", "--device", s.dev, *s.sh.overhead], "overhead")
    for line in s.read(cmd).splitlines()[1:]:
        parts = line.split()
        if len(parts) > 6 and parts[-1].endswith("]") and "%" in line:
            pct = next((p for p in parts if p.endswith("%")), None)
            if pct:
                s.figure(f"profiler overhead, preset {parts[0]}", float(pct.rstrip("%")), "%", "derived",
                         line.strip()[:200])
    # lmprof's cost to a user's decode loop in its clean window: its hooks, and a device sync at every forward's
    # end that a loop keeping its tokens on the device would not do (docs/user-code.md)
    cmd = s.python(["benchmarks/generation_overhead.py", "--device", s.dev, *s.sh.generation], "generation")
    for line in s.read(cmd).splitlines():
        found = re.search(r"([+-]\d+\.\d+)%", line)
        if found and ("stopwatch" in line or "reports" in line or "hooks off" in line):
            name = line.split("  ")[0] if "  " in line else line.split(":")[0]
            s.figure(f"generation loop, {name.strip()[:60]}", float(found.group(1)), "%", "measured", line.strip()[:200])


SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def step_calibrate(s: StepRun) -> None:
    """lmprof calibrate's lines ("  bf16 matmul  790.1 TFLOP/s  best n=8192, ...", "  memory  4.2 TB/s ...")."""
    cmd = s.lmprof(["calibrate", "--device", s.dev, *s.sh.calibrate, "--no-save"], "calibrate", ok_rc=(0, 1))
    refused = cmd.rc == 1
    for line in s.read(cmd).splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "matmul" and parts[3][:1] in SI and parts[3].endswith("FLOP/s"):
            value = float(parts[2].replace(",", "")) * SI[parts[3][: -len("FLOP/s")]]
            s.figure(f"{parts[0]} matmul, achieved", value, "FLOP/s", "measured",
                     ("refused by lmprof (noisy): " if refused else "") + " ".join(parts[4:]))
            sheet = card_peak(str(s.ctx.env_info.get("device_name") or "")) if parts[0] == "bf16" else None
            if sheet:
                s.figure("bf16 matmul achieved / datasheet peak", 100 * value / sheet, "%", "derived")
        elif len(parts) >= 3 and parts[0] == "memory" and parts[2].endswith("B/s") and parts[2][:-3] in SI:
            s.figure("copy bandwidth, achieved", float(parts[1].replace(",", "")) * SI[parts[2][:-3]], "B/s", "measured",
                     ("refused by lmprof (noisy): " if refused else "") + " ".join(parts[3:]))
    if refused:
        s.figure("calibration refused", cmd.stderr_tail.strip().splitlines()[-1][:300], "", "reported")


def step_small_traces(s: StepRun) -> None:
    """Re-run, with fewer layers, each configuration whose trace was over 2 MB: traces for tests/data."""
    todo = list(dict.fromkeys(label for label, _ in s.ctx.big_traces))
    s.figure("configurations with traces over 2 MB", ", ".join(todo) or "none", "", "reported")
    n = s.sh.small_layers
    layers = ("--n-layer", str(n))
    short_user = (*layers, "--steps", "8")
    small: dict[str, Callable[[Path], list[str]]] = {
        "train_compiled": lambda out: train_args(s, out, True, SMALL_STEPS, *layers),
        "train_eager": lambda out: train_args(s, out, False, SMALL_STEPS, *layers),
        "infer_gpt2": lambda out: lesson_args(s, out, n, 8, SMALL_STEPS),
        "infer_cuda_graphs": lambda out: graphs_args(s, out, 16, SMALL_STEPS, *layers),
        "user_train": lambda out: user_args(s, out, "user_train", ("--steps", "3", "--warmup", "2", "--profile-steps",
                                                                   "1"), short_user),
        "user_generate": lambda out: user_args(s, out, "user_generate", s.sh.run_infer_steps,
                                               (*layers, "--new-tokens", "8", "--generations", "12")),
        "ddp_nccl": lambda out: user_args(s, out, "ddp_nccl", ("--steps", "3", "--warmup", "2", "--profile-steps", "1"),
                                          short_user),
    }
    for label in todo:
        if label not in small or s.deadline - time.time() < 30:
            s.figure(f"{label}: small trace", None, "", "measured",
                     "no smaller re-run for it" if label not in small else "no time left")
            continue
        out = s.folder(f"small_{label}")
        cmd = s.lmprof(small[label](out), f"small-{label}", must=False)
        if cmd.rc == 0:
            folder, _run = s.run_folder(out)
            s.keep_trace(folder, f"{label}_{n}layer")


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    fn: Callable[[StepRun], None]
    needs_cuda: bool
    min_s: float  # skipped when less than this is left of the budget
    timeout_s: float  # the step's own limit
    checks: tuple[str, ...]  # what it checks, in words (the plan and the docs)


# The order is the issue's, most valuable first: a budget that runs short cuts the tail. Seconds: the
# least left for a step to start, and its own limit (the GPU's sizes; a CPU rehearsal has the budget).
STEPS: tuple[Step, ...] = (
    Step("env", "Machine and versions", step_env, False, 10, 120,
         ("nvidia-smi -q, pip freeze, torch/CUDA/driver/NCCL versions", "lmprof imports; its requirements are met",
          "torch sees the GPU")),
    Step("train_compiled", "GPT-2 training, bf16, sdpa, torch.compile", step_train_compiled, False, 90, 280,
         ("MFU >= 40% of the card's dense bf16 peak", "peak = the datasheet's; model FLOPs = 6N+12LdT by hand",
          "blocks add up to the step (device clock)", "no graph breaks or recompiles", "profiler overhead")),
    Step("infer_lesson", "The lesson: infer --hf-config gpt2 --new-tokens 50", step_infer_lesson, False, 30, 180,
         ("2,400 aten::addmm and 50 aten::mm per generation (ops table and trace file)", "every kernel named",
          "blocks add up to the generation", "peak memory within 5% of the estimate")),
    Step("train_eager", "GPT-2 training, bf16, sdpa, eager: memory", step_train_eager, False, 40, 240,
         ("peak memory within 5% of the estimate", "CUDA memory snapshot written and read (its peak = memory.peak)",
          "blocks add up; stopwatch per block")),
    Step("energy", "NVML energy: counter, polling, idle baseline", step_energy, True, 15, 90,
         ("counter vs polling idle power within 15%", "vs nvidia-smi within 25%", "J/step and J/token measured",
          "idle < average power <= power limit")),
    Step("user_scripts", "lmprof run of a user's training and generate scripts", step_user_scripts, False, 45, 240,
         ("exit code and stdout of the script kept", "profiled window completed, on the device", "blocks add up")),
    Step("oom_boundary", "Fit check vs the real out-of-memory boundary", step_oom_boundary, False, 45, 200,
         ("fit check's largest batch <= the real one, within 15%", "estimated peak at the boundary within 5%")),
    Step("infer_cuda_graphs", "infer --compile --compile-mode reduce-overhead (CUDA graphs)", step_infer_cuda_graphs,
         False, 70, 270, ("no recompiles after warm-up", "graph launches in the trace",
                          ">= 80% of decode device time attributed to blocks")),
    Step("ddp_nccl", "One-rank DDP on NCCL under lmprof run", step_ddp_nccl, False, 30, 180,
         ("allreduce block in the backward", "NCCL kernels in the trace", "analyze reads the collectives")),
    Step("overhead", "Profiler overhead per preset (benchmarks/overhead.py)", step_overhead, False, 40, 180,
         ("clean vs profiled step, tiny/small/gpt2", "a decode loop in the clean window vs plain (benchmarks/generation_overhead.py)")),
    Step("calibrate", "Measured matmul and copy ceilings (lmprof calibrate --no-save)", step_calibrate, False, 15, 60,
         ("achieved bf16/tf32 FLOP/s and bandwidth",)),
    Step("small_traces", "Small traces for tests/data (fewer layers)", step_small_traces, False, 30, 200,
         ("a trace under 2 MB of each configuration whose trace was larger",)),
)


# ----------------------------------------------------------------------------------------------- summary
def step_status(rec: StepRecord) -> str:
    if any(c.ok is False for c in rec.checks):
        return "fail"
    return "pass"


def summary_dict(ctx: Context | None, records: list[StepRecord], args: argparse.Namespace, plan: bool) -> dict[str, Any]:
    counts = {s: sum(1 for r in records if r.status == s) for s in STATUSES}
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mode": "plan" if plan else "run",
        "device": args.device,
        "budget_s": float(args.budget),
        "wall_s": round(time.time() - ctx.started, 1) if ctx else 0.0,
        "setup": ctx.setup if ctx else {},
        "env": ctx.env_info if ctx else {},
        "counts": counts,
        "steps": [asdict(r) for r in records],
    }


def validate_summary(d: Any, fixed_steps: bool = True) -> list[str]:
    """What is wrong with a summary.json (empty when it follows lmprof.gpu_check/1); ``fixed_steps``:
    also that its steps are this script's, in order (False reads the summary of another version)."""
    errs: list[str] = []
    if not isinstance(d, dict):
        return ["not an object"]
    if d.get("schema") != SCHEMA:
        errs.append(f"schema is {d.get('schema')!r}")
    for key, typ in (("created", str), ("mode", str), ("device", str), ("budget_s", float), ("wall_s", float),
                     ("setup", dict), ("env", dict), ("counts", dict), ("steps", list)):
        if not isinstance(d.get(key), typ):
            errs.append(f"{key}: expected {typ.__name__}")
    names = [s.name for s in STEPS]
    steps = d.get("steps") or []
    if fixed_steps and [s.get("name") for s in steps if isinstance(s, dict)] != names:
        errs.append("steps are not the fixed list, in order")
    for s in steps:
        if not isinstance(s, dict):
            errs.append("a step is not an object")
            continue
        where = s.get("name")
        if s.get("status") not in STATUSES:
            errs.append(f"{where}: status {s.get('status')!r}")
        if s.get("status") in ("error", "timeout", "skipped") and not s.get("reason"):
            errs.append(f"{where}: {s.get('status')} without a reason")
        for f in s.get("figures", []):
            if set(f) != {"name", "value", "unit", "source", "note"} or f["source"] not in SOURCES:
                errs.append(f"{where}: figure {f.get('name')!r} malformed")
        for c in s.get("checks", []):
            if set(c) != {"name", "value", "unit", "threshold", "ok", "note"} or c["ok"] not in (True, False, None):
                errs.append(f"{where}: check {c.get('name')!r} malformed")
        for c in s.get("commands", []):
            if not isinstance(c.get("argv"), list) or not isinstance(c.get("wall_s"), float):
                errs.append(f"{where}: command malformed")
    counts = d.get("counts") or {}
    if isinstance(counts, dict) and sum(counts.values()) != len(steps):
        errs.append("counts do not add up to the steps")
    return errs


def bundle_name_ok(name: str) -> bool:
    """The device tool brings back only names of letters, digits, '.', '_' and '-'."""
    return bool(name) and all(ch.isalnum() or ch in "._-" for ch in name) and name.isascii()


def write_outputs(ctx: Context, records: list[StepRecord], args: argparse.Namespace, plan: bool) -> None:
    """summary.json and summary.md under --out; the bundle (at most five flat files) under --bundle."""
    d = summary_dict(ctx, records, args, plan)
    text = json.dumps(d, indent=2, default=str)
    md = markdown(d)
    write_atomic(ctx.out / "summary.json", text)
    write_atomic(ctx.out / "summary.md", md)
    if ctx.bundle is None or ctx.bundle == ctx.out:
        return
    write_atomic(ctx.bundle / "summary.json", text)
    write_atomic(ctx.bundle / "summary.md", md)
    smi = ctx.out / "env" / "nvidia-smi-q.txt"
    if smi.is_file():
        write_atomic(ctx.bundle / "nvidia-smi-q.txt", smi.read_bytes())
    write_atomic(ctx.bundle / "results.tar.gz", pack(ctx.out, traces=False, leave=ctx.bundle))
    traces = pack(ctx.out, traces=True, leave=ctx.bundle)
    if traces:
        write_atomic(ctx.bundle / "traces.tar", traces)


def say(*args: Any, **kw: Any) -> None:
    """print, flushed, that survives a closed stdout or stderr (`| head`): the check goes on and its
    summary is still written."""
    try:
        print(*args, **kw, flush=True)
    except OSError:
        pass


def save(ctx: Context, records: list[StepRecord], args: argparse.Namespace) -> None:
    """write_outputs during a run: a full disk or a vanished bundle folder is said, and the check goes on."""
    try:
        write_outputs(ctx, records, args, plan=False)
    except OSError as exc:
        say(f"gpu_check: could not write the summary or bundle: {exc}", file=sys.stderr)


def pack(out: Path, traces: bool, leave: Path | None = None) -> bytes:
    """A tar of --out: the small traces alone (traces=True, uncompressed: they are gzip already), or
    everything else under 2 MB a file (run folders without their traces, logs, env, analyze); never
    what is under ``leave`` (the bundle itself, when it lies inside --out)."""
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w" if traces else "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            rel = p.relative_to(out)
            if not p.is_file() or p.is_symlink() or rel.parts[0] == "cache" or p.name.startswith("."):
                continue
            if leave is not None and (p == leave or leave in p.parents):
                continue
            in_traces = rel.parts[0] == "traces"
            if in_traces != traces or (not traces and p.name.endswith(".json.gz")):
                continue
            size = p.stat().st_size
            if size >= SMALL_TRACE or total + size > BUNDLE_FILE_MAX:
                continue
            tar.add(p, arcname=str(rel))
            total += size
    return buf.getvalue() if total or not traces else b""


# ----------------------------------------------------------------------------------------------- main
def run_step(ctx: Context, step: Step, rec: StepRecord) -> None:
    left = ctx.left()
    if left < step.min_s:
        rec.status, rec.reason = "skipped", f"budget: {left:.0f} s left, the step needs {step.min_s:.0f} s"
        return
    t0 = time.monotonic()
    s = StepRun(ctx, rec, time.time() + min(step.timeout_s * ctx.shapes.timeout_scale, left))
    try:
        step.fn(s)
        rec.status = step_status(rec)
        if rec.status == "fail":
            rec.reason = "; ".join(c.name for c in rec.checks if c.ok is False)
    except TimeoutError as exc:
        rec.status, rec.reason = "timeout", str(exc)
    except StepFailed as exc:
        rec.status, rec.reason = "error", str(exc)
    except Exception as exc:  # a bug of this script or an unexpected output: recorded, the check goes on
        rec.status, rec.reason = "error", f"{type(exc).__name__}: {exc}"[:500]
    rec.wall_s = round(time.monotonic() - t0, 2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (the check) or cpu (the rehearsal: smaller models, CUDA-only steps skipped)")
    ap.add_argument("--budget", type=float, default=540.0,
                    help="seconds for everything, set-up included when gpu_check.sh started the clock "
                         "(default 540: one 10-minute device command with room to spare)")
    ap.add_argument("--out", default=None, help="a new folder for every output (default /tmp/lmprof-gpu-check-<time>)")
    ap.add_argument("--bundle", default=os.environ.get("OUT") or None,
                    help="folder that receives the few files to bring back (default $OUT when set)")
    ap.add_argument("--only", default="", help="comma-separated steps to run (the others are skipped)")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip")
    ap.add_argument("--plan", action="store_true", help="list the steps and write a planned summary; run nothing")
    ap.add_argument("--python", default=None, help="the Python that runs lmprof (default: this one)")
    ap.add_argument("--lmprof-cmd", default=None, help="the lmprof command (default: PYTHON -m lmprof)")
    args = ap.parse_args(argv)
    if args.budget <= 0:
        ap.error("--budget must be positive")
    args.out = args.out or f"/tmp/lmprof-gpu-check-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
    names = {s.name for s in STEPS}
    for opt in ("only", "skip"):
        chosen = [n for n in getattr(args, opt).split(",") if n]
        bad = [n for n in chosen if n not in names]
        if bad:
            ap.error(f"--{opt}: unknown step(s) {', '.join(bad)}; steps: {', '.join(s.name for s in STEPS)}")
        setattr(args, opt, set(chosen))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = Context(args)
    # A fresh folder each time: run folders of an earlier check would be read as this one's.
    if ctx.out.exists() and (not ctx.out.is_dir() or any(ctx.out.iterdir())):
        say(f"gpu_check: --out {ctx.out} exists and is not an empty folder: give a new one", file=sys.stderr)
        return 2
    try:
        ctx.out.mkdir(parents=True, exist_ok=True)
        if ctx.bundle is not None:
            ctx.bundle.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        say(f"gpu_check: cannot create {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    # gpu_check.sh's record of the set-up (which Python, wheels, the build of lmprof, its import, seconds)
    ctx.setup = {k[len(SETUP_PREFIX):].lower(): v for k, v in sorted(os.environ.items()) if k.startswith(SETUP_PREFIX)}
    records = [StepRecord(s.name, s.title, s.needs_cuda, "planned") for s in STEPS]
    if args.plan:
        for i, (step, rec) in enumerate(zip(STEPS, records), 1):
            say(f"{i:2d}. {step.name:18s} {'CUDA' if step.needs_cuda else 'any ':4s} needs {step.min_s:3.0f} s, "
                  f"at most {step.timeout_s:3.0f} s  {step.title}")
            for what in step.checks:
                rec.checks.append(Check(what, None, "", "", None, "planned"))
        write_outputs(ctx, records, args, plan=True)
        return 0

    def on_signal(signum: int, _frame: Any) -> None:
        # A command runs in a session of its own (so a timeout ends all of it): Ctrl-C does not reach it.
        if ctx.child is not None:
            stop(ctx.child)
        running = next((r for r in records if r.status == "planned"), None)
        if running is not None:
            running.status, running.reason = "error", f"interrupted by signal {signum} (a command was running)"
        save(ctx, records, args)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    say(f"gpu_check: {len(STEPS)} steps on {args.device}, budget {args.budget:.0f} s, out {ctx.out}")
    for i, (step, rec) in enumerate(zip(STEPS, records), 1):
        if (args.only and step.name not in args.only) or step.name in args.skip:
            rec.status, rec.reason = "skipped", "not selected (--only/--skip)"
        elif step.needs_cuda and not ctx.cuda:
            rec.status, rec.reason = "skipped", "needs CUDA"
        else:
            run_step(ctx, step, rec)
        bad = [c for c in rec.checks if c.ok is False]
        say(f"[{i:2d}/{len(STEPS)}] {step.name:18s} {rec.status:8s} {rec.wall_s:7.1f} s  "
              f"{rec.reason[:160] if rec.status != 'pass' else f'{len(rec.checks)} checks'}")
        for c in bad[:6]:
            say(f"        fail: {c.name}: {c.value} {c.unit} (asked {c.threshold}) {c.note[:100]}")
        save(ctx, records, args)
    d = summary_dict(ctx, records, args, False)
    say(brief(d), end="")
    counts = ", ".join(f"{n} {st}" for st, n in d["counts"].items() if n)
    say(f"gpu_check: {counts} in {time.time() - ctx.started:.0f} s; {ctx.out / 'summary.md'}"
          + (f", bundle {ctx.bundle}" if ctx.bundle and ctx.bundle != ctx.out else ""))
    return 0 if all(r.status in ("pass", "skipped") for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
