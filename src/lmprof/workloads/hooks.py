"""Block scopes for models lmprof did not write, placed by module hooks.

A pre-hook opens ``lmprof:<block>`` and a post-hook closes it, so the same attribution that reads
the built-in GPT's scopes reads these. Module paths map to canonical block names for common
families (GPT-2 and GPT-BigCode, nanoGPT's GPT by its module layout, OPT, Falcon, Llama/Mistral/Qwen2/
Gemma/Phi-3 style, Mixtral and Qwen-MoE, Gemma 2/3, Phi-1/2, GPT-NeoX); the attention module's own
work is the attention core and a layer's own work its residual adds. Anything
else is named by its module path with layer indices collapsed and kept apart (``layers.*.fc1[3]``),
so unknown models still get a per-module table (folded over layers) and per-layer rows in blocks.csv.

The model's own forward outside its modules is ``model_glue``, and the loss, wherever the model
computes it, ``loss``.

Hooks are installed only for the profiled phase (:func:`module_scopes` is a context manager), so the
clean timing phase runs the model untouched.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
import sys
from typing import Any, Callable, Iterator

import torch

from lmprof.estimate.families import families
from lmprof.names import LOSS, MODEL_GLUE, SCOPE_PREFIX
from lmprof.workloads.hf_interface import attention_implementation

# (regex on the module path with layer indices replaced by '*', canonical block). First match wins.
GPT2_RULES = [
    (r"(^|\.)wte$|(^|\.)wpe$", "embedding"),
    (r"\.h\.\*\.ln_1$", "ln_1"),
    (r"\.h\.\*\.attn\.c_attn$", "attn.qkv"),
    (r"\.h\.\*\.attn\.c_proj$", "attn.proj"),
    (r"\.h\.\*\.attn$", "@attn"),  # exclusive time = the attention core (scores, softmax, AV)
    (r"\.h\.\*\.ln_2$", "ln_2"),
    (r"\.h\.\*\.mlp\.c_fc$", "mlp.fc"),
    (r"\.h\.\*\.mlp\.(act|gelu)$", "mlp.act"),  # nanoGPT names its activation gelu
    (r"\.h\.\*\.mlp\.c_proj$", "mlp.proj"),
    (r"\.h\.\*$", "residual"),  # exclusive time of a block = its residual adds
    (r"(^|\.)ln_f$", "ln_f"),
    (r"(^|^\.)lm_head$", "lm_head"),
]
LLAMA_RULES = [
    (r"(^|\.)embed_tokens$", "embedding"),
    (r"(^|\.)rotary_emb$", "rope"),
    (r"\.layers\.\*\.input_layernorm$", "ln_1"),
    (r"\.layers\.\*\.self_attn\.(q_proj|k_proj|v_proj|qkv_proj)$", "attn.qkv"),
    (r"\.layers\.\*\.self_attn\.o_proj$", "attn.proj"),
    (r"\.layers\.\*\.self_attn\.rotary_emb$", "rope"),
    (r"\.layers\.\*\.self_attn$", "@attn"),
    (r"\.layers\.\*\.post_attention_layernorm$", "ln_2"),
    (r"\.layers\.\*\.mlp\.(gate_proj|up_proj|gate_up_proj)$", "mlp.fc"),
    (r"\.layers\.\*\.mlp\.(act_fn|activation_fn)$", "mlp.act"),
    (r"\.layers\.\*\.mlp\.down_proj$", "mlp.proj"),
    (r"\.layers\.\*\.mlp$", "mlp.act"),  # exclusive: the gate multiply of SwiGLU
    (r"\.layers\.\*$", "residual"),
    (r"(^|\.)norm$", "ln_f"),
    (r"(^|^\.)lm_head$", "lm_head"),
]
# Gemma 2/3 norm the attention and MLP outputs too: norms around attention are ln_1, around the MLP ln_2.
GEMMA2_RULES = [
    (r"\.layers\.\*\.post_attention_layernorm$", "ln_1"),
    (r"\.layers\.\*\.(pre|post)_feedforward_layernorm$", "ln_2"),
    *LLAMA_RULES,
]
# Phi-1/2: attention and MLP in parallel after one norm; dense is the attention output projection.
PHI_RULES = [
    (r"(^|\.)embed_tokens$", "embedding"),
    (r"(^|\.)rotary_emb$", "rope"),
    (r"\.layers\.\*\.input_layernorm$", "ln_1"),
    (r"\.layers\.\*\.self_attn\.(q_proj|k_proj|v_proj)$", "attn.qkv"),
    (r"\.layers\.\*\.self_attn\.dense$", "attn.proj"),
    (r"\.layers\.\*\.self_attn$", "@attn"),
    (r"\.layers\.\*\.mlp\.fc1$", "mlp.fc"),
    (r"\.layers\.\*\.mlp\.activation_fn$", "mlp.act"),
    (r"\.layers\.\*\.mlp\.fc2$", "mlp.proj"),
    (r"\.layers\.\*$", "residual"),
    (r"(^|\.)final_layernorm$", "ln_f"),
    (r"(^|^\.)lm_head$", "lm_head"),
]
GPT_NEOX_RULES = [
    (r"(^|\.)embed_in$", "embedding"),
    (r"(^|\.)rotary_emb$", "rope"),
    (r"\.layers\.\*\.input_layernorm$", "ln_1"),
    (r"\.layers\.\*\.attention\.query_key_value$", "attn.qkv"),
    (r"\.layers\.\*\.attention\.dense$", "attn.proj"),
    (r"\.layers\.\*\.attention\.rotary_emb$", "rope"),
    (r"\.layers\.\*\.attention$", "@attn"),
    (r"\.layers\.\*\.post_attention_layernorm$", "ln_2"),
    (r"\.layers\.\*\.mlp\.dense_h_to_4h$", "mlp.fc"),
    (r"\.layers\.\*\.mlp\.act$", "mlp.act"),
    (r"\.layers\.\*\.mlp\.dense_4h_to_h$", "mlp.proj"),
    (r"\.layers\.\*$", "residual"),
    (r"(^|\.)final_layer_norm$", "ln_f"),
    (r"(^|^\.)(lm_head|embed_out)$", "lm_head"),
]
# OPT: per-layer norms are self_attn_layer_norm and final_layer_norm; the decoder's own final norm is ln_f.
OPT_RULES = [
    (r"(^|\.)embed_tokens$|(^|\.)embed_positions$", "embedding"),
    (r"\.layers\.\*\.self_attn_layer_norm$", "ln_1"),
    (r"\.layers\.\*\.self_attn\.(q_proj|k_proj|v_proj)$", "attn.qkv"),
    (r"\.layers\.\*\.self_attn\.out_proj$", "attn.proj"),
    (r"\.layers\.\*\.self_attn$", "@attn"),
    (r"\.layers\.\*\.final_layer_norm$", "ln_2"),
    (r"\.layers\.\*\.fc1$", "mlp.fc"),
    (r"\.layers\.\*\.activation_fn$", "mlp.act"),
    (r"\.layers\.\*\.fc2$", "mlp.proj"),
    (r"\.layers\.\*$", "residual"),
    (r"\.decoder\.final_layer_norm$", "ln_f"),
    (r"(^|^\.)lm_head$", "lm_head"),
]
# Falcon: one norm (input_layernorm) or two (ln_attn, ln_mlp) per layer in the parallel layouts.
FALCON_RULES = [
    (r"(^|\.)word_embeddings$", "embedding"),
    (r"(^|\.)rotary_emb$", "rope"),
    (r"\.h\.\*\.(input_layernorm|ln_attn)$", "ln_1"),
    (r"\.h\.\*\.(post_attention_layernorm|ln_mlp)$", "ln_2"),
    (r"\.h\.\*\.self_attention\.query_key_value$", "attn.qkv"),
    (r"\.h\.\*\.self_attention\.dense$", "attn.proj"),
    (r"\.h\.\*\.self_attention$", "@attn"),
    (r"\.h\.\*\.mlp\.dense_h_to_4h$", "mlp.fc"),
    (r"\.h\.\*\.mlp\.act$", "mlp.act"),
    (r"\.h\.\*\.mlp\.dense_4h_to_h$", "mlp.proj"),
    (r"\.h\.\*$", "residual"),
    (r"(^|\.)ln_f$", "ln_f"),
    (r"(^|^\.)lm_head$", "lm_head"),
]
# Mixtral / Qwen-MoE style: the router (gate) is moe.router; the routed experts run their up/gate and
# down matmuls inside one module, which module hooks cannot split: moe.experts (its activation child
# is mlp.act), and the sparse block's own dispatch and combine go with them. Shared experts are a
# dense MLP. "@mlp": a layer whose mlp has experts is an MoE layer, else a dense one (SwiGLU's gate
# multiply, mlp.act), as in Qwen-MoE's dense-only layers.
MOE_RULES = [
    (r"\.layers\.\*\.mlp\.(gate|router)$", "moe.router"),
    (r"\.layers\.\*\.mlp\.experts\.act_fn$", "mlp.act"),
    (r"\.layers\.\*\.mlp\.experts$", "moe.experts"),
    (r"\.layers\.\*\.mlp\.shared_experts?\.(gate_proj|up_proj)$", "mlp.fc"),
    (r"\.layers\.\*\.mlp\.shared_experts?\.act_fn$", "mlp.act"),
    (r"\.layers\.\*\.mlp\.shared_experts?\.down_proj$", "mlp.proj"),
    (r"\.layers\.\*\.mlp\.shared_expert_gate$", "mlp.fc"),
    (r"\.layers\.\*\.mlp\.shared_experts?$", "mlp.act"),  # a dense gated MLP's own work: the gate multiply
    (r"\.layers\.\*\.mlp$", "@mlp"),
    *LLAMA_RULES,
]
# The rule sets by name; which family gets which is its record's ``blocks`` (estimate/families.py).
RULE_SETS: dict[str, list[tuple[str, str]]] = {
    "gpt2": GPT2_RULES, "llama": LLAMA_RULES, "gemma2": GEMMA2_RULES, "phi": PHI_RULES, "gpt_neox": GPT_NEOX_RULES,
    "opt": OPT_RULES, "falcon": FALCON_RULES, "moe": MOE_RULES,
}
FAMILIES = {name: RULE_SETS[rec.blocks] for name, rec in families().items() if rec.blocks}
# A model without a known model_type whose modules are laid out like GPT-2 (nanoGPT's GPT: transformer.h.N
# with attn.c_attn and mlp.c_fc) gets GPT-2's names, so its attention core and residual adds are blocks.
_GPT2_LAYOUT = (re.compile(r"\.h\.\*\.attn\.c_attn$"), re.compile(r"\.h\.\*\.mlp\.c_fc$"))


def family_of(model: torch.nn.Module) -> str | None:
    """The model family key for block mapping (Hugging Face ``config.model_type``, else a GPT-2 module layout)."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type in FAMILIES:
        return str(model_type)
    modules = dict(model.named_modules())
    paths = ["." + _collapse(p, modules) for p in modules if p]
    if all(any(rx.search(p) for p in paths) for rx in _GPT2_LAYOUT):
        return "gpt2"
    return None


