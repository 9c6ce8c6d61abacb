"""Build a transformers causal LM on the meta device, and run it there as the CPU would run it.

A model built under ``torch.device("meta")`` has every shape and no storage: it builds in well under
a second at any size and runs its forward and backward through the same Python code as a real one,
so FlopCounterMode and saved-tensor hooks see the same ops. Two kernels differ on meta, and
:class:`MetaKernels` makes them behave as on a CPU:

* ``F.scaled_dot_product_attention`` picks its kernel by device; on meta it would always run the
  math path (two batched matmuls forward, four backward), where a CPU runs the fused flash kernel
  whenever torch's own rule allows (FlopCounterMode counts its backward as five matmuls: the scores
  are recomputed). The CPU's choice is asked of torch itself (``torch._fused_sdp_choice`` on
  storage-less stand-ins of the same shapes), and the flash kernel's op is called when it is the one.
* ``aten._grouped_mm`` (mixture-of-experts layers) has a meta kernel for bf16 only: fp32 inputs are
  cast to bf16 below every counter and the result cast back, so counters and autograd see the op as
  it was called.

A model that asks a yes/no question of its data (``pad_token_id in input_ids``, ``mask.all()``) gets
"no" on meta, what a run on random tokens without padding sees; one that needs a number from its
data (expert counts as a Python list) cannot run on meta and is refused with one line.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lmprof.errors import ConfigError, first_line
from lmprof.estimate.models import check_config_sizes
from lmprof.workloads.precision import TORCH_DTYPES

_FLASH = 1  # torch's SDPBackend.FLASH_ATTENTION


def transformers_config(config: Any) -> Any:
    """A transformers config from a config.json dict (or a config object, returned as it is).

    ConfigError (one line) when transformers does not know the ``model_type`` or refuses the values.
    """
    from lmprof.workloads.hf import _transformers, refusals

    tf = _transformers()
    if isinstance(config, tf.PretrainedConfig):
        return config
    if not isinstance(config, Mapping):
        raise ConfigError(f"a model config must be a JSON object, got {type(config).__name__}")
    kw = {k: v for k, v in config.items() if k not in ("architectures", "transformers_version", "auto_map")}
    model_type = str(kw.pop("model_type", "") or "")
    if not model_type:
        raise ConfigError("the config has no model_type: lmprof cannot tell which transformers model it describes")
    check_config_sizes(config)
    try:
        return tf.AutoConfig.for_model(model_type, **kw)
    except refusals() as exc:
        raise ConfigError(f"transformers {tf.__version__} cannot read this {model_type!r} config: "
                          f"{first_line(exc)}") from None


def build_on_meta(config: Any, dtype: str = "fp32", attention: str | None = None) -> torch.nn.Module:
    """The causal LM of ``config`` on the meta device in ``dtype``; ConfigError (one line) naming why not.

    ``attention``: transformers' attention implementation (``sdpa``, ``eager``); None: its default.
    """
    from lmprof.workloads.hf import _dtype_kw, _transformers

    if dtype not in TORCH_DTYPES:
        raise ConfigError(f"the describer builds models in {', '.join(TORCH_DTYPES)}, not {dtype!r}")
    tf = _transformers()
    cfg = transformers_config(config)
    model_type = getattr(cfg, "model_type", "?")
    if type(cfg) not in tf.AutoModelForCausalLM._model_mapping:  # noqa: SLF001 - transformers' own registry
        raise ConfigError(f"{model_type!r} is not a causal language model transformers {tf.__version__} can build "
                          "(no AutoModelForCausalLM class for it)")
    try:
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(
                cfg, **_dtype_kw(tf, TORCH_DTYPES[dtype]), **({"attn_implementation": attention} if attention else {}))
    except Exception as exc:  # noqa: BLE001 - transformers raises anything; the user gets one line
        raise ConfigError(f"cannot build {model_type!r} from this config with transformers {tf.__version__}: "
                          f"{type(exc).__name__}: {first_line(exc)}") from None
    assert isinstance(model, torch.nn.Module)
    if any(not t.is_meta for t in (*model.parameters(), *model.buffers())):
        # A factory the device context does not reach (DiffLlama's lambdas: torch.normal(mean, std, size))
        # left a tensor on the CPU, which a backward on meta cannot send its gradient to.
        model.to(torch.device("meta"))
    return model


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of ``t``'s shape, dtype, last-dimension layout and grad requirement, one row of storage."""
    if t.dim() == 0:
        out = torch.empty((), dtype=t.dtype)
    else:
        last = t.shape[-1]
        strides = [0] * (t.dim() - 1) + [1 if t.stride(-1) == 1 else t.stride(-1)]
        out = torch.empty(max(1, last * strides[-1]), dtype=t.dtype).as_strided(tuple(t.shape), tuple(strides))
    return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out


def _meta_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """SDPA on meta tensors through the kernel a CPU would choose for the same arguments."""
    mask = None if attn_mask is None else _stand_in(attn_mask)
    choice = torch._fused_sdp_choice(  # torch's own kernel rule
        _stand_in(query), _stand_in(key), _stand_in(value), attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, enable_gqa=enable_gqa)
    if choice != _FLASH:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # The CPU composite turns a boolean mask into an additive one before the flash kernel.
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            attn_mask.logical_not(), -math.inf)
    out: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    return out


class _CpuAttention(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            return _meta_sdpa(*args, **kwargs)
        return func(*args, **kwargs)


_SCALAR = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}


class _MetaOps(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init_subclass__ unannotated
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _SCALAR and args[0].is_meta and args[0].dtype == torch.bool:
            # A yes/no question about the data ("is there padding", "any image token"): a run on random
            # tokens without padding answers no. Numbers (counts, sizes) stay unanswerable on meta.
            return False
        if func is torch.ops.aten._grouped_mm.default and args[0].is_meta and args[0].dtype != torch.bfloat16:
            dtype = args[0].dtype
            a, b = args[0].to(torch.bfloat16), args[1].to(torch.bfloat16)
            return func(a, b, *args[2:], **kwargs).to(dtype)
        return func(*args, **kwargs)


class MetaKernels:
    """Context manager: SDPA and grouped matmuls on meta tensors as a CPU runs them (module docstring).

    Enter it outside any counting mode, so that the counters see the ops the model called.
    """

    def __init__(self) -> None:
        self._attention = _CpuAttention()
        self._grouped = _MetaOps()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated

    def __enter__(self) -> MetaKernels:
        self._grouped.__enter__()  # type: ignore[no-untyped-call]  # torch's modes are unannotated
        self._attention.__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        self._attention.__exit__(*exc)  # type: ignore[no-untyped-call]
        self._grouped.__exit__(*exc)  # type: ignore[no-untyped-call]
