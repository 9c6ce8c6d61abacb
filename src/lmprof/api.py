"""lmprof from Python, for models lmprof has never seen.

    import lmprof
    run = lmprof.profile_inference(model, input_ids, new_tokens=50)      # any causal LM nn.Module
    run = lmprof.profile_training(model, batches, optimizer, steps=10)   # any nn.Module + loss
    print(lmprof.summary(run)); run.save("runs/mine")

Block scopes come from module hooks (canonical names for GPT-2 / Llama-style models, module paths
otherwise), installed only while the profiler runs.
"""
from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from lmprof.counts import counts_for
from lmprof.errors import ConfigError
from lmprof.hardware.devices import Device, resolve_device
from lmprof.config import MeasureSpec, build
from lmprof.outdir import check_output_dir
from lmprof.record.run import Run


def _check_model(model: object, what: str) -> None:
    """One ConfigError line unless ``model`` is a torch module (None, a function or a name is said at once,
    not as an AttributeError from inside lmprof)."""
    if not isinstance(model, torch.nn.Module):
        got = "None" if model is None else f"a {type(model).__name__}"
        raise ConfigError(f"{what} needs the model as a torch.nn.Module, got {got}")


def _batches(batches: Iterable[Any]) -> Iterator[Any]:
    """The batches, cycled when a list or tuple. Running out is one ConfigError line: a StopIteration
    would escape the caller's call (or end a generator around it silently)."""
    source = itertools.cycle(batches) if isinstance(batches, (list, tuple)) else batches
    given = 0
    for batch in source:
        given += 1
        yield batch
    raise ConfigError("batches is empty: profile_training needs at least one batch" if given == 0 else
                      f"batches ran out after {given} batch(es): the run takes warm-up, timed and profiled steps "
                      "and more; pass a list (it is cycled) or an iterator that lasts")


def _device_of(model: torch.nn.Module, device: str | None) -> Device:
    if device is not None:
        return resolve_device(device)
    p = next(model.parameters(), None)
    return resolve_device(str(p.device) if p is not None else "cpu")


def _default_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """Call the model on the batch the obvious way and find the loss in what it returns."""
    if isinstance(batch, dict):
        out = model(**batch)
    elif isinstance(batch, (tuple, list)):
        out = model(*batch)
    else:
        out = model(batch)
    loss: torch.Tensor | None = getattr(out, "loss", None)  # a transformers-style output's loss
    if loss is None and isinstance(out, (tuple, list)):
        loss = next((t for t in reversed(out) if isinstance(t, torch.Tensor) and t.dim() == 0), None)
    if loss is None and isinstance(out, torch.Tensor) and out.dim() == 0:
        loss = out
    if loss is None:
        raise ConfigError("could not find a scalar loss in the model's output: pass loss_fn=(model, batch) -> loss")
    return loss


def _tokens_in(batch: Any) -> int | None:
    first = batch[0] if isinstance(batch, (tuple, list)) else batch.get("input_ids") if isinstance(batch, dict) else batch
    if isinstance(first, torch.Tensor) and first.dim() == 2 and not first.is_floating_point():
        return int(first.numel())
    return None


def profile_training(
    model: torch.nn.Module,
    batches: Iterable[Any],
    optimizer: torch.optim.Optimizer,
    steps: int | None = None,
    *,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
    warmup: int | None = None,
    profile_steps: int | None = None,
    dtype: str = "fp32",
    device: str | None = None,
    out_dir: str | Path | None = None,
) -> Run:
    """Profile ``steps`` training steps of any module; batches are cycled if there are too few. Counts
    left None are lmprof's defaults (``lmprof.counts.DEFAULT_COUNTS``: 3 warm-up, 10 clean, 3 profiled).

    ``loss_fn(model, batch)`` defaults to calling ``model(*batch)`` (or ``model(**batch)``) and taking
    ``.loss``, the last scalar of a tuple, or a scalar output.
    """
    from lmprof.pipeline.train import measure_training
    from lmprof.workloads.training import TrainWorkload
    from lmprof.workloads.hooks import module_scopes

    _check_model(model, "profile_training")
    warmup, steps, profile_steps = counts_for("train", warmup, steps, profile_steps)
    spec = build(MeasureSpec, dict(warmup=warmup, steps=steps, profile_steps=profile_steps, dtype=dtype, energy="off"))
    dev = _device_of(model, device)
    stream = _batches(batches)
    first = next(stream)
    stream = itertools.chain([first], stream)
    work = TrainWorkload(
        model=model, optimizer=optimizer, batches=stream, device=dev, loss_fn=loss_fn or _default_loss,
        tokens_per_step=_tokens_in(first), scopes=lambda: module_scopes(model),
    )
    folder = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="lmprof-train-"))
    check_output_dir(folder, "out_dir")  # before measuring: a bad folder must not cost a finished run
    config = {"source": "lmprof.profile_training", "model_name": type(model).__name__, "dtype": dtype, "steps": steps,
              "warmup": warmup, "profile_steps": profile_steps, "device_resolved": str(dev)}
    run = measure_training(work, spec, folder, config)
    run.save(folder)
    return run


