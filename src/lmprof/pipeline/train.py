"""``lmprof train``: workload -> clean timing -> profiled phase -> attribution -> run record.

:func:`measure_training` is model-agnostic (the built-in GPT, a Hugging Face model or a user's
module all come in as a :class:`TrainWorkload`); :func:`run_training` builds the built-in GPT from a
:class:`TrainConfig` and calls it.
"""
from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import yaml

from lmprof.analysis.attribution import Attribution, attribute
from lmprof.errors import ConfigError
from lmprof.hardware.devices import Device, environment, resolve_device
from lmprof.measure.energy import EnergyMonitor, energy_metrics
from lmprof.measure.profiling import profile_steps
from lmprof.measure.timing import time_calls, warm_up
from lmprof.pipeline.config import DEFAULT_SEQ_LEN, MeasureSpec, TrainConfig
from lmprof.analysis.memory_estimate import estimate_memory
from lmprof.measure.memory import measure_training_memory
from lmprof.pipeline.costs import add_costs
from lmprof.pipeline.memory import add_memory
from lmprof.record.run import Block, Env, Metric, Run
from lmprof.trace.load import load_trace
from lmprof.workloads.blocks import model_scopes, step_scope
from lmprof.workloads.data import CharDataset, SyntheticBatches
from lmprof.workloads.gpt import GPT, GPTConfig, preset
from lmprof.workloads.shape import ModelShape

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainWorkload:
    """What runs: a model, its optimizer, a batch source and how to get a loss from a batch."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator[Any]
    device: Device
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    tokens_per_step: int | None = None
    shape: ModelShape | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    attention: str = "math"
    optimizer_name: str = "adamw"
    dropout: float = 0.0
    describe: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Entered for the profiled phase only: module hooks that place block scopes in foreign models.
    scopes: Callable[[], contextlib.AbstractContextManager[Any]] | None = None


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a tensor, or tuples/lists/dicts of tensors, to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def autocast_for(device: Device, dtype: str) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """Mixed precision as users run it: fp32 parameters, 16-bit matmuls under torch.autocast."""
    if dtype == "fp32":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.kind, dtype=DTYPES[dtype])


class TrainStep:
    """One training step with a scope around each part. Calling it runs a step and syncs the device."""

    def __init__(self, work: TrainWorkload, dtype: str):
        self.work = work
        self.amp = autocast_for(work.device, dtype)
        self.scaler = torch.amp.GradScaler("cuda") if (dtype == "fp16" and work.device.kind == "cuda") else None
        self._loss: torch.Tensor | None = None

    def __call__(self) -> None:
        w = self.work
        with step_scope("data"):
            batch = to_device(next(w.batches), w.device.torch_device)
        with step_scope("forward"):
            with self.amp():
                loss = w.loss_fn(w.model, batch)
        with step_scope("backward"):
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        with step_scope("optimizer"):
            if self.scaler:
                self.scaler.step(w.optimizer)
                self.scaler.update()
            else:
                w.optimizer.step()
        with step_scope("zero_grad"):
            w.optimizer.zero_grad(set_to_none=True)
        self._loss = loss.detach()
        w.device.synchronize()  # the step ends when the device is done (also under the profiler)

    def last_loss(self) -> float | None:
        """The last step's loss; reading it syncs, so call it only outside timed regions."""
        return None if self._loss is None else float(self._loss.float().item())


def measured_window(
    fn: Callable[[], object], steps: int, sync: Callable[[], None], monitor: EnergyMonitor
) -> tuple[list[float], Any]:
    """Time ``steps`` calls of ``fn`` with the energy window around exactly those calls.

    When a meter needs a longer window than ``steps`` give, more steps are timed (never fewer).
    Returns the per-call seconds and the EnergyResult (None when energy is off).
    """
    if monitor.mode == "off":
        return time_calls(fn, steps, sync), None
    if monitor.available:
        probe = time_calls(fn, 1, sync)[0]  # one step's length decides how many reach the window
        steps += monitor.extra_steps(step_s=probe, steps=steps)
    sync()
    monitor.begin()
    samples = time_calls(fn, steps, sync)
    result = monitor.end()
    monitor.close()
    return samples, result


def blocks_from(att: Attribution, clean_step_ms: float) -> list[Block]:
    """Attribution parts as Block rows, scaled so they add up to the clean step time."""
    total = att.total_us() or 1.0
    scale = clean_step_ms / (total / 1e3)
    rows = []
    for p in sorted(att.parts, key=lambda p: (p.phase, -p.us)):
        ms = p.us / 1e3
        rows.append(
            Block(name=p.name, phase=p.phase, time_ms=ms * scale, profiled_ms=ms, pct=100.0 * p.us / total, calls=round(p.calls))
        )
    return rows


