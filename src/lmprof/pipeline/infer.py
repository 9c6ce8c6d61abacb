"""``lmprof infer``: prefill and decode, timed apart, then profiled and attributed per block.

Greedy decoding with a fixed number of new tokens (no early stop on EOS), for a batch of prompts.
TTFT is the prefill including the first token's choice; TPOT is each later token's step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch
from pydantic import field_validator

from lmprof.analysis.attribution import attribute
from lmprof.errors import ConfigError
from lmprof.hardware.devices import Device, resolve_device
from lmprof.measure.profiling import profile_steps
from lmprof.pipeline.config import MeasureSpec, ModelSpec
from lmprof.analysis.memory_estimate import estimate_memory
from lmprof.measure.memory import measure_inference_memory
from lmprof.pipeline.costs import add_costs
from lmprof.pipeline.memory import add_memory
from lmprof.measure.energy import EnergyMonitor
from lmprof.pipeline.train import DTYPES, add_energy, assemble_run, measured_window, run_folder
from lmprof.record.run import Metric, Run
from lmprof.trace.load import load_trace
from lmprof.workloads.blocks import model_scopes, step_scope
from lmprof.workloads.decoding import Decoder, decoder_for
from lmprof.workloads.gpt import GPT, preset
from lmprof.workloads.shape import ModelShape


class InferConfig(ModelSpec, MeasureSpec):
    """Everything ``lmprof infer`` needs."""

    prompt: str | None = None
    prompt_len: int = 32
    batch_size: int = 1
    new_tokens: int = 50
    kv_cache: bool = True
    steps: int = 5
    warmup: int = 1
    profile_steps: int = 1
    out: str = "runs"

    @field_validator("new_tokens")
    @classmethod
    def _new(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"new tokens must be positive, got {v}")
        return v

    @field_validator("batch_size", "prompt_len")
    @classmethod
    def _pos(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be positive, got {v}")
        return v


@dataclass
class InferWorkload:
    """What runs: a decoder over a model, the prompt batch and where it runs."""

    model: torch.nn.Module
    decoder: Decoder
    prompt: torch.Tensor
    new_tokens: int
    device: Device
    shape: ModelShape | None = None
    tokenizer: Any = None
    scopes: Callable[[], ContextManager[object]] | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Generation:
    prefill_s: float
    decode_s: list[float]
    tokens: torch.Tensor


def generate(work: InferWorkload, clock: Callable[[], float] = time.perf_counter) -> Generation:
    """One greedy generation, timed: device synced after the prefill and after every decode step."""
    sync = work.device.synchronize
    prompt = work.prompt
    max_len = prompt.size(1) + work.new_tokens - 1  # the last new token is never fed back
    sync()
    t0 = clock()
    with step_scope("prefill"):
        logits = work.decoder.start(prompt, max_len)
        token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    sync()
    prefill = clock() - t0
    tokens, decode = [token], []
    for _ in range(work.new_tokens - 1):
        t = clock()
        with step_scope("decode"):
            logits = work.decoder.step(token)
            token = logits.argmax(dim=-1, keepdim=True)
        sync()
        decode.append(clock() - t)
        tokens.append(token)
    return Generation(prefill, decode, torch.cat(tokens, dim=1))


def measure_inference(work: InferWorkload, spec: MeasureSpec, out_dir: Path, config: dict[str, Any]) -> Run:
    """The measurement protocol for inference; writes the trace into ``out_dir`` and returns the Run."""
    B, T, n = work.prompt.size(0), work.prompt.size(1), work.new_tokens
    monitor = EnergyMonitor.for_device(work.device, spec.energy, tdp_w=spec.tdp_w, idle_s=spec.idle_s)
    with torch.inference_mode():
        monitor.measure_idle()
        for _ in range(spec.warmup):
            generate(work)
        gens: list[Generation] = []
        _, energy = measured_window(lambda: gens.append(generate(work)), spec.steps, work.device.synchronize, monitor)
        out_dir.mkdir(parents=True, exist_ok=True)
        memory = measure_inference_memory(lambda: generate(work), work.model, work.device, out_dir=out_dir)
        if memory.kv_cache is None:
            memory.kv_cache = work.decoder.cache_bytes()  # the cache is created inside the run
        cache_bytes = work.decoder.cache_bytes()
        prof = profile_steps(
            lambda: generate(work), work.device.torch_device, out_dir / "trace.json.gz",
            active=spec.profile_steps, around=work.scopes,
        )
    att = attribute(load_trace(prof.trace_path))
    ms = 1e3
    e2e = [(g.prefill_s + sum(g.decode_s)) * ms for g in gens]
    metrics: dict[str, Metric] = {
        "ttft": Metric.from_samples([g.prefill_s * ms for g in gens], "ms", "measured",
                                    note=f"prefill of {B} x {T} prompt tokens and the first token's choice"),
        "e2e_latency": Metric.from_samples(e2e, "ms", "measured", note=f"{n} new tokens per sequence"),
        "prefill_tokens_per_s": Metric.from_samples([B * T / g.prefill_s for g in gens], "tokens/s", "derived"),
    }
    if n > 1:
        metrics["tpot"] = Metric.from_samples([d * ms for g in gens for d in g.decode_s], "ms", "measured",
                                              note="time per output token after the first, all decode steps")
        metrics["decode_tokens_per_s"] = Metric.from_samples(
            [B * (n - 1) / sum(g.decode_s) for g in gens], "tokens/s", "derived", note="batch x tokens / decode time")
    else:
        metrics["tpot"] = Metric.na("ms", "one new token: no decode step after the prefill")
    clean = metrics["e2e_latency"].value or 0.0
    profiled = att.mean_step_us / 1e3
    metrics["profiled_e2e_latency"] = Metric.from_samples([s / 1e3 for s in att.step_us], "ms", "measured")
    metrics["profiler_overhead"] = Metric(
        value=100.0 * (profiled - clean) / clean if clean else None, unit="%", source="derived",
        note="profiled vs clean generation; block times are scaled to the clean generation")
    metrics["params"] = Metric(value=sum(p.numel() for p in work.model.parameters()), unit="count", source="measured")
    if profiled < clean:
        work.notes.append("the profiled phase ran faster than the clean one: run-to-run noise is larger than the "
                          "profiler's overhead here (a busy machine?); compare spreads before trusting small differences")
    if work.shape is not None:
        dtype_bytes = next(work.model.parameters()).element_size()
        s = work.shape
        # The last new token is never fed back, so the cache ends holding prompt + new - 1 tokens.
        est = 2 * s.n_layer * s.kv_heads * s.head_dim * (T + n - 1) * B * dtype_bytes
        metrics["kv_cache.estimated"] = Metric(
            value=est if config.get("kv_cache", True) else 0, unit="B", source="estimated",
            note="2 x layers x kv_heads x head_dim x (prompt + new tokens - 1) x batch x bytes")
    if cache_bytes is not None:
        metrics["kv_cache"] = Metric(value=cache_bytes, unit="B", source="measured",
                                     note="bytes of the cache tensors after the last generation")
    run = assemble_run("infer", work.device, out_dir, config, metrics, att, clean, prof, work.notes, energy)
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        next(work.model.parameters()).dtype, "fp32")
    attention = "sdpa" if any(b.name == "attn.sdpa" for b in run.blocks) else "math"
    add_costs(run, out_dir, work.shape, batch=B, seq_len=T, dtype=dtype, attention=attention, decode_tokens=n - 1,
              plots=spec.plots)
    if energy is not None:  # after the FLOP counts, so FLOP/J can be derived
        per_gen = [run.value(f"{p}.flops.model_per_step") for p in ("prefill", "decode")]
        flops = sum(f for f in per_gen if f) * len(gens) if all(per_gen) else None
        add_energy(run, energy, steps=len(gens), tokens=B * n * len(gens), flops=flops,
                   step_unit="generation", token_unit="generated token")
    estimate = None
    if work.shape is not None:
        estimate = estimate_memory(work.shape, batch=B, seq_len=T, mode="infer", dtype=dtype, param_dtype=dtype,
                                   attention=attention, device_kind=work.device.kind,  # type: ignore[arg-type]
                                   new_tokens=n - 1 if config.get("kv_cache", True) else 0)
    add_memory(run, out_dir, memory, estimate, plots=spec.plots, title=f"{config.get('hf') or config.get('preset') or config.get('model_name')}, "
               f"batch {B}, prompt {T} + {n} new tokens, {dtype}, {work.device}")
    run.tables["generation"] = [_generation_row(work, gens[-1].tokens, i) for i in range(min(B, 4))]
    return run


def _generation_row(work: InferWorkload, tokens: torch.Tensor, i: int) -> dict[str, Any]:
    row: dict[str, Any] = {"sequence": i, "new_token_ids": tokens[i].tolist()}
    if work.tokenizer is not None:
        row["prompt"] = work.tokenizer.decode(work.prompt[i].tolist())
        row["output"] = work.tokenizer.decode(tokens[i].tolist())
    return row


def _prompt_ids(cfg: InferConfig, tokenizer: Any, vocab: int, notes: list[str]) -> torch.Tensor:
    if cfg.prompt is not None:
        if not cfg.prompt:
            raise ConfigError("the prompt is empty")
        if tokenizer is not None:
            ids = tokenizer(cfg.prompt)["input_ids"]
        else:
            ids = [b % vocab for b in cfg.prompt.encode("utf-8")]
            notes.append("no tokenizer with this model: the prompt was encoded as UTF-8 bytes (one token per byte)")
        row = torch.tensor(ids, dtype=torch.long)
        return row.unsqueeze(0).repeat(cfg.batch_size, 1)
    gen = torch.Generator().manual_seed(cfg.seed)
    return torch.randint(vocab, (cfg.batch_size, cfg.prompt_len), generator=gen)


def build_workload(cfg: InferConfig, device: Device) -> tuple[InferWorkload, dict[str, Any]]:
    """The model (built-in, Hugging Face or config), its decoder and the prompt batch."""
    from lmprof.workloads import hf as hfmod
    from lmprof.workloads.hooks import module_scopes

    dtype = DTYPES[cfg.dtype]
    notes: list[str] = []
    tokenizer = None
    scopes: Callable[[], ContextManager[object]] | None = None
    described: dict[str, Any] = {}
    if cfg.hf and cfg.hf_config:
        raise ConfigError("give either --hf or --hf-config, not both")
    if cfg.hf or cfg.hf_config:
        loaded = hfmod.load(cfg.hf, dtype, cfg.download) if cfg.hf else hfmod.from_config(cfg.hf_config, dtype, cfg.seed)
        model, tokenizer = loaded.model, loaded.tokenizer
        context = hfmod.context_length(model)
        shape = hfmod.shape_of(model)
        vocab = int(model.config.vocab_size)
        described = {"model_name": loaded.name, "model_source": loaded.source, "model_type": model.config.model_type,
                     # what the model really runs (transformers' choice), not lmprof's built-in default
                     "attention": getattr(model.config, "_attn_implementation", None) or "unknown"}
        hooked = model
        scopes = lambda: module_scopes(hooked)  # noqa: E731 - hooks only while the profiler runs
    else:
        gcfg = preset(cfg.preset, n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
                      block_size=cfg.block_size, vocab_size=cfg.vocab_size, dropout=cfg.dropout,
                      bias=cfg.bias, attention=cfg.attention)
        torch.manual_seed(cfg.seed)
        model = GPT(gcfg).to(dtype=dtype)
        model_scopes(True)  # process-wide: a compiled training run before this one turned them off
        context, shape, vocab = gcfg.block_size, gcfg.shape(), gcfg.vocab_size
        described = {"model": gcfg.to_dict()}
    model = model.to(device.torch_device).eval()
    prompt = _prompt_ids(cfg, tokenizer, vocab, notes).to(device.torch_device)
    if context is not None and prompt.size(1) + cfg.new_tokens > context:
        raise ConfigError(
            f"prompt of {prompt.size(1)} tokens + {cfg.new_tokens} new tokens exceeds the model's context of {context}")
    decoder, dnotes = decoder_for(model, cfg.kv_cache, dtype)
    notes += dnotes
    if cfg.compile:
        raise ConfigError("--compile is not supported for inference yet")
    work = InferWorkload(model, decoder, prompt, cfg.new_tokens, device, shape, tokenizer, scopes, notes)
    described["prompt_tokens"] = prompt.size(1)
    return work, described


def run_inference(cfg: InferConfig, out_dir: Path | None = None) -> tuple[Run, Path]:
    """Profile greedy generation; returns the Run and the folder it was saved in."""
    device = resolve_device(cfg.device)
    work, described = build_workload(cfg, device)
    folder = out_dir or run_folder(cfg.out, "infer", cfg.label(), device)
    config = cfg.model_dump()
    config.update(described, seq_len=work.prompt.size(1), device_resolved=str(device))
    if cfg.hf or cfg.hf_config:
        config["hf"] = cfg.hf or cfg.hf_config
    run = measure_inference(work, cfg, folder, config)
    run.save(folder)
    return run, folder
