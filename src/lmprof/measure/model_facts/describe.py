"""The model describer: any causal LM transformers can build, read off the model itself on the meta device.

:func:`describe` builds the model of a config on the meta device (no memory, well under a second
even at a 70B size) and runs it there as a CPU would (:mod:`.meta`), counted (:mod:`.counter`):

* parameters: total, and active per token (routed experts scaled to ``top_k / n_experts``, shared
  experts whole), tensors, the largest one, the weights matmuls read;
* per-block FLOPs and bytes of a prefill, of one decode step through the model's own cache, and of
  a training step (forward with the loss, backward), with the block names measured runs use
  (:func:`lmprof.workloads.hooks.block_names`: canonical where lmprof knows the family, mixers and
  experts named for what they are, module paths otherwise);
* what the model's own cache holds after the prefill (:mod:`.cache`) and how it grows;
* the bytes autograd saves for backward (each storage once) and the highest level of live
  tensors over forward and backward, at two batch sizes (both are affine in the batch).

The answer is a torch-free :class:`~lmprof.estimate.facts.ModelFacts`.
"""
from __future__ import annotations

import re
from typing import Any, Callable, TypeVar

import torch

from lmprof import progress
from lmprof.errors import ConfigError
from lmprof.estimate.facts import BlockRow, CacheLayer, ModelFacts, TrainMemory
from lmprof.estimate.models import EXPERT_KEYS, TOP_K_KEYS
from lmprof.measure.flops import count_flops
from lmprof.measure.model_facts.cache import cache_layers, cache_storages
from lmprof.measure.model_facts.counter import FactsCounter, _sid, saved_tensors
from lmprof.measure.model_facts.meta import MetaKernels, build_on_meta, transformers_config
from lmprof.names import FORWARD_BLOCKS, MIXER_KINDS, PHASE_ROWS, folded
from lmprof.workloads.hooks import _kind, _split_layers, attention_core_name, block_names, module_scopes
from lmprof.workloads.hf_interface import returned_cache, wants_whole_sequence

# transformers' class name for the routed experts' module, or the path of one expert in a list of them.
_EXPERT_LIST = re.compile(r"(^|\.)experts\.\d+(\.|$)")
PHASE_NAMES = ("prefill", "decode", "train")


def _get(holder: Any, key: str) -> Any:
    try:
        return getattr(holder, key, None)
    except Exception:  # noqa: BLE001 - per-layer config attributes refuse a global read
        return None


