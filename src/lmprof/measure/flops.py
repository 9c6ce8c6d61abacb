"""Measured FLOP counts per block, forward and backward, from PyTorch's own FLOP formulas.

Two attributions are made in the same run:

* **by block**, through the ``lmprof:<block>`` scopes. A ``TorchFunctionMode`` follows the scopes as
  they open and close (``record_function`` enters and exits through torch ops) and tags every autograd
  node created inside a scope with that block; a ``TorchDispatchMode`` then counts each aten op with the
  formulas of ``torch.utils.flop_counter`` (the ones ``FlopCounterMode`` uses) and charges it to the
  open scope in forward, or to the scope that created the executing autograd node in backward
  (``torch._C._current_autograd_node()``). This is how attn.scores and attn.av are told apart: both
  matmuls live directly in the attention module, but in different scopes, and their backward matmuls
  run inside autograd nodes tagged with those scopes. Op order is never relied on.
* **by module**, with ``torch.utils.flop_counter.FlopCounterMode`` itself, run separately around
  forward and backward, and mapped to canonical block names for the built-in GPT
  (``transformer.h.0.attn.c_attn`` -> attn.qkv, ...). The attention module's own matmuls (scores + AV,
  or SDPA) are reported as ``attn.core``. Module attribution in backward follows FlopCounterMode's
  module hooks, which are approximate for modules that only pass a tensor through (dropout); the
  scope attribution is the one to use.

Ops that ran but have no FLOP formula are listed, never silently zero: ``compute`` ones (names that
look like matmul, convolution or attention) make the count incomplete; ``other`` ones are elementwise,
normalisation and reduction ops, which FlopCounterMode does not count by design.

Every counter lmprof makes (:func:`flop_counter`, :func:`formulas`) adds formulas to torch's for the
ops SDPA runs as off CUDA: ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward) on
a CPU, ``aten._scaled_dot_product_attention_math_for_mps`` on Apple MPS (its backward is autograd's,
through ops torch counts) and ``aten._scaled_dot_product_fused_attention_overrideable`` (and its
backward) on other devices. FlopCounterMode has none for them, so a model using
``F.scaled_dot_product_attention`` counted its attention as 0 FLOPs there. They take query, key and
value (after grad_out, in backward) first, as the CUDA flash op does, and are counted with torch's
own SDPA formulas. ``aten._grouped_mm`` (the routed experts of transformers' mixture-of-experts layers)
gets its matmul count too: torch has none, so a counted MoE model's experts were 0 FLOPs.
"""
from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from lmprof.errors import ConfigError
from lmprof.names import FORWARD_BLOCKS, INFER_PARTS, PHASES, SCOPE_PREFIX, STEP_PARTS
from lmprof.workloads.blocks import scopes_enabled
from lmprof.workloads.hf_interface import require_cache
from lmprof.workloads.hooks import takes_hooks

if TYPE_CHECKING:
    from torch.autograd.graph import Node

    from lmprof.workloads.gpt import GPT

UNSCOPED = "(unscoped)"
_STEP_SCOPES = frozenset({*STEP_PARTS, *INFER_PARTS, *PHASES, "step"})
_META_KEY = "lmprof_block"
_COMPUTE_OP = re.compile(r"(mm|matmul|conv|attention|linear|einsum|bilinear|addmv|\bmv\b|\bdot\b|_scaled)", re.I)
# Ops that move, view, allocate or copy but compute nothing: not worth listing as uncounted.
_NO_COMPUTE = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "split",
    "split_with_sizes", "unsqueeze", "squeeze", "detach", "alias", "clone", "copy_", "_to_copy", "contiguous",
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "arange", "lift_fresh", "new_empty", "new_zeros", "new_ones", "fill_", "zero_", "as_strided", "unbind",
    "index_select", "embedding", "cat", "stack", "_reshape_alias", "unfold", "resize_", "set_", "index",
    "index_put_", "index_put", "_local_scalar_dense", "item", "scalar_tensor", "randint", "random_", "normal_",
    "uniform_", "bernoulli_", "native_dropout", "expand_as", "view_as", "masked_fill", "bitwise_not", "where",
    "embedding_dense_backward",
}

