"""Distributed training profiles: torchrun launches the ranks, each rank profiles itself, rank 0
assembles one run folder with per-rank figures.

Layout of a distributed run folder::

    <run>/run.json            rank 0's record plus per-rank figures (tables["ranks"], straggler)
    <run>/rank0/, rank1/ ...  each rank's own run.json, blocks.csv, ops.csv, trace.json.gz
"""
from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

from lmprof.config import TrainConfig
from lmprof.errors import DataError, LmprofError
from lmprof.hardware.devices import resolve_device
from lmprof.pipeline.protocol.folder import run_folder
from lmprof.modes import traits
from lmprof.record.catalogue import SLOWEST_RANK, STRAGGLER, WORLD_SIZE, pick
from lmprof.record.run import Metric, Run
from lmprof.workloads.builders import train_workload

DEFAULT_TIMEOUT_S = 300  # collectives give up after this: no rank hangs forever


def world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def is_distributed() -> bool:
    return world()[2] > 1


def init(device_kind: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the process group: nccl on CUDA, gloo on CPU, with a timeout on every collective."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    _, local_rank, _ = world()
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=timeout_s))
    if os.environ.get("LMPROF_FAKE_RANK_CRASH") == str(world()[0]):
        raise RuntimeError("simulated crash (LMPROF_FAKE_RANK_CRASH testing hook)")


def wrapper(parallel: str, device_kind: str, local_rank: int) -> Callable[[torch.nn.Module], torch.nn.Module]:
    """How a rank wraps its model: DDP replicas, or FSDP2 shards (every layer, then the root)."""
    if parallel == "fsdp":
        def shard(model: torch.nn.Module) -> torch.nn.Module:
            from torch.distributed.fsdp import fully_shard

            for layers in (m for m in model.modules() if isinstance(m, torch.nn.ModuleList)):
                for layer in layers:
                    fully_shard(layer)
            fully_shard(model)
            return model

        return shard
    from torch.nn.parallel import DistributedDataParallel

    ids = [local_rank] if device_kind == "cuda" else None
    return lambda m: DistributedDataParallel(m, device_ids=ids)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def end_rank_process(code: int) -> None:
    """Leave a ``lmprof run`` rank with ``code`` once its run is written, without Python's finalization.

    Every collective's work object keeps the thread-local state it was issued under
    (``at::ThreadLocalState``), Python objects included: torch's own ``backward()`` stashes one there
    (a ``contextvars.Context``), so every DDP all-reduce carries one, and a dispatch mode on at the time
    (lmprof's FlopCounterMode in the figures step) is another. Dropping those needs the GIL. At
    interpreter exit the process group is torn down by whatever drops it last (the script's DDP
    module, its reducer), and ``~ProcessGroupGloo`` joins gloo's worker threads; if a worker is still
    freeing a work then, it waits for the GIL the joining thread holds (a deadlock), or, once
    finalization has begun, it is ended inside a C++ destructor (an abort). So the rank leaves the way
    Python's exit would, minus finalization: the script's other non-daemon threads are waited for, the
    atexit handlers run, stdio is flushed, and the process ends with the script's own exit code; gloo's
    threads end with it, never joined.
    """
    import threading

    from lmprof.pipeline.protocol.ending import exit_now

    for t in threading.enumerate():  # what Python's exit waits for before its atexit handlers
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    exit_now(code)


def torchrun_command(nproc: int, lmprof_argv: Sequence[str]) -> list[str]:
    """The command line that runs ``lmprof <lmprof_argv>`` on ``nproc`` local ranks."""
    return [sys.executable, "-m", "lmprof.pipeline.torchrun_agent", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "lmprof", *lmprof_argv]


# How long torchrun gets to stop its ranks after SIGTERM before it is killed outright.
STOP_GRACE_S = 20.0