def _config_value(cfg: Any, keys: tuple[str, ...]) -> int:
    for holder in (cfg, _get(cfg, "text_config")):
        for key in keys:
            value = _get(holder, key) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def _layer_stack(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's layers: the longest list of modules in the model."""
    lists = [list(m) for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len) if lists else []


def layer_kinds(model: torch.nn.Module) -> tuple[str, ...]:
    """What mixes tokens in each layer: attention, linear attention, SSM, convolution (``+`` when several)."""
    kinds = []
    for layer in _layer_stack(model):
        found: list[str] = []
        for module in layer.modules():
            kind = _kind(module)
            label = MIXER_KINDS.get(kind or "", "")
            if label and label not in found:
                found.append(label)
        kinds.append("+".join(found) or "-")
    return tuple(kinds)


def _params(model: torch.nn.Module, n_experts: int, top_k: int) -> tuple[int, int, int, int, set[int]]:
    """(total, active, tensors, largest tensor, storage ids of parameters and buffers)."""
    total = tensors = largest = unused = 0
    for path, p in model.named_parameters():
        n = p.numel()
        total += n
        tensors += 1
        largest = max(largest, n)
        if n_experts and top_k and top_k < n_experts:
            if _EXPERT_LIST.search(path):  # one module per expert: each is used by top_k / E of the tokens
                unused += n * (n_experts - top_k) // n_experts
            elif (".experts." in path or path.startswith("experts.")) and p.dim() >= 2 and p.shape[0] == n_experts:
                # the experts' stacked weights (E, ...) and biases (E, n): gpt-oss has both
                unused += n * (n_experts - top_k) // n_experts
    ids = {_sid(p) for p in model.parameters()} | {_sid(b) for b in model.buffers()}
    return total, total - unused, tensors, largest, ids


def _block_counts(model: torch.nn.Module, names: dict[str, str]) -> dict[str, int]:
    """How many layers each block spans (1 for blocks outside the layer stack)."""
    modules = dict(model.named_modules())
    layers: dict[str, set[str]] = {}
    for path, name in names.items():
        _, idx = _split_layers(path, modules)
        layers.setdefault(folded(name), set()).add(idx[0] if idx else "")
    return {name: max(1, len(ix - {""})) for name, ix in layers.items()}


def _order(name: str) -> tuple[int, str]:
    blocks = {b: i for i, b in enumerate(FORWARD_BLOCKS)}
    blocks["attn.core"] = blocks["attn.sdpa"]  # eager attention's own work (scores, softmax, AV)
    if name in blocks:
        return blocks[name], ""
    if name in PHASE_ROWS:
        return len(blocks) + 1 + PHASE_ROWS.index(name), ""
    return len(blocks), name


def _rows(counter: FactsCounter, counts: dict[str, int], phase_names: dict[str, str],
          cache_ids: set[int] | None = None) -> list[BlockRow]:
    """The counter's blocks as rows, per layer-folded name; reads of ``cache_ids`` (storage keys,
    :meth:`FactsCounter.key_of`) are the cache's."""
    cache_ids = cache_ids or set()
    kv: dict[tuple[str, str], int] = {}
    for block, phase, storage, nbytes in counter.reads:
        if storage in cache_ids:
            kv[(block, phase)] = kv.get((block, phase), 0) + nbytes
    keys = set(counter.by_block) | set(counter.act_bytes) | set(counter.weight_bytes)
    merged: dict[tuple[str, str], list[float]] = {}
    for block, phase in keys:
        key = (folded(block), phase_names.get(phase, phase))
        acc = merged.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        k = kv.get((block, phase), 0)
        acc[0] += counter.by_block.get((block, phase), 0)
        acc[1] += counter.weight_bytes.get((block, phase), 0)
        acc[2] += counter.act_bytes.get((block, phase), 0) - k
        acc[3] += k
    return [BlockRow(name=name, phase=phase, flops=f, weight_bytes=w, act_bytes=a, kv_bytes=k,
                     count=counts.get(name, 1))
            for (name, phase), (f, w, a, k) in sorted(merged.items(), key=lambda kv_: _order(kv_[0][0]))]


class _Meta:
    """The model on meta and what every pass needs: its block names, parameter storages, kernels."""

    def __init__(self, config: Any, dtype: str, attention: str | None = None) -> None:
        self.cfg = transformers_config(config)
        self.model = build_on_meta(self.cfg, dtype, attention)
        self.names = block_names(self.model, attention_core_name(self.model))
        self.counts = _block_counts(self.model, self.names)
        self.n_experts = _config_value(self.cfg, EXPERT_KEYS)
        self.top_k = _config_value(self.cfg, TOP_K_KEYS)
        self.total, self.active, self.tensors, self.largest, self.param_ids = _params(
            self.model, self.n_experts, self.top_k)
        head = getattr(self.model, "get_output_embeddings", lambda: None)()
        self.vocab = int(getattr(head, "out_features", 0) or _config_value(self.cfg, ("vocab_size",)))
        self.kinds = layer_kinds(self.model)
        self.latent = _config_value(self.cfg, ("kv_lora_rank",)) > 0
        self.stage = f"{getattr(self.cfg, 'model_type', 'the model')} on the meta device"  # what runs (_tell)

    def ids(self, batch: int, tokens: int) -> torch.Tensor:
        return torch.zeros((batch, tokens), dtype=torch.long, device="meta")

    def run(self, step: Any, counter: FactsCounter, backward: bool = False) -> None:
        """``step()`` counted by ``counter`` with the model's block scopes and the CPU's kernels; each layer's
        forward told to lmprof.progress (layer i of N), the backward as one stage."""
        layers = _layer_stack(self.model)

        def tick(i: int) -> Callable[..., None]:
            return lambda *_: progress.report(f"{self.stage}: forward, layers done", i, len(layers))

        handles = [layer.register_forward_pre_hook(tick(i)) for i, layer in enumerate(layers)]
        try:
            with MetaKernels(), module_scopes(self.model):
                count_flops(step, backward=backward, counter=counter, by_module=False)
        finally:
            for h in handles:
                h.remove()

    def prefill(self, batch: int, tokens: int, cache: Any = None) -> Any:
        """An uncounted prefill (no grad): the cache it returns."""
        if tokens <= 0:
            return cache
        kw = {} if cache is None else {self.cache_keyword: cache}
        with torch.no_grad(), MetaKernels():
            out = self.model(input_ids=self.ids(batch, tokens), use_cache=True, **kw)
        found = returned_cache(out)
        if found is None:
            raise ConfigError(f"{self.cfg.model_type!r} returned no cache when called with use_cache=True: lmprof "
                              "cannot describe its decode step")
        self.cache_keyword = found[0]
        return found[1]

    cache_keyword = "past_key_values"


def _fail(cfg: Any, what: str, exc: BaseException) -> ConfigError:
    from lmprof.errors import first_line

    return ConfigError(f"cannot describe {getattr(cfg, 'model_type', '?')!r}: its {what} failed on the meta device "
                       f"({type(exc).__name__}: {first_line(exc)})")


def describe(config: Any, *, batch: int = 1, seq_len: int = 16, context: int | None = None, dtype: str = "fp32",
             phases: tuple[str, ...] = PHASE_NAMES, memory: bool = True, name: str = "",
             attention: str | None = None, past: int | None = None) -> ModelFacts:
    """Read a causal LM off the meta device (see the module docstring).

    ``config``: a config.json as a dict, or a transformers config. ``seq_len`` tokens per sequence
    (training sequence, prompt); ``context``: the keys a decode step attends to, the cache after
    appending its token (default ``seq_len``), and for a prefill the cache it fills up to (a prompt
    of ``seq_len`` tokens after ``past`` cached ones, by default ``context - seq_len``). ``phases``: any of prefill,
    decode, train. ``memory``: also read the live and saved bytes at ``batch + 1`` (both are affine
    in the batch) for the prefill and training passes asked for. ``dtype``: the model's parameters
    and compute (fp32, bf16, fp16). ``attention``: transformers' attention implementation (default:
    the model's own choice; ``eager`` for the math path). ConfigError (one line) when the model
    cannot be built or run on meta.
    """
    for what, value in (("batch", batch), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    context = seq_len if context is None else context
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ConfigError(f"context must be a positive integer, got {context!r}")
    unknown = [p for p in phases if p not in PHASE_NAMES]
    if unknown:
        raise ConfigError(f"unknown phase {unknown[0]!r}: use prefill, decode or train")
    m = _Meta(config, dtype, attention)
    rows: list[BlockRow] = []
    kw: dict[str, Any] = {}
    if "prefill" in phases:
        past = max(0, context - seq_len) if past is None else past
        prefill_rows, layers, counter = _guarded(m, "prefill", lambda: _prefill(m, batch, seq_len, past))
        rows += prefill_rows
        kw.update(cache=tuple(layers), prefill_live_peak=counter.peak()[0],
                  matmul_weights=sum(p.numel() for p in m.model.parameters() if _sid(p) in counter.matmul_params))
        if memory:
            kw["prefill_live_peak_next"] = _guarded(m, "prefill", lambda: _prefill(m, batch + 1, seq_len, past))[2].peak()[0]
    if "decode" in phases:
        decode_rows, layers = _guarded(m, "decode step", lambda: _decode(m, batch, context))
        rows += decode_rows
        kw.setdefault("cache", tuple(layers))
    if "train" in phases:
        train_rows, kw["train"] = _guarded(m, "training step", lambda: _train(m, batch, seq_len, memory))
        rows += train_rows
    notes = []
    if any(".experts" in p for p, _ in m.model.named_parameters()) and not (m.n_experts and m.top_k):
        notes.append("the model has experts but its config names no expert count or top-k lmprof knows: active "
                     "parameters are counted as total")
    family = str(getattr(m.cfg, "model_type", "") or "")
    return ModelFacts(
        family=family, name=name or family, dtype=dtype, params=m.total, params_active=m.active,
        param_tensors=m.tensors, largest_tensor=m.largest,
        buffer_bytes=sum(b.numel() * b.element_size() for b in m.model.buffers()),
        n_layer=len(m.kinds), hidden=_config_value(m.cfg, ("hidden_size", "n_embd", "d_model")), vocab=m.vocab,
        max_positions=_config_value(m.cfg, ("max_position_embeddings", "n_positions", "max_seq_len")),
        layer_kinds=m.kinds, n_experts=m.n_experts, top_k=m.top_k,
        param_bytes=sum(p.numel() * p.element_size() for p in m.model.parameters()),
        layer_param_bytes=max((sum(p.numel() * p.element_size() for p in layer.parameters())
                               for layer in _layer_stack(m.model)), default=0),
        batch=batch, seq_len=seq_len, context=context, rows=tuple(rows), notes=tuple(notes),
        cache_bytes_per_element=_element_size(m.model), **kw)


T = TypeVar("T")


def _guarded(m: _Meta, what: str, run: Callable[[], T]) -> T:
    """``run()``, its failure on meta as one line naming the model and the pass."""
    _tell(m, what)
    try:
        return run()
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model's own code on meta: one line, not a traceback
        raise _fail(m.cfg, what, exc) from None


def _tell(m: _Meta, what: str) -> None:
    """Say which pass runs (lmprof.progress): a model with a sequential scan (Jamba, RWKV) runs it token by
    token on meta too, a minute or more at full size, and a command that showed nothing looked hung."""
    m.stage = f"{getattr(m.cfg, 'model_type', 'the model')}'s {what} on the meta device"
    progress.report(m.stage)


def _prefill(m: _Meta, batch: int, seq_len: int, past: int) -> tuple[list[BlockRow], list[CacheLayer], FactsCounter]:
    """A counted prefill of ``seq_len`` tokens after ``past`` uncounted ones: rows, the cache it filled, its counter."""
    m.model.eval()
    cache = m.prefill(batch, past)
    counter = FactsCounter(m.param_ids)
    out: dict[str, Any] = {}

    def step() -> Any:
        kw = {} if cache is None else {m.cache_keyword: cache}
        with torch.no_grad():
            out["o"] = m.model(input_ids=m.ids(batch, seq_len), use_cache=True, **kw)
        return out["o"]

    m.run(step, counter)
    found = returned_cache(out.pop("o"))
    if found is None:
        return _rows(counter, m.counts, {"forward": "prefill"}), [], counter
    m.cache_keyword = found[0]
    rows = _rows(counter, m.counts, {"forward": "prefill"}, {counter.key_of(s) for s in cache_storages(found[1])})
    return rows, cache_layers(found[1], batch, past + seq_len, m.kinds, m.latent), counter


def _element_size(model: torch.nn.Module) -> int:
    """Bytes per element of what the model computes in (its cache holds that dtype)."""
    p = next(iter(model.parameters()), None)
    return int(p.element_size()) if p is not None else 4


def _decode(m: _Meta, batch: int, context: int) -> tuple[list[BlockRow], list[CacheLayer]]:
    """One decode step attending to ``context`` keys, through the cache an uncounted prefill filled."""
    m.model.eval()
    cache = m.prefill(batch, context - 1)
    counter = FactsCounter(m.param_ids)
    out: dict[str, Any] = {}
    kw = {} if cache is None else {m.cache_keyword: cache}
    # as generate() feeds it: the new token, or every token so far for a model that slices the cached prefix off itself
    fed = context if cache is not None and wants_whole_sequence(m.model, m.ids(batch, context), kw) else 1

    def step() -> Any:
        with torch.no_grad():
            out["o"] = m.model(input_ids=m.ids(batch, fed), use_cache=True, **kw)
        return out["o"]

    m.run(step, counter)
    found = returned_cache(out.pop("o"))
    after = found[1] if found else None
    rows = _rows(counter, m.counts, {"forward": "decode"},
                 {counter.key_of(s) for s in cache_storages(after)} if after is not None else set())
    return rows, cache_layers(after, batch, context, m.kinds, m.latent) if after is not None else []


def _train_pass(m: _Meta, batch: int, seq_len: int) -> tuple[FactsCounter, dict[int, tuple[str, int]], int, int, int]:
    """One counted training step: (counter, saved storages, event mark at backward, grad storage bytes map size,
    logits bytes)."""
    m.model.train()
    m.model.zero_grad(set_to_none=True)
    for p in m.model.parameters():
        p.requires_grad_(True)
    counter = FactsCounter(m.param_ids)
    ids = m.ids(batch, seq_len)
    marks: dict[str, int] = {}
    logits: dict[str, int] = {}
    saved: dict[int, tuple[str, int]] = {}

    def step() -> Any:
        nonlocal saved
        with saved_tensors(m.param_ids, counter.tracker.current, counter.key_of) as s:
            out = m.model(input_ids=ids, labels=ids)
        saved = s
        lg = getattr(out, "logits", None)
        logits["bytes"] = lg.numel() * lg.element_size() if isinstance(lg, torch.Tensor) else 0
        marks["backward"] = counter.mark()
        progress.report(f"{m.stage}: backward")
        return out.loss

    m.run(step, counter, backward=True)
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in m.model.parameters() if p.grad is not None)
    return counter, saved, marks.get("backward", 0), grad_bytes, logits.get("bytes", 0)


def _train(m: _Meta, batch: int, seq_len: int, memory: bool) -> tuple[list[BlockRow], TrainMemory | None]:
    counter, saved, bwd_mark, _grads, logits = _train_pass(m, batch, seq_len)
    rows = _rows(counter, m.counts, {})
    if not memory:
        m.model.zero_grad(set_to_none=True)
        return rows, None
    grad_keys = {counter.key_of(_sid(p.grad)) for p in m.model.parameters() if p.grad is not None}
    peak, at, grads_at_peak = counter.peak(of=grad_keys)
    by_block: dict[str, int] = {}
    for block, nbytes in saved.values():
        by_block[folded(block)] = by_block.get(folded(block), 0) + nbytes
    m.model.zero_grad(set_to_none=True)
    _tell(m, f"training step at batch {batch + 1} (how memory grows with the batch)")
    counter2, saved2, _, _, _ = _train_pass(m, batch + 1, seq_len)
    peak2 = counter2.peak()[0]
    m.model.zero_grad(set_to_none=True)
    train = TrainMemory(batch=batch, seq_len=seq_len, saved=sum(n for _, n in saved.values()),
                        saved_next=sum(n for _, n in saved2.values()), live_peak=peak, live_peak_next=peak2,
                        grads_at_peak=grads_at_peak, peak_at="forward" if at < bwd_mark else "backward",
                        logits=logits,
                        saved_by_block=tuple(sorted(by_block.items(), key=lambda kv: _order(kv[0]))))
    return rows, train


__all__ = ["describe", "layer_kinds", "EXPERT_KEYS", "TOP_K_KEYS"]