def profile_inference(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    new_tokens: int = 50,
    *,
    kv_cache: bool = True,
    steps: int | None = None,
    warmup: int | None = None,
    profile_steps: int | None = None,
    tokenizer: Any = None,
    device: str | None = None,
    out_dir: str | Path | None = None,
) -> Run:
    """Profile greedy generation of ``new_tokens`` tokens from ``input_ids`` (B, T) with any causal LM.
    Counts left None are lmprof's defaults (``lmprof.counts.DEFAULT_COUNTS``: 1 warm-up, 5 clean, 3
    profiled generations).

    The model is called as ``model(ids)`` returning logits (or an object with ``.logits``); Hugging
    Face models (``GenerationMixin``) use the KV cache they return.
    """
    from lmprof.pipeline.infer import measure_inference
    from lmprof.workloads.inference import InferWorkload
    from lmprof.workloads.decoding import decoder_for
    from lmprof.workloads.hf import shape_of
    from lmprof.workloads.hooks import module_scopes

    _check_model(model, "profile_inference")
    warmup, steps, profile_steps = counts_for("infer", warmup, steps, profile_steps)
    if new_tokens <= 0:
        raise ConfigError(f"new_tokens must be positive, got {new_tokens}")
    if input_ids.dim() != 2:
        raise ConfigError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    dev = _device_of(model, device)
    model = model.eval()
    p = next(model.parameters(), None)
    decoder, notes = decoder_for(model, kv_cache, p.dtype if p is not None else torch.float32)
    work = InferWorkload(
        model=model, decoder=decoder, prompt=input_ids.to(dev.torch_device), new_tokens=new_tokens, device=dev,
        shape=shape_of(model), tokenizer=tokenizer, scopes=lambda: module_scopes(model), notes=notes,
    )
    spec = build(MeasureSpec, dict(warmup=warmup, steps=steps, profile_steps=profile_steps, energy="off"))
    folder = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="lmprof-infer-"))
    check_output_dir(folder, "out_dir")  # before measuring: a bad folder must not cost a finished run
    config = {"source": "lmprof.profile_inference", "model_name": type(model).__name__, "batch_size": input_ids.size(0), "seq_len": input_ids.size(1),
              "new_tokens": new_tokens, "kv_cache": kv_cache, "steps": steps, "warmup": warmup,
              "profile_steps": profile_steps, "device_resolved": str(dev)}
    run = measure_inference(work, spec, folder, config)
    run.save(folder)
    return run


def profile(
    model: torch.nn.Module,
    out: str | Path = "runs",
    *,
    infer: bool = False,
    steps: int | None = None,
    warmup: int | None = None,
    profile_steps: int | None = None,
    report: bool = True,
    verbose: bool = True,
    label: str | None = None,
    watch: bool = False,
    watch_max_captures: int | None = None,
    watch_min_gap: int | None = None,
) -> Any:
    """Profile your own loop: ``with lmprof.profile(model, out="runs/") as prof: ... prof.step()``.

    Call ``prof.step()`` once per training step (or, with ``infer=True``, once per generation: the
    first top-level forward after it is the prefill, later ones decode). Warm-up, clean timed steps
    and the profiled window follow ``lmprof train``'s protocol (``lmprof.counts.DEFAULT_COUNTS``:
    3/10/3 steps; inference 1/5/3 generations);
    after the window the loop runs unprofiled. The run folder is written under ``out`` when the
    window completes (or, with what was measured, when the block ends) and the summary printed to
    stderr (``verbose=False``: quiet). ``prof.run`` / ``prof.folder`` hold the result.

    ``watch=True``: after the profiled window every step is watched until the block ends (step time,
    memory, input wait, the loss given to ``prof.step(loss=...)``), with alerts and windows captured
    when something changes, at most ``watch_max_captures``, ``watch_min_gap`` steps apart (defaults:
    ``lmprof.counts.WATCH_LIMITS``); the run, written as its window completes, is written again with the
    watch's section when the block ends (docs/user-code.md).
    """
    from lmprof.pipeline.protocol.spec import Spec
    from lmprof.pipeline.usercode.context import Profile
    from lmprof.pipeline.usercode.guard import check_counts, check_out, watch_spec

    _check_model(model, "lmprof.profile")
    check_counts(warmup, steps, profile_steps, flags=False)
    watching = watch_spec(watch, watch_max_captures, watch_min_gap, infer=infer, stop_after=False, flags=False)
    out = check_out(out, "out")  # now, not at the end of the loop; absolute, so an os.chdir() inside it changes nothing
    spec = Spec(mode="infer" if infer else "train", warmup=warmup, steps=steps, profile_steps=profile_steps,
                out=out, label=label or type(model).__name__, report=report, verbose=verbose,
                config={"source": "lmprof.profile"}, watch=watching)
    return Profile(model, spec)