def _collapse(path: str, modules: dict[str, torch.nn.Module]) -> str:
    """Replace indices into an nn.ModuleList (layer stacks) with '*': layers.3.fc -> layers.*.fc.

    Positions inside an nn.Sequential name different modules (Linear vs activation) and stay.
    """
    return _split_layers(path, modules)[0]


def _split_layers(path: str, modules: dict[str, torch.nn.Module]) -> tuple[str, list[str]]:
    """The collapsed path and the layer-stack indices it replaced (outermost first)."""
    parts = path.split(".")
    indices = []
    for i, part in enumerate(parts):
        parent = modules.get(".".join(parts[:i]))
        if part.isdigit() and isinstance(parent, torch.nn.ModuleList):
            parts[i] = "*"
            indices.append(part)
    return ".".join(parts), indices


def _per_layer_name(path: str, modules: dict[str, torch.nn.Module]) -> str:
    """layers.3.fc -> layers.*.fc[3]: tables fold the layers (lmprof.names.folded), records keep them."""
    collapsed, indices = _split_layers(path, modules)
    return f"{collapsed}[{','.join(indices)}]" if indices else collapsed


_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def block_names(model: torch.nn.Module, attention_core: str = "attn.core") -> dict[str, str]:
    """Module path -> block name for every module that gets a scope."""
    family = family_of(model)
    rules = [(re.compile(rx), name) for rx, name in FAMILIES.get(family or "", [])]
    modules = dict(model.named_modules())
    if not rules and isinstance(getattr(getattr(model, "config", None), "model_type", None), str):
        return generic_names(modules, attention_core)
    names: dict[str, str] = {}
    for path, module in modules.items():
        if not path:
            continue
        collapsed = "." + _collapse(path, modules)
        if rules:
            for rx, name in rules:
                if rx.search(collapsed):
                    if name == "@attn":
                        name = attention_core
                    elif name == "@mlp":
                        name = "moe.experts" if hasattr(module, "experts") else "mlp.act"
                    names[path] = name
                    break
        elif not isinstance(module, _CONTAINERS):
            # unknown model: every module by its path, each row its own time outside its children (attribution
            # takes the innermost range): a leaf's all of it; an attention module's the attention itself
            # between its projections (F.scaled_dot_product_attention; nn.MultiheadAttention's input
            # projection too, from its own in_proj_weight); a layer's its residual adds. Containers that only
            # chain their children have nothing of their own to show
            names[path] = _per_layer_name(path, modules)
    return names


