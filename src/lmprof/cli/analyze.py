"""``lmprof analyze``: what a torch.profiler (Kineto) trace or an Nsight Systems export says about where the time went."""
from __future__ import annotations

from pathlib import Path

import typer

from lmprof.cli._analyze_run import run_analyze
from lmprof.cli.app import app


@app.command()
def analyze(
    path: Path = typer.Argument(
        ...,
        help="A trace (.json or .json.gz), an Nsight Systems export (.sqlite, or .nsys-rep with nsys on PATH), "
        "a folder with one trace per rank, or an lmprof run folder.",
        show_default=False,
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print JSON instead of tables (schema: docs/trace-analysis.md)."
    ),
    top: int = typer.Option(10, "--top", min=1, help="How many kernels and CPU operators to list."),
    export: Path = typer.Option(
        None,
        "--export",
        help="Also write SQL-ready Parquet tables (events, kernels, launches, ops, steps, collectives, "
        "critical_path) to this folder "
        "(columns: docs/trace-analysis.md; needs pyarrow).",
        show_default=False,
    ),
    diff: Path = typer.Option(
        None,
        "--diff",
        help="The trace before a change, compared with the PATH argument, the trace after it: "
        "`lmprof analyze --diff BEFORE AFTER`. "
        "Per annotation, operator and kernel: count and time deltas, new and vanished names.",
        show_default=False,
    ),
    include_last_step: bool = typer.Option(
        False,
        "--include-last-step",
        help="Keep device work launched in the last ProfilerStep (HTA leaves it out by default).",
    ),
    annotate: Path = typer.Option(
        None,
        "--annotate",
        help="Also write a copy of the trace with lmprof's findings added as tracks (steps with their "
        "phases, device idle gaps by cause, dead windows, memory counters) for Perfetto / chrome://tracing; "
        "gzipped when OUT ends in .gz.",
        show_default=False,
    ),
    blocks: Path = typer.Option(
        None,
        "--blocks",
        help="A YAML map of range name patterns to blocks ('\"Layer *\": layer'): device time, kernels and "
        "(with --model) FLOPs per block. Nsight Systems exports of llm.c or with lmprof scopes need none.",
        show_default=False,
    ),
    model: str = typer.Option(
        None,
        "--model",
        help="With --batch and --seq-len: FLOPs and achieved FLOP/s per block (a known model, a config.json "
        "or a model folder; `lmprof roofline --list-models`).",
        show_default=False,
    ),
    batch: int = typer.Option(None, "--batch", min=1, help="Sequences per step, for --model.", show_default=False),
    seq_len: int = typer.Option(None, "--seq-len", min=1, help="Tokens per sequence, for --model.", show_default=False),
    workers: int = typer.Option(
        None,
        "--workers",
        min=1,
        help="Processes that analyse a folder's traces, one trace each at a time (1: in this process). "
        "Default: one per core for folders of 16 MB of traces or more.",
        show_default=False,
    ),
    ray: bool = typer.Option(False, "--ray", help="Analyse a folder's traces as Ray tasks (a local Ray unless "
                             "--ray-address); the files must be readable at the same path on every node."),
    ray_address: str = typer.Option(
        None, "--ray-address", help="The Ray cluster for --ray (auto, ray://host:10001); implies --ray.",
        show_default=False,
    ),
    device: str = typer.Option(
        None,
        "--device",
        help="Place each operator of a record_shapes trace on this device's roofline (a100, h100, mi300x, "
        "...; `lmprof roofline --list-devices`). Default: the trace's deviceProperties name, when known.",
        show_default=False,
    ),
    sort: str = typer.Option(
        "inclusive",
        "--sort",
        help="Rank the memory table of a profile_memory=True trace by inclusive bytes (an operator's and "
        "everything it called, as torch's cpu_memory_usage) or self bytes (what it allocated itself): "
        "inclusive or self. --json holds both rankings (memory.top, memory.top_self).",
    ),
) -> None:
    """Analyse a torch.profiler trace or an Nsight Systems export: device time, idle causes, launches,
    top kernels/ops, blocks, ranks.

    Every figure is measured from the trace; device time follows HolisticTraceAnalysis's definitions
    (docs/trace-analysis.md). Works on CPU-only, ROCm and multi-rank traces.
    """
    # the work is in a module without typer, which the fast path of lmprof.cli.main calls too
    run_analyze(path, json_out=json_out, top=top, export=export, diff=diff, include_last_step=include_last_step,
                annotate=annotate, device=device, blocks=blocks, model=model, batch=batch, seq_len=seq_len,
                workers=workers, ray=ray_address or ("local" if ray else None), sort=sort, echo=typer.echo)