# Module path suffixes of the built-in GPT and the block each one is.
GPT_MODULE_BLOCKS: tuple[tuple[str, str], ...] = (
    ("attn.c_attn", "attn.qkv"),
    ("attn.c_proj", "attn.proj"),
    ("mlp.c_fc", "mlp.fc"),
    ("mlp.c_proj", "mlp.proj"),
    ("ln_1", "ln_1"),
    ("ln_2", "ln_2"),
    ("ln_f", "ln_f"),
    ("wte", "embedding"),
    ("wpe", "embedding"),
    ("lm_head", "lm_head"),
)


@dataclass
class UncountedOp:
    """An op that ran without a FLOP formula."""

    name: str
    kind: str  # "compute" (the count is incomplete) or "other" (elementwise / norm / reduction)
    calls: int = 0
    phases: set[str] = field(default_factory=set)
    blocks: set[str] = field(default_factory=set)


@dataclass
class MeasuredFlops:
    """FLOPs counted while running a model, attributed by block and by module."""

    by_block: dict[tuple[str, str], int]  # (block, phase) -> FLOPs
    by_op: dict[tuple[str, str], int]  # (aten op, phase) -> FLOPs
    by_module: dict[tuple[str, str], int]  # (module path, phase) -> FLOPs, FlopCounterMode's (inclusive)
    uncounted: list[UncountedOp]

    def total(self, phase: str | None = None) -> int:
        return sum(v for (_, ph), v in self.by_block.items() if phase is None or ph == phase)

    def block(self, name: str, phase: str = "forward") -> int:
        return self.by_block.get((name, phase), 0)

    def compute_uncounted(self) -> list[UncountedOp]:
        """Uncounted ops that do matmul-class work: the per-block numbers are incomplete where they ran."""
        return [u for u in self.uncounted if u.kind == "compute"]

    def module_blocks(self, mapping: Iterable[tuple[str, str]] = GPT_MODULE_BLOCKS) -> dict[tuple[str, str], int]:
        """FlopCounterMode's module counts mapped to canonical blocks; attention internals as ``attn.core``.

        FlopCounterMode counts are inclusive (a module includes its children), so leaves are mapped
        directly and the attention module's own work is its total minus its mapped children.
        """
        mapping = tuple(mapping)
        out: dict[tuple[str, str], int] = defaultdict(int)
        for (path, phase), flops in self.by_module.items():
            block = module_block(path, mapping)
            if block is not None:
                out[(block, phase)] += flops
            elif path.endswith(".attn"):
                children = sum(
                    v for (p, ph), v in self.by_module.items()
                    if ph == phase and p.startswith(path + ".") and module_block(p, mapping) is not None
                )
                out[("attn.core", phase)] += flops - children
        return dict(out)

    def summary(self) -> str:
        """Plain-text table of per-block FLOPs and the uncounted ops."""
        phases = [ph for ph in ("forward", "backward") if any(p == ph for _, p in self.by_block)]
        lines = [f"{'block':<16}" + "".join(f"{ph:>18}" for ph in phases)]
        order = {name: i for i, name in enumerate(FORWARD_BLOCKS)}
        names = sorted({n for n, _ in self.by_block}, key=lambda n: order.get(n, len(order)))
        for n in names:
            lines.append(f"{n:<16}" + "".join(f"{self.by_block.get((n, ph), 0):>18,}" for ph in phases))
        lines.append(f"{'total':<16}" + "".join(f"{self.total(ph):>18,}" for ph in phases))
        compute = self.compute_uncounted()
        if compute:
            lines.append("uncounted compute ops (no FLOP formula; counts above are incomplete): "
                         + ", ".join(f"{u.name} x{u.calls} in {'/'.join(sorted(u.blocks))}" for u in compute))
        other = [u.name for u in self.uncounted if u.kind == "other"]
        if other:
            lines.append("uncounted non-matmul ops (FlopCounterMode counts matmul/conv/attention only): "
                         + ", ".join(other))
        return "\n".join(lines)