# -- Hugging Face families without rules of their own: mixers, MoE and MLPs named by what they are ------------
# A layer of a hybrid model holds one or more *mixers* (attention, linear attention, a state-space model, a
# short convolution) and an MLP or a mixture of experts. Which one a module is shows in its class name
# (transformers names them for what they compute); inside it, the projections in and out by their names.
# Each rule: (regex on the module's class name, what it is). First match wins.
MIXER_CLASSES: tuple[tuple[str, str], ...] = (
    (r"DeltaNet|DeltaAttention|LinearAttention|LightningAttention|KimiDelta|GatedLinear", "linear_attn"),
    (r"Mamba|Mixer$|SSM|Rwkv|RecurrentBlock|LSTM|xLSTM", "ssm"),
    (r"ShortConv|Hyena", "conv"),
    (r"Attention|Attn", "attn"),
    (r"Moe|MoE|SparseMoe|MixtureOfExperts|Experts?Block", "moe"),
    (r"MLP|Mlp|FeedForward|FFN|Ffn", "mlp"),
)
# Leaf names inside a mixer or an MLP, matched on the last path component.
_OUT_PROJ = re.compile(r"^(o_proj|out_proj|dense|c_proj|o|wo|out|output_proj|proj_out)$")
_MLP_DOWN = re.compile(r"^(down_proj|fc2|w2|c_proj|dense_4h_to_h|wo|out_proj|output)$")
_ROUTER = re.compile(r"^(gate|router|gating|wg)$")
_SHARED = re.compile(r"^shared_experts?$|^shared_mlp$")
_NORM = re.compile(r"norm", re.I)