def run_folder(out: str | Path, mode: str, label: str, device: Device) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{stamp}-{mode}-{label}-{device.kind}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def measure_training(
    work: TrainWorkload,
    spec: MeasureSpec,
    out_dir: Path,
    config: dict[str, Any],
) -> Run:
    """The measurement protocol for training; writes the trace into ``out_dir`` and returns the Run."""
    torch.manual_seed(spec.seed)
    step = TrainStep(work, spec.dtype)
    sync = work.device.synchronize
    monitor = EnergyMonitor.for_device(work.device, spec.energy, tdp_w=spec.tdp_w, idle_s=spec.idle_s)
    monitor.measure_idle()  # before warm-up: a device stays clocked up for a while after work
    warm_up(step, spec.warmup, sync)
    samples, energy = measured_window(step, spec.steps, sync, monitor)
    out_dir.mkdir(parents=True, exist_ok=True)
    memory = measure_training_memory(step, work.model, work.optimizer, work.device, out_dir=out_dir)
    prof = profile_steps(step, work.device.torch_device, out_dir / "trace.json.gz", active=spec.profile_steps, around=work.scopes)
    att = attribute(load_trace(prof.trace_path))
    loss = step.last_loss()

    step_ms = [s * 1e3 for s in samples]
    metrics: dict[str, Metric] = {"step_time": Metric.from_samples(step_ms, "ms", "measured")}
    clean = metrics["step_time"].value or 0.0
    profiled = att.mean_step_us / 1e3
    metrics["profiled_step_time"] = Metric.from_samples([s / 1e3 for s in att.step_us], "ms", "measured")
    metrics["profiler_overhead"] = Metric(
        value=100.0 * (profiled - clean) / clean if clean else None,
        unit="%",
        source="derived",
        note="profiled step time vs clean step time; block times are scaled to the clean step",
    )
    if work.tokens_per_step:
        tps = [work.tokens_per_step / s for s in samples]
        metrics["tokens_per_s"] = Metric.from_samples(tps, "tokens/s", "derived")
        metrics["tokens_per_step"] = Metric(value=work.tokens_per_step, unit="tokens", source="measured")
    metrics["params"] = Metric(value=sum(p.numel() for p in work.model.parameters()), unit="count", source="measured")
    if profiled < clean:
        work.notes.append("the profiled phase ran faster than the clean one: run-to-run noise is larger than the "
                          "profiler's overhead here (a busy machine?); compare spreads before trusting small differences")
    if loss is not None:
        metrics["loss"] = Metric(value=loss, unit="nats/token", source="measured", note="last profiled step")
    run = assemble_run("train", work.device, out_dir, config, metrics, att, clean, prof, work.notes, energy)
    estimate = None
    if work.shape is not None and work.batch_size and work.seq_len:
        estimate = estimate_memory(work.shape, batch=work.batch_size, seq_len=work.seq_len, dtype=spec.dtype,
                                   attention=work.attention, optimizer=work.optimizer_name, device_kind=work.device.kind,
                                   dropout=work.dropout)  # type: ignore[arg-type]
    title = f"{config.get('preset') or config.get('model_name', 'model')}, batch {work.batch_size}, seq {work.seq_len}, {spec.dtype}, {work.device}"
    add_memory(run, out_dir, memory, estimate, title, plots=spec.plots)
    if work.batch_size and work.seq_len:
        add_costs(run, out_dir, work.shape, batch=work.batch_size, seq_len=work.seq_len, dtype=spec.dtype,
                  attention=work.attention, plots=spec.plots)  # type: ignore[arg-type]
    if energy is not None:  # after the FLOP counts, so FLOP/J can be derived
        n = len(samples)
        flops = run.value("flops.model_per_step")
        add_energy(run, energy, steps=n, tokens=(work.tokens_per_step or 0) * n or None,
                   flops=flops * n if flops else None)
    return run


def add_energy(run: Run, energy: Any, **totals: Any) -> None:
    """Energy figures over the measured window (totals: steps, tokens, FLOPs in that window)."""
    run.metrics.update(energy_metrics(energy, **totals))
    run.notes.extend([energy.explanation(), *energy.warnings])


