"""The entry point :func:`estimate_memory`: checks the configuration, then estimates training or inference
(by lmprof's formulas, or from what the describer read off a model: :mod:`.from_facts`)."""
from __future__ import annotations

from dataclasses import replace

from lmprof.estimate.facts import ModelFacts
from lmprof.estimate.memory.from_facts import check_modelled, estimate_from_facts
from lmprof.estimate.memory.infer import infer_estimate, infer_on_device
from lmprof.estimate.memory.lora import Lora
from lmprof.estimate.memory.parallel import Parallel, counted as _n
from lmprof.estimate.memory.params import causal_mask_bytes, param_parts
from lmprof.estimate.memory.share import DeviceShare, device_share
from lmprof.estimate.memory.step import TrainStep
from lmprof.estimate.memory.train import train_estimate
from lmprof.estimate.memory.result import (
    DTYPE_BYTES,
    Attention,
    MemoryEstimate,
    Optimizer,
    OptimizerImpl,
)
from lmprof.errors import ConfigError
from lmprof.estimate.shape import ModelShape
from lmprof.estimate.dropout import Dropout
from lmprof.modes import MODES, Mode, traits


def estimate_memory(
    shape: ModelShape | ModelFacts,
    *,
    batch: int,
    seq_len: int,
    mode: Mode = "train",
    dtype: str = "fp32",
    param_dtype: str = "fp32",
    attention: Attention = "math",
    optimizer: Optimizer = "adamw",
    optimizer_impl: OptimizerImpl = "auto",
    master_weights: bool | None = None,
    device_kind: str = "cuda",
    dropout: float | Dropout = 0.0,
    new_tokens: int = 0,
    hold_logits: bool = False,
    buffers: int | None = None,
    lora: Lora | None = None,
    parallel: Parallel | None = None,
) -> MemoryEstimate:
    """Estimate every category of memory for one training step or one inference run.

    ``dtype`` is the compute dtype (``bf16``/``fp16`` mean torch.autocast when ``param_dtype`` is
    fp32, lmprof's mixed precision); ``param_dtype`` bf16/fp16 means the parameters themselves are
    16-bit, and then ``master_weights`` (default True) adds an fp32 copy in the optimizer.
    ``optimizer_impl`` picks the AdamW/SGD temporaries (``auto``: foreach on CUDA, for-loop on CPU).
    ``device_kind`` (``cpu`` or a GPU kind) decides what differs between the two: autocast keeps
    softmax in fp32 on CUDA only, dropout masks are bool on CUDA and full-width on the CPU, and the
    default optimizer implementation. ``dropout`` (training): one rate for the built-in GPT, or a
    :class:`~lmprof.estimate.dropout.Dropout` by site for a Hugging Face config (its masks are kept
    for backward; attention dropout also decides which SDPA kernel runs: math on the CPU).
    Inference caches ``seq_len + new_tokens`` tokens per sequence. ``hold_logits``: the step keeps
    the (b, s, V) logits until it ends (``logits, loss = model(x, y)`` in the step's scope); lmprof's
    own train step keeps only the loss, so by default they die with the forward pass.
    ``buffers`` overrides the built-in GPT's causal-mask buffer size.

    ``lora`` (training): only adapters train (:class:`~lmprof.estimate.memory.lora.Lora`, QLoRA: NF4
    base linears). ``parallel``: tensor (+ sequence) and pipeline parallel degrees
    (:class:`~lmprof.estimate.memory.parallel.Parallel`); the figures are then one device's, ``batch``
    is the micro-batch, and with pipeline stages the estimate is the stage with the higher peak (the
    first, holding ``pp`` micro-batches, or the last, holding the lm_head and the logits).

    ``shape`` may be the describer's :class:`~lmprof.estimate.facts.ModelFacts` of a family the formulas
    do not know (read in ``dtype`` at ``seq_len`` tokens, with ``param_dtype`` = ``dtype``): the figures are
    then read off the model (:mod:`.from_facts`), attention and dropout as the model ran; ``lora``,
    ``parallel`` and ``buffers`` are not modelled for it.
    """
    if isinstance(shape, ModelFacts):
        check_modelled(shape, dtype=dtype, param_dtype=param_dtype, lora=lora, parallel=parallel, buffers=buffers)
        return estimate_from_facts(shape, batch=batch, seq_len=seq_len, mode=mode, dtype=dtype, optimizer=optimizer,
                                   optimizer_impl=optimizer_impl, master_weights=master_weights,
                                   device_kind=device_kind, new_tokens=new_tokens, hold_logits=hold_logits)
    _validate(shape, batch, seq_len, mode, dtype, param_dtype, attention, optimizer, optimizer_impl, dropout, new_tokens)
    par = parallel or Parallel()
    par.check(shape)
    if lora is not None:
        lora.check(shape)
        if not traits(mode).trains:
            raise ConfigError("a LoRA/QLoRA plan is for training (--mode train); for inference merge the adapters "
                              "or use --weights int4")
    if param_dtype != "fp32":
        dtype = param_dtype  # 16-bit parameters compute in their own dtype, no autocast
    pp = param_parts(shape)
    p_bytes = DTYPE_BYTES[param_dtype]
    autocast = dtype != "fp32" and param_dtype == "fp32"
    if param_dtype == "fp32":
        master_weights = False  # the parameters already are the fp32 master copy
    elif master_weights is None:
        master_weights = True
    regime = _regime(dtype, param_dtype, master_weights, traits(mode).trains)

    params = pp.total * p_bytes
    buf = causal_mask_bytes(shape) if buffers is None else buffers
    if traits(mode).generates:
        est = infer_estimate(shape, pp, batch, seq_len, seq_len + new_tokens, dtype, param_dtype, attention, device_kind,
                             regime, params, buf, autocast)
        return est if par.trivial else infer_on_device(est, shape, pp, par, param_dtype)
    step = TrainStep(batch, seq_len, dtype, param_dtype, attention, device_kind, dropout)
    if par.trivial and lora is None:
        est = train_estimate(
            shape, pp, step, optimizer=optimizer, optimizer_impl=optimizer_impl, master_weights=master_weights,
            hold_logits=hold_logits, regime=regime, params=params, buf=buf,
        )
        return replace(est, layer_bytes=shape.layer_params() * p_bytes, layer_grad_bytes=shape.layer_params() * p_bytes)
    # One device's share: the first and the last pipeline stage are the candidates for the higher peak.
    best: MemoryEstimate | None = None
    for stage in sorted({0, par.pp - 1}):
        share = device_share(shape, pp, par=par, lora=lora, stage=stage, param_dtype=param_dtype, dtype=dtype,
                             batch=batch, seq_len=seq_len)
        est = train_estimate(
            shape, pp, step, optimizer=optimizer, optimizer_impl=optimizer_impl, master_weights=master_weights,
            hold_logits=hold_logits, regime=regime, params=share.param_bytes, buf=buf * share.layers // shape.n_layer,
            share=share, par=par,
        )
        est = replace(est, plan=plan_lines(shape, lora, par, share), device_params=share.params,
                      stage_layers=share.layers, in_flight=share.in_flight,
                      layer_bytes=share.layer_bytes, layer_grad_bytes=share.trainable.layer_params * p_bytes)
        if best is None or est.peak > best.peak:
            best = est
    assert best is not None
    return best