def _kind(module: torch.nn.Module) -> str | None:
    cls = type(module).__name__
    for rx, kind in MIXER_CLASSES:
        if re.search(rx, cls):
            return kind
    return "moe" if hasattr(module, "experts") and hasattr(module, "gate") else None


def _inside(kind: str, rel: str, module: torch.nn.Module, attention_core: str) -> str:
    """The block of a module ``rel`` (its path below a ``kind`` module; '' for the module itself)."""
    last = rel.rsplit(".", 1)[-1]
    leaf = not any(True for _ in module.children())
    if kind == "attn":
        if not rel:
            return attention_core
        if "rotary" in last:
            return "rope"
        return "attn.proj" if _OUT_PROJ.match(last) else "attn.qkv"
    if kind in ("linear_attn", "ssm", "conv"):
        if not rel or not leaf:
            return f"{kind}.core"
        if isinstance(module, torch.nn.Conv1d):
            return f"{kind}.conv"
        if isinstance(module, torch.nn.Linear):
            return f"{kind}.out_proj" if _OUT_PROJ.match(last) else f"{kind}.in_proj"
        return f"{kind}.core"
    if kind == "moe":
        first = rel.split(".", 1)[0]
        if not rel:
            return "moe.experts"  # the block's own dispatch and combine
        if _ROUTER.match(first) or "router" in type(module).__name__.lower():
            return "moe.router"
        if first == "experts":
            return "mlp.act" if rel != "experts" and "act" in last else "moe.experts"
        if first.startswith("shared_expert") and first.endswith("_gate"):
            return "mlp.fc"  # the shared expert's sigmoid gate (d -> 1)
        if _SHARED.match(first):
            return _inside("mlp", rel.split(".", 1)[1] if "." in rel else "", module, attention_core)
        return "moe.experts"
    # mlp
    if not rel or "act" in last:
        return "mlp.act"
    return "mlp.proj" if _MLP_DOWN.match(last) else "mlp.fc"