def assemble_run(
    mode: str, device: Device, out_dir: Path, config: dict[str, Any], metrics: dict[str, Metric],
    att: Attribution, clean_ms: float, prof: Any, notes: list[str], energy: Any,
) -> Run:
    """The Run record common to train and infer: env, blocks scaled to the clean time, ops, tables."""
    run = Run(
        id=out_dir.name,
        mode=mode,  # type: ignore[arg-type]
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        env=Env(**environment(device)),
        config=config,
        metrics=metrics,
        blocks=blocks_from(att, clean_ms),
        ops=prof.ops,
        notes=[*notes, *att.notes],
        files={"trace": "trace.json.gz"},
    )
    if energy is not None:
        run.tables["energy"] = energy.rows()
    run.tables["attribution"] = [
        {"clock": att.clock, "profiled_steps": att.steps, "profiled_step_ms": [s / 1e3 for s in att.step_us]}
    ]
    return run


Wrap = Callable[[torch.nn.Module], torch.nn.Module]


def build_workload(cfg: TrainConfig, device: Device, wrap: Wrap | None = None) -> tuple[TrainWorkload, dict[str, Any]]:
    """The model to train (built-in GPT or Hugging Face), its data and optimizer; plus config facts."""
    if cfg.hf and cfg.hf_config:
        raise ConfigError("give either --hf or --hf-config, not both")
    if cfg.hf or cfg.hf_config:
        return hf_workload(cfg, device, wrap)
    work, gcfg = gpt_workload(cfg, device, wrap)
    return work, {"model": gcfg.to_dict()}


def _optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)


def _maybe_compile(cfg: TrainConfig, model: torch.nn.Module, notes: list[str]) -> torch.nn.Module:
    if not cfg.compile:
        return model
    notes.append("torch.compile: fused kernels span sub-blocks, so time is attributed to forward/backward as a whole")
    return torch.compile(model)  # type: ignore[return-value]