def _validate(shape: ModelShape, batch: int, seq_len: int, mode: str, dtype: str, param_dtype: str, attention: str,
              optimizer: str, impl: str, dropout: float | Dropout, new_tokens: int) -> None:
    if batch <= 0:
        raise ConfigError(f"batch size must be positive, got {batch}")
    if seq_len <= 0:
        raise ConfigError(f"sequence length must be positive, got {seq_len}")
    if mode not in MODES:
        raise ConfigError(f"mode must be 'train' or 'infer', got {mode!r}")
    for name, val in (("dtype", dtype), ("param dtype", param_dtype)):
        if val not in DTYPE_BYTES:
            raise ConfigError(f"{name} must be one of {', '.join(DTYPE_BYTES)}, got {val!r}")
    if attention not in ("math", "sdpa"):
        raise ConfigError(f"attention must be 'math' or 'sdpa', got {attention!r}")
    if optimizer not in ("adamw", "sgd"):
        raise ConfigError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    if impl not in ("auto", "foreach", "for-loop", "fused"):
        raise ConfigError(f"optimizer implementation must be auto, foreach, for-loop or fused, got {impl!r}")
    if not isinstance(dropout, Dropout) and not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {dropout}")
    if new_tokens < 0:
        raise ConfigError(f"new tokens must be >= 0, got {new_tokens}")
    tokens = seq_len + (new_tokens if traits(mode).generates else 0)
    if tokens > shape.block_size:
        raise ConfigError(f"{tokens} tokens exceed the model's block_size {shape.block_size}")


def _regime(dtype: str, param_dtype: str, master_weights: bool, trains: bool) -> str:
    """One line saying which precision regime the figures assume (``trains``: a training step, else inference)."""
    if param_dtype == "fp32" and dtype == "fp32":
        return "fp32: parameters, gradients, optimizer state and activations all fp32"
    if param_dtype == "fp32":
        if not trains:
            return f"autocast {dtype}: fp32 parameters; matmuls in {dtype} on 16-bit weight copies"
        return (f"autocast {dtype}: fp32 parameters, gradients and optimizer state; matmuls in {dtype} on "
                "16-bit weight copies; residual stream, norms and loss in fp32")
    if not trains:
        return f"{param_dtype} parameters, no autocast"
    if master_weights:
        return f"{param_dtype} parameters and gradients; fp32 master weights and fp32 moments in the optimizer"
    return f"{param_dtype} parameters, gradients and optimizer moments; no fp32 master copy"


def plan_lines(shape: ModelShape, lora: Lora | None, par: Parallel, share: DeviceShare) -> tuple[str, ...]:
    """What the per-device figures assume, one line each: the adapters, the parallel layout, the stage."""
    lines = []
    if lora is not None:
        lines.append(lora.describe())
    if not par.trivial:
        lines.append(par.describe(shape, training=True))
        if par.pp > 1:
            where = "first" if share.first else "last"
            lines.append(f"figures for the {where} pipeline stage ({_n(share.layers, 'layer')}, "
                         f"{_n(share.in_flight, 'micro-batch')} in flight), the stage with the higher peak")
    return tuple(lines)