def generic_names(modules: dict[str, torch.nn.Module], attention_core: str = "attn.core") -> dict[str, str]:
    """Block names for a Hugging Face model of a family without rules: canonical where a module's class says
    what it is (mixers, MoE, MLPs, norms, embeddings, the lm_head), the per-layer module path otherwise.

    Each layer of the stack is ``residual`` (its own adds); inside it, a mixer and everything below it
    take the mixer's names (``attn.*``, ``linear_attn.*``, ``ssm.*``, ``conv.*``), an MoE block
    ``moe.router``/``moe.experts`` with shared experts as a dense MLP, an MLP ``mlp.fc/act/proj``; the
    layer's norms are ``ln_1`` (the first) and ``ln_2``. Outside the stack: embeddings, ``rope``,
    norms (``ln_f``) and ``lm_head``.
    """
    names: dict[str, str] = {}
    layers = {p for p in modules if p and _split_layers(p, modules)[0].endswith("*")}
    for path, module in modules.items():
        if not path:
            continue
        leaf = not any(True for _ in module.children())
        if path in layers:
            names[path] = "residual"
            continue
        layer = next((p for p in sorted(layers, key=len, reverse=True) if path.startswith(p + ".")), None)
        last = path.rsplit(".", 1)[-1]
        if layer is None:
            if isinstance(module, torch.nn.Embedding):
                names[path] = "embedding"
            elif last == "lm_head" or path.endswith(".lm_head"):
                names[path] = "lm_head"
            elif "rotary" in last:
                names[path] = "rope"
            elif leaf and _NORM.search(type(module).__name__ + last):
                names[path] = "ln_f"
            elif leaf:
                names[path] = _per_layer_name(path, modules)
            continue
        # The outermost classified module between the layer and this one decides the kind.
        rel = path[len(layer) + 1:]
        parts = rel.split(".")
        owner = None
        for i in range(1, len(parts) + 1):
            sub = layer + "." + ".".join(parts[:i])
            kind = _kind(modules[sub])
            if kind is not None:
                owner = (kind, ".".join(parts[i:]))
                break
        if owner is not None:
            names[path] = _inside(owner[0], owner[1], module, attention_core)
        elif leaf and _NORM.search(type(module).__name__ + last) and len(parts) == 1:
            first_norm = next(p for p in modules if p.startswith(layer + ".") and "." not in p[len(layer) + 1:]
                              and _NORM.search(type(modules[p]).__name__ + p.rsplit(".", 1)[-1]))
            names[path] = "ln_1" if path == first_norm else "ln_2"
        elif leaf:
            names[path] = _per_layer_name(path, modules)
    return names


def takes_hooks(module: torch.nn.Module) -> bool:
    """False for a TorchScript module: it refuses forward hooks (so no scope can be placed in it)."""
    return not isinstance(module, torch.jit.ScriptModule)