def module_block(path: str, mapping: Iterable[tuple[str, str]] = GPT_MODULE_BLOCKS) -> str | None:
    """Canonical block of a module path (``GPT.transformer.h.0.attn.c_attn`` -> ``attn.qkv``), or None."""
    for suffix, block in mapping:
        if path == suffix or path.endswith("." + suffix):
            return block
    return None


def _sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query, key, value))  # type: ignore[no-untyped-call]  # torch leaves it unannotated


def _sdpa_backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                   **kwargs: Any) -> int:
    return int(sdpa_backward_flop_count(grad_out, query, key, value))  # type: ignore[no-untyped-call]  # likewise


def _grouped_mm(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``aten._grouped_mm``: every group's matmul, 2 FLOPs per multiply-add, summed.

    (M, K) x (K, N) split along K into groups (a weight gradient, out (G, K, N)): 2·M·K·N; every other
    form (2-D x 3-D with row offsets, the experts' forward; 3-D x 3-D batched; 3-D x 2-D) writes
    ``out`` elements, each a K-long dot product: 2·numel(out)·K.
    """
    if len(a) == 2 and len(b) == 2:
        return 2 * int(a[0]) * int(a[1]) * int(b[1])
    numel = 1
    for n in out_shape:
        numel *= int(n)
    return 2 * numel * int(a[-1])


# FlopCounterMode wraps these to take shapes (custom_mapping), as torch's own formulas are.
_aten = torch.ops.aten
_SDPA_OFF_CUDA: dict[Any, Callable[..., int]] = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _sdpa,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward,
    _aten._scaled_dot_product_attention_math_for_mps: _sdpa,
    _aten._scaled_dot_product_fused_attention_overrideable: _sdpa,
    _aten._scaled_dot_product_fused_attention_overrideable_backward: _sdpa_backward,
}
# Mixture-of-experts layers of transformers >= 5 run their experts as one grouped matmul, for which
# torch has no formula: alone, FlopCounterMode counts every routed expert as 0 FLOPs.
_EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {**_SDPA_OFF_CUDA, _aten._grouped_mm: _grouped_mm}


class _WholeStep:
    """FlopCounterMode's module tracker for a count of the whole step: every FLOP goes to "Global".

    torch's ModuleTracker hooks every module's outputs for backward, and those hooks fail on outputs no
    gradient flows to the way they expect: a module that returns one of its parameters under inference
    mode (GPT-NeoX-Japanese's attention returns its bias: 'NoneType' object has no attribute
    'next_functions'), or an expert that got no token in a training step (DBRX: "Expected gradient
    function to be set"). A total needs none of it.
    """

    parents = frozenset({"Global"})  # FlopCounterMode charges each op to every name in set(parents)

    def __enter__(self) -> "_WholeStep":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def flop_counter(by_module: bool = True) -> FlopCounterMode:
    """torch's FlopCounterMode with the formulas it lacks added: SDPA's ops off CUDA and the grouped
    matmul of mixture-of-experts layers (see the module docstring). ``by_module`` False: totals only
    (``get_total_flops``), without torch's module hooks (:class:`_WholeStep` says why)."""
    mode = FlopCounterMode(display=False, custom_mapping=_EXTRA_FORMULAS)
    if not by_module:
        # A private attribute of torch's: if it is ever renamed this sets nothing, and the count keeps
        # torch's tracker (tests/test_flops_whole_step.py checks the tracker is off).
        mode.mod_tracker = _WholeStep()  # type: ignore[assignment]
    return mode


def formulas() -> dict[Any, Callable[..., int]]:
    """op overload packet -> FLOPs of one call (its args and kwargs as the op gets them, ``out_val``):
    the registry :func:`flop_counter` counts with."""
    return flop_counter().flop_registry


def _op_base(func: Any) -> str:
    return str(func._overloadpacket).split(".")[-1]


class _ScopeTracker(TorchFunctionMode):
    """Follows lmprof scopes and tags the autograd nodes created under each."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self._enter = torch.ops.profiler._record_function_enter_new
        self._exit = torch.ops.profiler._record_function_exit

    def current(self) -> str:
        # The innermost scope naming a block: step-part scopes (forward, backward, prefill, ...) enclose
        # blocks and are skipped; a block's own name is canonical or a module's (attn.core, a path).
        for name in reversed(self.stack):
            if name not in _STEP_SCOPES:
                return name
        return self.stack[-1] if self.stack else UNSCOPED

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = getattr(func, "_overloadpacket", func)
        if packet is self._enter and args and isinstance(args[0], str):
            name = args[0]
            self.stack.append(name[len(SCOPE_PREFIX):] if name.startswith(SCOPE_PREFIX) else name)
            return func(*args, **kwargs)
        if packet is self._exit:
            out = func(*args, **kwargs)
            if self.stack:
                self.stack.pop()
            return out
        out = func(*args, **kwargs)
        if torch.is_grad_enabled():
            self._tag(out, self.current())
        return out

    @staticmethod
    def _tag(out: Any, block: str) -> None:
        """Tag the not-yet-tagged autograd nodes reachable from ``out``: exactly those just created."""
        todo: list[Node | None] = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or _META_KEY in _metadata(node):
                continue
            _metadata(node)[_META_KEY] = block
            todo.extend(nxt for nxt, _ in node.next_functions)


def _metadata(node: Node) -> dict[str, Any]:
    """An autograd node's metadata dict, free for tools to write in."""
    # torch's Node declares metadata as a method, but the C++ node exposes it as a dict property
    return cast("dict[str, Any]", node.metadata)


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


class BlockCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init_subclass__ unannotated
    """Counts FLOPs of every aten op and charges them to a (block, phase) of its scope tracker."""

    def __init__(self, tracker: _ScopeTracker | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self.tracker = tracker if tracker is not None else _ScopeTracker()
        self.formulas = formulas()
        self.by_block: dict[tuple[str, str], int] = defaultdict(int)
        self.by_op: dict[tuple[str, str], int] = defaultdict(int)
        self.uncounted: dict[str, UncountedOp] = {}

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, block: str,
              phase: str) -> None:
        """Called for every aten op after it ran, with the block and phase it is charged to (for
        subclasses that account more than FLOPs: the model describer's bytes)."""

    def _where(self) -> tuple[str, str]:
        node = torch._C._current_autograd_node()
        if node is not None:
            return _metadata(node).get(_META_KEY, UNSCOPED), "backward"
        return self.tracker.current(), "forward"

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in self.formulas:
            # Same rule as FlopCounterMode: an op without a formula is counted through its
            # decomposition when it has one.
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        out = func(*args, **kwargs)
        block, phase = self._where()
        self.on_op(func, args, kwargs, out, block, phase)
        if packet in self.formulas:
            flops = int(self.formulas[packet](*args, **kwargs, out_val=out))
            self.by_block[(block, phase)] += flops
            self.by_op[(str(packet), phase)] += flops
        elif str(packet).startswith("aten.") and _op_base(func) not in _NO_COMPUTE:
            name = str(packet)
            kind = "compute" if _COMPUTE_OP.search(_op_base(func)) else "other"
            u = self.uncounted.setdefault(name, UncountedOp(name, kind))
            u.calls += 1
            u.phases.add(phase)
            u.blocks.add(block)
        return out


def count_flops(step: Callable[[], Any], *, backward: bool = False, counter: BlockCounter | None = None,
                by_module: bool = True) -> MeasuredFlops:
    """Run ``step()`` (a forward pass) and, with ``backward``, ``.backward()`` on what it returns.

    ``step`` must return a scalar tensor (a loss) when ``backward`` is set. Scopes are enabled for
    the duration so that block attribution works on any model using ``lmprof.workloads.blocks.scope``.
    ``counter``: a :class:`BlockCounter` (or subclass) to count with, kept by the caller; ``by_module``
    False skips FlopCounterMode's own per-module pass (``by_module`` of the result is then empty).
    """
    counter = counter if counter is not None else BlockCounter()
    # One FlopCounterMode over forward and backward (its module hooks for backward are installed during
    # forward); the backward share is the difference between the counts after and before backward.
    modules = flop_counter() if by_module else contextlib.nullcontext()
    after_forward: dict[str, dict[Any, int]] = {}
    after_all: dict[str, dict[Any, int]] = {}
    with scopes_enabled(True), modules:
        with counter.tracker, counter:
            result = step()
        if isinstance(modules, FlopCounterMode):
            after_forward = modules.get_flop_counts()
        if backward:
            loss = result[1] if isinstance(result, tuple) else result
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ConfigError("count_flops(backward=True) needs step() to return a scalar loss (or (logits, loss))")
            with counter:
                loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        if isinstance(modules, FlopCounterMode):
            after_all = modules.get_flop_counts()
    per_module: dict[tuple[str, str], int] = {}
    for path, ops in after_all.items():
        if path == "Global":
            continue
        fwd = int(sum(after_forward.get(path, {}).values()))
        bwd = int(sum(ops.values())) - fwd
        for phase, flops in (("forward", fwd), ("backward", bwd)):
            if flops:
                per_module[(path, phase)] = flops
    return MeasuredFlops(
        by_block=dict(counter.by_block),
        by_op=dict(counter.by_op),
        by_module=per_module,
        uncounted=sorted(counter.uncounted.values(), key=lambda u: (u.kind != "compute", u.name)),
    )


def count_gpt_flops(
    model: GPT,
    *,
    batch: int,
    seq_len: int,
    mode: str = "train",
    seed: int = 0,
) -> MeasuredFlops:
    """Count the built-in GPT's FLOPs for one training step, one prefill, or one decode step.

    * train: forward with targets + backward (phases ``forward`` and ``backward``);
    * prefill: ``seq_len`` tokens into an empty KV cache, no grad (phase ``forward``);
    * decode: one token at position ``seq_len - 1`` after an uncounted prefill of ``seq_len - 1``
      tokens, so it attends to ``seq_len`` keys like ``block_costs(phase="decode", seq_len=...)``.
    """
    from lmprof.workloads.gpt import KVCache

    cfg = model.config
    if batch <= 0 or seq_len <= 0:
        raise ConfigError(f"batch and seq_len must be positive, got {batch}, {seq_len}")
    if seq_len > cfg.block_size:
        raise ConfigError(f"seq_len {seq_len} exceeds the model's block_size {cfg.block_size}")
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen).to(device)
    if mode == "train":
        targets = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen).to(device)
        model.zero_grad(set_to_none=True)
        return count_flops(lambda: model(idx, targets), backward=True)
    dtype = next(model.parameters()).dtype
    cache = KVCache(cfg, batch, seq_len, device, dtype)
    with torch.no_grad():
        if mode == "prefill":
            return count_flops(lambda: model(idx, cache=cache, pos=0))
        if mode == "decode":
            if seq_len > 1:
                model(idx[:, :-1], cache=cache, pos=0)
            return count_flops(lambda: model(idx[:, -1:], cache=cache, pos=seq_len - 1))
    raise ConfigError(f"mode must be train, prefill or decode, got {mode!r}")


@dataclass(frozen=True)
class Comparison:
    """Analytic vs measured matmul FLOPs of one block."""

    name: str
    phase: str
    analytic: float
    measured: float

    @property
    def rel_error(self) -> float:
        if self.analytic == 0:
            return 0.0 if self.measured == 0 else float("inf")
        return (self.measured - self.analytic) / self.analytic

    def ok(self, tol: float = 0.01) -> bool:
        return abs(self.rel_error) <= tol


def compare(analytic: Iterable[Any], measured: MeasuredFlops) -> list[Comparison]:
    """Pair analytic :class:`~lmprof.estimate.flops.BlockCost` matmul FLOPs with measured block counts.

    Only blocks with analytic matmul FLOPs are compared: FlopCounterMode counts matmuls only. Analytic
    phases prefill and decode are compared with the measured ``forward`` (inference runs no backward).
    """
    out = []
    for b in analytic:
        if b.matmul_flops <= 0:
            continue
        phase = "backward" if b.phase == "backward" else "forward"
        out.append(Comparison(b.name, b.phase, b.matmul_flops, float(measured.block(b.name, phase))))
    return out


class StepFlops:
    """torch's FlopCounterMode around one step whose start and end are calls (someone else's loop).

    ``mark()`` notes the count so far (the end of a generation's prefill, say), so one counted
    generation gives its prefill and its decode FLOPs apart. Counted, never estimated.

    ``model``: a training step's model. Its forwards without grad (an evaluation inside the step: the
    loop's, or the Trainer's ``eval_steps``) are counted apart (:attr:`aside`) and left out of the
    step's count: they are not the training step's FLOPs, and the step time leaves such steps out.
    """

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        self._mode = flop_counter(by_module=False)
        self.marks: list[int] = []
        self.aside = 0  # FLOPs of the model's forwards without grad
        self._model = model
        self._handles: list[Any] = []
        self._since: int | None = None  # the count when a forward without grad began
        self._on = False

    def start(self) -> None:
        self._mode.__enter__()  # type: ignore[no-untyped-call]  # torch leaves FlopCounterMode.__enter__ unannotated
        self._on = True
        if self._model is not None and takes_hooks(self._model):
            self._handles = [self._model.register_forward_pre_hook(self._forward_begins),
                             self._model.register_forward_hook(self._forward_ends, always_call=True)]

    def _forward_begins(self, module: torch.nn.Module, args: Any) -> None:
        if self._since is None and not torch.is_grad_enabled():
            self._since = int(self._mode.get_total_flops())

    def _forward_ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._since is not None:
            self.aside += int(self._mode.get_total_flops()) - self._since
            self._since = None

    def mark(self) -> None:
        if self._on:
            self.marks.append(int(self._mode.get_total_flops()))

    def stop(self) -> int:
        """Stop counting; the FLOPs counted since :meth:`start`, less :attr:`aside`."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._on:
            self._on = False
            self._mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]  # likewise __exit__
        return int(self._mode.get_total_flops()) - self.aside


def aside_note(aside: int, where: str) -> str:
    """What a run says when its counted step also evaluated the model (:attr:`StepFlops.aside`)."""
    return (f"the FLOP count's step ({where}) also ran the model without grad (an evaluation): its "
            f"{aside:,} FLOPs are left out of the count, which is the training step's")


@dataclass(frozen=True)
class PhaseFlops:
    """FLOPs FlopCounterMode counts for one training step, one prefill and one decode step (FLOP)."""

    train: int  # forward + backward with labels
    prefill: int  # the prompt, building the KV cache
    decode: int  # one new token on that cache


def count_causal_lm_flops(model: torch.nn.Module, ids: torch.Tensor) -> PhaseFlops:
    """Count a Hugging Face causal LM's FLOPs on ``ids`` (B, T) with FlopCounterMode, phase by phase.

    The decode step feeds the first token back on the prefill's cache, so it attends to T + 1
    positions. Measured (torch's own counter), never estimated.
    """
    with flop_counter(by_module=False) as fc:
        model(input_ids=ids, labels=ids).loss.backward()
    train = fc.get_total_flops()
    with torch.no_grad():
        with flop_counter(by_module=False) as fc:
            out = model(input_ids=ids, use_cache=True)
        prefill = fc.get_total_flops()
        with flop_counter(by_module=False) as fc:
            keyword, cache = require_cache(model, out)
            model(input_ids=ids[:, :1], use_cache=True, **{keyword: cache})
        decode = fc.get_total_flops()
    return PhaseFlops(train, prefill, decode)