def run_torchrun(cmd: list[str], env: dict[str, str], timeout_s: float | None,
                 capture: bool) -> subprocess.CompletedProcess[str]:
    """Run a torchrun command; on a timeout or Ctrl-C stop it so that its ranks stop too.

    torchrun starts each rank in a session of its own, so killing torchrun outright (what
    ``subprocess.run`` does on a timeout) leaves the ranks running, holding cores or GPUs. SIGTERM
    makes torchrun stop its ranks first; only if it has not exited after ``STOP_GRACE_S`` is it
    killed. The exception (``subprocess.TimeoutExpired`` or ``KeyboardInterrupt``) is raised again.
    """
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(cmd, env=env, stdout=pipe, stderr=pipe, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:  # TimeoutExpired, KeyboardInterrupt
        proc.terminate()
        try:
            proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def launch(argv: Sequence[str], nproc: int, run_dir: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> Run:
    """Run ``lmprof train <argv>`` on ``nproc`` ranks through torchrun; return the assembled Run."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(nproc, ["train", *argv, "--run-dir", str(run_dir)])
    env = dict(os.environ, LMPROF_DIST_TIMEOUT=str(timeout_s))
    try:
        proc = run_torchrun(cmd, env, timeout_s + 120, capture=True)
    except subprocess.TimeoutExpired:
        raise LmprofError(f"distributed run did not finish within {timeout_s + 120:.0f} s and was stopped "
                          f"(its ranks too)") from None
    if proc.returncode != 0:
        raise LmprofError(failure_message(proc.stdout + proc.stderr, proc.returncode))
    return Run.load(run_dir)


def failure_message(output: str, code: int) -> str:
    """One line naming the failed rank and its last error, from torchrun's output."""
    user: list[str] = re.findall(r"lmprof: error: (.+)", output)  # one group: a list of str
    if user:
        return user[-1]
    rank = re.search(r"rank\s*:\s*(\d+)", output) or re.search(r"\[rank(\d+)\]", output)
    errors = [ln.strip() for ln in output.splitlines() if re.match(r"\s*(\[rank\d+\]:\s*)?\w*(Error|Exception)\b", ln)]
    # A rank that crashes takes the others down with "peer closed" errors from gloo/NCCL; those come
    # last in the output, but the cause is the crashing rank's own error.
    collateral = ("gloo", "nccl", "remote worker", "connection closed", "connection reset", "broken pipe")
    causes = [ln for ln in errors if not any(c in ln.lower() for c in collateral)]
    last = (causes or errors)[-1] if errors else f"exit code {code}"
    last = re.sub(r"^\[rank\d+\]:\s*", "", last)
    where = f"rank {rank.group(1)}" if rank else "a rank"
    return f"distributed run failed on {where}: {last}"


def assemble(run_dir: Path, world_size: int) -> Run:
    """Rank 0: merge every rank's record into ``run_dir/run.json`` with per-rank figures."""
    runs = [Run.load(run_dir / f"rank{r}") for r in range(world_size)]
    base = runs[0].model_copy(deep=True)
    # what a rank's time is: a clean training step, or one whole generation (inference runs)
    key, what = pick("timing", base.mode).name, traits(base.mode).unit
    throughput = pick("throughput", base.mode).name
    rows = []
    times: list[float] = []
    for r, run in enumerate(runs):
        st = run.metrics.get(key)
        if st is None or st.value is None:
            raise DataError(f"{run_dir / f'rank{r}'}: the rank's run has no {key} figure; cannot compare ranks")
        times.append(st.value)
        allreduce = sum(b.time_ms for b in run.blocks if b.name == "allreduce")
        rows.append({"rank": r, f"{key}_ms": st.value, "p10_ms": st.p10, "p90_ms": st.p90,
                     "allreduce_ms": allreduce, throughput: run.value(throughput)})
    slowest = max(range(world_size), key=lambda r: times[r])
    fastest = min(times)
    base.tables["ranks"] = rows
    base.metrics[WORLD_SIZE] = Metric(value=world_size, unit="count", source="measured")
    base.metrics[SLOWEST_RANK] = Metric(value=slowest, unit="rank", source="measured",
                                        note=f"rank with the highest median clean {what} time")
    base.metrics[STRAGGLER] = Metric(
        value=100.0 * (times[slowest] - fastest) / fastest if fastest else None, unit="%", source="derived",
        note=f"slowest rank's median {what} time vs the fastest rank's")
    tps = [t for t in (run.value(throughput) for run in runs) if t is not None]
    if len(tps) == len(runs):  # every rank knows its tokens/s
        base.metrics[pick("global_throughput", base.mode).name] = Metric(
            value=sum(tps), unit="tokens/s", source="derived",
            note=f"sum over ranks of each rank's median {throughput.replace('_', ' ').replace(' per s', '/s')}")
    if any(run.watch is not None for run in runs):  # the ranks watched their steps: merged, and compared
        from lmprof.analysis.watch_ranks import merge_watch

        base.watch = merge_watch(run_dir, runs, step_s=times[0] / 1e3)
    base.files = {k: f"rank0/{v}" for k, v in base.files.items() if k not in ("blocks", "ops")}
    base.files["traces"] = "rank*/trace.json.gz"
    base.notes.append(f"distributed: {world_size} ranks; blocks and operators are rank 0's, per-rank figures in tables['ranks']")
    base.id = run_dir.name
    base._folder = run_dir  # noqa: SLF001 - the record lives in this folder
    base.save(run_dir)
    return base


Measure = Callable[..., Run]


def run_rank(cfg: TrainConfig, run_dir: Path | None, measure: Measure) -> tuple[Run, Path]:
    """One rank of a DDP/FSDP training profile (inside torchrun): profile this rank, rank 0 assembles.

    ``measure`` is the training protocol (pipeline.train.measure_training), passed in so the launcher
    and the protocol do not import each other.
    """
    import torch.distributed as tdist


    rank, local_rank, world_size = world()
    base = resolve_device(cfg.device)
    device = resolve_device(f"cuda:{local_rank}") if base.kind == "cuda" else base
    init(device.kind, float(os.environ.get("LMPROF_DIST_TIMEOUT", DEFAULT_TIMEOUT_S)))
    try:
        if run_dir is None:  # launched by the user's own torchrun: rank 0 names the folder
            box = [str(run_folder(cfg.out, "train", f"{cfg.label()}-ddp{world_size}", device)) if rank == 0 else None]
            tdist.broadcast_object_list(box, src=0)
            named = box[0]
            assert named is not None, "rank 0 broadcasts the run folder's name"
            run_dir = Path(named)
        rank_cfg = cfg.model_copy(update={"seed": cfg.seed + rank})  # each rank its own data
        work, described = train_workload(rank_cfg, device, wrap=wrapper(cfg.parallel, device.kind, local_rank))
        if cfg.parallel == "fsdp":
            work.notes.append("FSDP: parameters are sharded; memory.params/grads/optimizer count this rank's shards")
        config = cfg.model_dump() | described | {"seq_len": work.seq_len, "device_resolved": str(device), "rank": rank, "world_size": world_size}
        folder = run_dir / f"rank{rank}"
        run = measure(work, cfg, folder, config)
        run.save(folder)
        barrier()
        if rank == 0:
            run = assemble(run_dir, world_size)
        barrier()
        return run, run_dir
    finally:
        shutdown()