def gpt_workload(cfg: TrainConfig, device: Device, wrap: Wrap | None = None) -> tuple[TrainWorkload, GPTConfig]:
    """The built-in GPT, its data and optimizer, for a TrainConfig (``wrap``: e.g. DDP)."""
    data = None
    vocab = cfg.vocab_size
    if cfg.data:
        seq_guess = cfg.seq_len or DEFAULT_SEQ_LEN.get(cfg.preset, 64)
        data = CharDataset(cfg.data, cfg.batch_size, seq_guess, seed=cfg.seed)
        vocab = data.vocab_size
    gcfg = preset(
        cfg.preset,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        block_size=cfg.block_size,
        vocab_size=vocab,
        dropout=cfg.dropout,
        bias=cfg.bias,
        attention=cfg.attention,
    )
    seq_len = cfg.seq_len or min(DEFAULT_SEQ_LEN.get(cfg.preset, 64), gcfg.block_size)
    if seq_len > gcfg.block_size:
        raise ConfigError(f"seq_len {seq_len} exceeds the model's block_size {gcfg.block_size}")
    batches: Iterator[Any] = data if data is not None else SyntheticBatches(gcfg.vocab_size, cfg.batch_size, seq_len, cfg.seed)
    torch.manual_seed(cfg.seed)
    model = GPT(gcfg).to(device.torch_device)
    model.train()
    notes: list[str] = []
    model_scopes(not cfg.compile)  # a compiled model guards on this flag: keep it constant
    fwd_model = _maybe_compile(cfg, wrap(model) if wrap else model, notes)

    def loss_fn(_: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return fwd_model(x, y)[1]

    work = TrainWorkload(
        model=model, optimizer=_optimizer(cfg, model), batches=batches, device=device, loss_fn=loss_fn,
        tokens_per_step=cfg.batch_size * seq_len, shape=gcfg.shape(), batch_size=cfg.batch_size, seq_len=seq_len,
        attention=gcfg.attention, optimizer_name=cfg.optimizer, dropout=gcfg.dropout, notes=notes,
    )
    return work, gcfg


def hf_workload(cfg: TrainConfig, device: Device, wrap: Wrap | None = None) -> tuple[TrainWorkload, dict[str, Any]]:
    """A Hugging Face causal LM (local, cached, or from a config) trained on synthetic tokens."""
    from lmprof.workloads import hf as hfmod
    from lmprof.workloads.hooks import module_scopes

    if cfg.data:
        raise ConfigError("--data trains the built-in GPT on characters; Hugging Face models train on synthetic tokens")
    loaded = (hfmod.load(cfg.hf, torch.float32, cfg.download) if cfg.hf
              else hfmod.from_config(cfg.hf_config, torch.float32, cfg.seed))  # fp32 master weights, autocast does the rest
    model = loaded.model.to(device.torch_device).train()
    context = hfmod.context_length(model) or 1024
    seq_len = cfg.seq_len or min(64, context)
    if seq_len > context:
        raise ConfigError(f"seq_len {seq_len} exceeds the model's context of {context}")
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    notes: list[str] = []
    fwd_model = _maybe_compile(cfg, wrap(model) if wrap else model, notes)

    def loss_fn(_: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, _y = batch
        return fwd_model(input_ids=x, labels=x).loss  # transformers shifts the labels itself

    work = TrainWorkload(
        model=model, optimizer=_optimizer(cfg, model),
        batches=SyntheticBatches(int(model.config.vocab_size), cfg.batch_size, seq_len, cfg.seed),
        device=device, loss_fn=loss_fn, tokens_per_step=cfg.batch_size * seq_len, shape=hfmod.shape_of(model),
        batch_size=cfg.batch_size, seq_len=seq_len, attention="sdpa" if impl != "eager" else "math",
        optimizer_name=cfg.optimizer, notes=notes,
        # Hooks would break a compiled graph: a compiled model is attributed as a whole.
        scopes=None if cfg.compile else (lambda: module_scopes(model)),
    )
    described = {"model_name": loaded.name, "model_source": loaded.source, "model_type": model.config.model_type,
                 "attention": impl, "hf": cfg.hf or cfg.hf_config}
    return work, described


def run_training(cfg: TrainConfig, out_dir: Path | None = None) -> tuple[Run, Path]:
    """Profile the built-in GPT's training step; returns the Run and the folder it was saved in.

    Under torchrun (WORLD_SIZE > 1) every rank profiles itself into ``<run>/rank<r>`` and rank 0
    assembles ``<run>/run.json``; with ``cfg.nproc > 1`` outside torchrun, this launches torchrun.
    """
    from lmprof.pipeline import distributed as dist

    if cfg.nproc > 1 and not dist.is_distributed():
        device = resolve_device(cfg.device)  # fail here, in one line, before starting ranks
        folder = out_dir or run_folder(cfg.out, "train", f"{cfg.label()}-ddp{cfg.nproc}", device)
        folder.mkdir(parents=True, exist_ok=True)
        spec = folder / "config.yaml"
        spec.write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        return dist.launch(["--config", str(spec)], cfg.nproc, folder), folder
    if dist.is_distributed():
        return _run_rank(cfg, out_dir)
    device = resolve_device(cfg.device)
    if cfg.dtype == "fp16" and device.kind == "cpu":
        raise ConfigError("fp16 training is not supported on CPU here: use bf16 or fp32")
    work, described = build_workload(cfg, device)
    folder = out_dir or run_folder(cfg.out, "train", cfg.label(), device)
    run = measure_training(work, cfg, folder, _config(cfg, described, work, device))
    run.save(folder)
    return run, folder


def _config(cfg: TrainConfig, described: dict[str, Any], work: TrainWorkload, device: Device) -> dict[str, Any]:
    config = cfg.model_dump()
    config.update(described, seq_len=work.seq_len, device_resolved=str(device))
    return config


def _run_rank(cfg: TrainConfig, run_dir: Path | None) -> tuple[Run, Path]:
    """One rank of a DDP training profile (inside torchrun)."""
    import os

    import torch.distributed as tdist

    from lmprof.pipeline import distributed as dist

    rank, local_rank, world_size = dist.world()
    base = resolve_device(cfg.device)
    device = resolve_device(f"cuda:{local_rank}") if base.kind == "cuda" else base
    dist.init(device.kind, float(os.environ.get("LMPROF_DIST_TIMEOUT", dist.DEFAULT_TIMEOUT_S)))
    try:
        if run_dir is None:  # launched by the user's own torchrun: rank 0 names the folder
            box = [str(run_folder(cfg.out, "train", f"{cfg.label()}-ddp{world_size}", device)) if rank == 0 else None]
            tdist.broadcast_object_list(box, src=0)
            run_dir = Path(box[0])  # type: ignore[arg-type]
        rank_cfg = cfg.model_copy(update={"seed": cfg.seed + rank})  # each rank its own data
        work, described = build_workload(rank_cfg, device, wrap=dist.wrapper(cfg.parallel, device.kind, local_rank))
        if cfg.parallel == "fsdp":
            work.notes.append("FSDP: parameters are sharded; memory.params/grads/optimizer count this rank's shards")
        config = _config(cfg, described, work, device) | {"rank": rank, "world_size": world_size}
        folder = run_dir / f"rank{rank}"
        run = measure_training(work, cfg, folder, config)
        run.save(folder)
        dist.barrier()
        if rank == 0:
            run = dist.assemble(run_dir, world_size)
        dist.barrier()
        return run, run_dir
    finally:
        dist.shutdown()