def unwrap(module: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The module that really runs, and whether it is compiled (torch.compile or Module.compile)."""
    compiled = False
    while True:
        inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(inner, torch.nn.Module):
            module, compiled = inner, True
            continue
        inner = getattr(module, "module", None)  # DistributedDataParallel, DataParallel
        if isinstance(inner, torch.nn.Module) and isinstance(
                module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            module = inner
            continue
        break
    return module, compiled or compiled_inside(module)


def compiled_wrapper(module: torch.nn.Module) -> torch.nn.Module | None:
    """The live ``torch.compile`` wrapper of ``module``, where a framework compiled the model it hands on
    uncompiled (the HF Trainer's ``torch_compile=True``: accelerate compiles it and keeps the wrapper);
    None: there is none. Reads every live object once (0.05-0.15 s)."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.eval_frame import OptimizedModule

    from lmprof.workloads.live import live_objects

    return next((w for w in live_objects(OptimizedModule) if getattr(w, "_orig_mod", None) is module), None)


def never_compiled(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` (one lmprof places on a user's module) run eagerly even inside a user's compiled code: a hook
    in a module whose call is compiled (transformers' generate() compiles the model's whole call for a
    static cache) is otherwise traced, lmprof's own state becomes a guard, and each step that changes it
    compiles again (129 frames for 1). Costs 0.4 µs a call. In a process that has not imported dynamo
    nothing compiles, and ``hook`` is returned as it is (importing dynamo costs over a second)."""
    if "torch._dynamo" not in sys.modules:
        return hook
    disabled: Callable[..., Any] = torch.compiler.disable(hook)  # type: ignore[no-untyped-call]  # torch's own signature
    return disabled


def compiled_inside(module: torch.nn.Module) -> bool:
    """Whether ``module`` or one of its submodules runs compiled code without a wrapper around it:
    ``Module.compile()``, or a ``forward`` replaced by (or defined as) a ``torch.compile``'d function, as
    Hugging Face's static-cache recipe does (``model.forward = torch.compile(model.forward)``). A hook
    placed inside such code is traced into it, and placing or removing one makes dynamo compile again."""
    for m in module.modules():
        if not takes_hooks(m):
            continue
        if getattr(m, "_compiled_call_impl", None) is not None:
            return True
        # as stored, the instance's or the class's: reading it through the class runs descriptors
        forward = inspect.getattr_static(m, "forward", None)
        if getattr(forward, "_torchdynamo_orig_callable", None) is not None:
            return True
    return False


def attention_core_name(model: torch.nn.Module) -> str:
    """attn.sdpa when the model runs fused attention, else attn.core (scores + softmax + AV)."""
    impl = attention_implementation(model)
    return "attn.sdpa" if impl in ("sdpa", "flash_attention_2", "flex_attention") else "attn.core"


class _LossScope:
    """``lmprof:loss`` around the loss wherever the model computes it: transformers' ``loss_function``
    (its upcast, label shift and cross-entropy) and ``torch.nn.functional.cross_entropy`` (nanoGPT-style
    forwards). Not nested in itself: transformers' loss calls cross_entropy."""

    def __init__(self) -> None:
        self.depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            try:
                with torch.profiler.record_function(SCOPE_PREFIX + LOSS):
                    return fn(*args, **kwargs)
            finally:
                self.depth -= 1

        return scoped


@contextlib.contextmanager
def _loss_scoped(model: torch.nn.Module) -> Iterator[None]:
    loss = _LossScope()
    functional = torch.nn.functional
    original_ce = functional.cross_entropy
    ours = functional.cross_entropy = loss.wrap(original_ce)
    # transformers' PreTrainedModel.loss_function is a property whose setter keeps an override in
    # _loss_function: only models with that setter are touched, and the override is undone exactly.
    prop = next((vars(k)["loss_function"] for k in type(model).__mro__ if "loss_function" in vars(k)), None)
    had = "_loss_function" in vars(model)
    before = vars(model).get("_loss_function")
    ours_loss: Callable[..., Any] | None = None
    # Reading the property for a model whose loss_type transformers does not know logs a warning to
    # the user's stderr: such a model is left alone (its cross_entropy still gets the scope).
    known = getattr(sys.modules.get("transformers.loss.loss_utils"), "LOSS_MAPPING", {})
    if (isinstance(prop, property) and prop.fset is not None and prop.fget is not None
            and (had or getattr(model, "loss_type", None) in known)):
        try:
            ours_loss = loss.wrap(prop.fget(model))
            prop.fset(model, ours_loss)
        except Exception:  # noqa: BLE001 - no loss scope is better than a broken model
            ours_loss = None
    try:
        yield
    finally:
        if functional.cross_entropy is ours:  # a script that replaced it meanwhile keeps its own
            functional.cross_entropy = original_ce
        if ours_loss is not None and vars(model).get("_loss_function") is ours_loss:
            if had:
                vars(model)["_loss_function"] = before
            else:
                vars(model).pop("_loss_function", None)


_quiet = False  # module_scopes' hooks place no ranges (blocks_quiet)


@contextlib.contextmanager
def blocks_quiet() -> Iterator[None]:
    """Within the block, the hooks :func:`module_scopes` placed open no ranges: a span the caller
    times as one row (a training step's ``generate()``, an RL loop's rollout)."""
    global _quiet
    before, _quiet = _quiet, True
    try:
        yield
    finally:
        _quiet = before


class _RangeHooks:
    """Forward hooks that open an ``lmprof:<name>`` range as a module's forward begins and close it as it
    ends (on every exit: ``always_call``), silent within :func:`blocks_quiet`."""

    def __init__(self) -> None:
        # record_function's own __enter__/__exit__ are unannotated: held as the context managers they are
        self._open: dict[int, list[contextlib.AbstractContextManager[object]]] = {}

    def pre(self, name: str) -> Callable[[torch.nn.Module, object], None]:
        def hook(module: torch.nn.Module, args: object) -> None:
            if _quiet:  # inside a span that is one row (a training step's generate())
                return
            rf: contextlib.AbstractContextManager[object] = torch.profiler.record_function(SCOPE_PREFIX + name)
            rf.__enter__()
            self._open.setdefault(id(module), []).append(rf)

        return hook

    def post(self, module: torch.nn.Module, args: object, output: object) -> None:
        stack = self._open.get(id(module))
        if stack and not _quiet:
            stack.pop().__exit__(None, None, None)


@contextlib.contextmanager
def named_scopes(modules: list[torch.nn.Module], name: str) -> Iterator[None]:
    """One scope, ``name``, around every forward of each of ``modules`` for the duration of the ``with``
    body (other models a step runs beside the profiled one: their row)."""
    hooks, handles = _RangeHooks(), []
    try:
        for m in modules:
            if takes_hooks(m):
                handles.append(m.register_forward_pre_hook(never_compiled(hooks.pre(name))))
                handles.append(m.register_forward_hook(never_compiled(hooks.post), always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def module_scopes(model: torch.nn.Module) -> Iterator[dict[str, str]]:
    """Install scope hooks on ``model``'s modules for the duration of the ``with`` body.

    The model itself gets ``model_glue``: its own forward's time outside its modules (mask building,
    position adds, output objects). Its closing hook runs before any other forward hook of the model,
    so a phase that a caller's hook opens or closes there nests around it, never across.
    """
    names = block_names(model, attention_core_name(model))
    modules = dict(model.named_modules())
    handles = []
    hooks = _RangeHooks()
    try:  # a hook refused half-way (a TorchScript submodule) takes the ones already placed with it
        handles.append(model.register_forward_pre_hook(hooks.pre(MODEL_GLUE)))
        handles.append(model.register_forward_hook(hooks.post, always_call=True, prepend=True))
        for path, name in names.items():
            m = modules[path]
            if not takes_hooks(m):  # its time stays its parent's
                continue
            handles.append(m.register_forward_pre_hook(hooks.pre(name)))
            handles.append(m.register_forward_hook(hooks.post, always_call=True))
        with _loss_scoped(model):
            yield names
    finally:
        for h in handles:
            h.remove()
