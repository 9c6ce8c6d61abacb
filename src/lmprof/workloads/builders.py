"""Workload builders: the built-in GPT and Hugging Face models, for training and for inference.

Each builder turns a validated config into a workload (what runs) plus the facts about the model
that go into the run record; nothing here measures anything.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator

import torch

from lmprof.config import DEFAULT_SEQ_LEN, InferConfig, ModelSpec, TrainConfig
from lmprof.errors import ConfigError, DataError
from lmprof.hardware.devices import Device
from lmprof.workloads.blocks import model_scopes
from lmprof.workloads.data import CharDataset, SyntheticBatches, random_tokens
from lmprof.workloads.decoding import Decoder, GPTDecoder, HFDecoder, decoder_for
from lmprof.workloads.gpt import GPT
from lmprof.workloads.gpt_config import GPTConfig, preset
from lmprof.workloads.hf_interface import attention_implementation, training_dropout
from lmprof.workloads.inference import InferWorkload
from lmprof.workloads.precision import TORCH_DTYPES
from lmprof.workloads.training import TrainWorkload

if TYPE_CHECKING:  # lmprof.workloads.hf is imported where a Hugging Face model is wanted
    from lmprof.workloads.hf import HFModel

Wrap = Callable[[torch.nn.Module], torch.nn.Module]

FUSED_NOTE = ("each compiled kernel's time goes to the blocks its ops came from (inductor's provenance; built-in "
              "GPT only); a kernel that fused several blocks is split among them by their FLOPs in it, else the "
              "bytes their ops write ('fused ms' column; tables.fused_kernels lists each fused kernel and its split)")


def gpt_config(spec: ModelSpec, vocab_size: int | None = None) -> GPTConfig:
    """The built-in GPT's config: the preset with the spec's overrides (``vocab_size`` wins if given)."""
    return preset(spec.preset, n_layer=spec.n_layer, n_head=spec.n_head, n_embd=spec.n_embd,
                  block_size=spec.block_size, vocab_size=vocab_size if vocab_size is not None else spec.vocab_size,
                  dropout=spec.dropout, bias=spec.bias, attention=spec.attention)


def train_workload(cfg: TrainConfig, device: Device, wrap: Wrap | None = None) -> tuple[TrainWorkload, dict[str, Any]]:
    """The model to train (built-in GPT or Hugging Face), its data and optimizer; plus config facts."""
    if cfg.hf and cfg.hf_config:
        raise ConfigError("give either --hf or --hf-config, not both")
    if cfg.hf or cfg.hf_config:
        return hf_train_workload(cfg, device, wrap)
    work, gcfg = gpt_train_workload(cfg, device, wrap)
    return work, {"model": gcfg.to_dict()}


def _optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)


def _maybe_compile(cfg: TrainConfig, model: torch.nn.Module, notes: list[str]) -> torch.nn.Module:
    if not cfg.compile:
        return model
    notes.append("torch.compile: " + FUSED_NOTE + "; what no kernel record names stays in the phase's 'other'")
    compiled = torch.compile(model, mode=cfg.compile_mode)
    assert isinstance(compiled, torch.nn.Module)  # a compiled Module is an OptimizedModule (typed as a callable)
    return compiled


def gpt_train_workload(cfg: TrainConfig, device: Device, wrap: Wrap | None = None) -> tuple[TrainWorkload, GPTConfig]:
    """The built-in GPT, its data and optimizer, for a TrainConfig (``wrap``: e.g. DDP)."""
    data = None
    vocab = cfg.vocab_size
    if cfg.data:
        seq_guess = cfg.seq_len or DEFAULT_SEQ_LEN.get(cfg.preset, 64)
        data = CharDataset(cfg.data, cfg.batch_size, seq_guess, seed=cfg.seed)
        vocab = data.vocab_size
    gcfg = gpt_config(cfg, vocab_size=vocab)
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
        out: tuple[torch.Tensor, torch.Tensor] = fwd_model(x, y)  # GPT.forward's (logits, loss), targets given
        return out[1]

    work = TrainWorkload(
        model=model, optimizer=_optimizer(cfg, model), batches=batches, device=device, loss_fn=loss_fn,
        tokens_per_step=cfg.batch_size * seq_len, shape=gcfg.shape(), batch_size=cfg.batch_size, seq_len=seq_len,
        attention=gcfg.attention, optimizer_name=cfg.optimizer, dropout=gcfg.dropout, notes=notes,
    )
    return work, gcfg


def hf_train_workload(cfg: TrainConfig, device: Device, wrap: Wrap | None = None) -> tuple[TrainWorkload, dict[str, Any]]:
    """A Hugging Face causal LM (local, cached, or from a config) trained on synthetic tokens."""
    from lmprof.workloads import hf as hfmod
    from lmprof.workloads.hooks import module_scopes

    if cfg.data:
        raise ConfigError("--data trains the built-in GPT on characters; Hugging Face models train on synthetic tokens")
    loaded = _load_hf(cfg, torch.float32, cfg.seed)  # fp32 master weights, autocast does the rest
    model = loaded.model.to(device.torch_device).train()
    context = hfmod.context_length(model) or 1024
    vocab, special = hfmod.token_space(model)
    seq_len = cfg.seq_len or min(64, context)
    if seq_len > context:
        raise ConfigError(f"seq_len {seq_len} exceeds the model's context of {context}")
    impl = attention_implementation(model) or "eager"
    notes: list[str] = []
    fwd_model = _maybe_compile(cfg, wrap(model) if wrap else model, notes)

    def loss_fn(_: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, _y = batch
        loss: torch.Tensor = fwd_model(input_ids=x, labels=x).loss  # transformers shifts the labels itself
        return loss

    work = TrainWorkload(
        model=model, optimizer=_optimizer(cfg, model),
        batches=SyntheticBatches(vocab, cfg.batch_size, seq_len, cfg.seed, avoid=special),
        device=device, loss_fn=loss_fn, tokens_per_step=cfg.batch_size * seq_len, shape=hfmod.shape_of(model),
        batch_size=cfg.batch_size, seq_len=seq_len, attention="sdpa" if impl != "eager" else "math",
        optimizer_name=cfg.optimizer, dropout=training_dropout(model), notes=notes,
        # Hooks would break a compiled graph: a compiled model is attributed as a whole.
        scopes=None if cfg.compile else (lambda: module_scopes(model)),
    )
    described = {"model_name": loaded.name, "model_source": loaded.source, "model_type": loaded.config.model_type,
                 "attention": impl, "hf": cfg.hf or cfg.hf_config}
    return work, described


def _load_hf(spec: ModelSpec, dtype: torch.dtype, seed: int) -> HFModel:
    """--hf's weights, else --hf-config's architecture with random weights (the callers checked one is given)."""
    from lmprof.workloads import hf as hfmod

    resized = [f"--{k.replace('_', '-')}" for k in ("n_layer", "n_head", "n_embd") if getattr(spec, k) is not None]
    if spec.hf:
        if resized:
            raise ConfigError(f"{', '.join(resized)} cannot resize --hf {spec.hf}: its weights fix the shape "
                              "(use --hf-config for an architecture with random weights)")
        return hfmod.load(spec.hf, dtype, spec.download)
    if spec.hf_config:
        if spec.n_head is not None or spec.n_embd is not None:
            raise ConfigError("--n-head and --n-embd apply to the built-in GPT; with --hf-config only --n-layer is "
                              "honoured (heads and width follow the architecture)")
        return hfmod.from_config(spec.hf_config, dtype, seed, num_hidden_layers=spec.n_layer)
    raise ConfigError("give --hf or --hf-config for a Hugging Face model")


def _local_tokenizer(folder: str) -> Any:
    """A tokenizer from a local folder (never the network), or one line saying why not."""
    from lmprof.workloads import hf as hfmod

    tf = hfmod._transformers()  # noqa: SLF001 - the one place transformers is imported, with its error
    if not Path(folder).is_dir():
        raise DataError(f"--tokenizer {folder} is not a folder (give a local tokenizer folder)")
    try:
        return tf.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"cannot load a tokenizer from {folder}: {' '.join(str(exc).split())[:160]}") from None


def _prompt_ids(cfg: InferConfig, tokenizer: Any, vocab: int, notes: list[str],
               special: frozenset[int] = frozenset()) -> torch.Tensor:
    if cfg.prompt_ids is not None:
        if cfg.prompt is not None:
            raise ConfigError("give either --prompt or --prompt-ids, not both")
        bad = [x for x in cfg.prompt_ids if x >= vocab]
        if bad:
            raise ConfigError(f"--prompt-ids {bad[0]} is not a token of this model (vocabulary {vocab})")
        return torch.tensor(cfg.prompt_ids, dtype=torch.long).unsqueeze(0).repeat(cfg.batch_size, 1)
    if cfg.tokenizer is not None:
        tokenizer = _local_tokenizer(cfg.tokenizer)
    if cfg.prompt is not None:
        if not cfg.prompt:
            raise ConfigError("the prompt is empty")
        if tokenizer is not None:
            ids = tokenizer(cfg.prompt)["input_ids"]
        else:
            ids = [b % vocab for b in cfg.prompt.encode("utf-8")]
            notes.append("no tokenizer with this model: the prompt was encoded as UTF-8 bytes (one token per byte); "
                         "give --prompt-ids or --tokenizer FOLDER for the model's own tokens")
        row = torch.tensor(ids, dtype=torch.long)
        return row.unsqueeze(0).repeat(cfg.batch_size, 1)
    gen = torch.Generator().manual_seed(cfg.seed)
    return random_tokens(vocab, (cfg.batch_size, cfg.prompt_len), gen, special)


def infer_workload(cfg: InferConfig, device: Device) -> tuple[InferWorkload, dict[str, Any]]:
    """The model (built-in, Hugging Face or config), its decoder and the prompt batch."""
    from lmprof.workloads import hf as hfmod
    from lmprof.workloads.hooks import module_scopes

    dtype = TORCH_DTYPES[cfg.dtype]
    notes: list[str] = []
    tokenizer = None
    scopes: Callable[[], ContextManager[object]] | None = None
    described: dict[str, Any] = {}
    if cfg.hf and cfg.hf_config:
        raise ConfigError("give either --hf or --hf-config, not both")
    if cfg.hf or cfg.hf_config:
        loaded = _load_hf(cfg, dtype, cfg.seed)
        model, tokenizer = loaded.model, loaded.tokenizer
        context = hfmod.context_length(model)
        shape = hfmod.shape_of(model)
        vocab, special = hfmod.token_space(model)
        described = {"model_name": loaded.name, "model_source": loaded.source, "model_type": loaded.config.model_type,
                     # what the model really runs (transformers' choice), not lmprof's built-in default
                     "attention": attention_implementation(model) or "unknown"}
        hooked = model
        if not cfg.compile:  # hooks inside a compiled model would break its graph
            scopes = lambda: module_scopes(hooked)  # noqa: E731 - hooks only while the profiler runs
    else:
        gcfg = gpt_config(cfg)
        torch.manual_seed(cfg.seed)
        model = GPT(gcfg).to(dtype=dtype)
        # Process-wide and guarded by a compiled model: off for --compile (constant), else back on
        # (a compiled training run before this one may have turned them off).
        model_scopes(not cfg.compile)
        context, shape, vocab = gcfg.block_size, gcfg.shape(), gcfg.vocab_size
        special = frozenset()
        described = {"model": gcfg.to_dict()}
    model = model.to(device.torch_device).eval()
    prompt = _prompt_ids(cfg, tokenizer, vocab, notes, special).to(device.torch_device)
    if context is not None and prompt.size(1) + cfg.new_tokens > context:
        raise ConfigError(
            f"prompt of {prompt.size(1)} tokens + {cfg.new_tokens} new tokens exceeds the model's context of {context}")
    decoder, dnotes = decoder_for(model, cfg.kv_cache, dtype)
    notes += dnotes
    if cfg.compile:
        compile_decoder(decoder, cfg, notes)
        # Generation runs under inference_mode: a prompt made outside it differs from the decode
        # tokens in its dispatch keys, which dynamo guards on (one needless recompilation).
        with torch.inference_mode():
            prompt = prompt.clone()
    work = InferWorkload(model, decoder, prompt, cfg.new_tokens, device, shape, tokenizer, scopes, notes)
    described["prompt_tokens"] = prompt.size(1)
    return work, described


def compile_decoder(decoder: Decoder, cfg: InferConfig, notes: list[str]) -> None:
    """torch.compile what a decoder calls, with its KV cache (workloads/decoding.py).

    The built-in GPT compiles prefill and decode apart, with static shapes over its static KV cache:
    decode compiles once, prefill once per prompt length. A Hugging Face model does the same over
    transformers' StaticCache where it supports one, else it is compiled with its dynamic cache.
    """
    if not isinstance(decoder, (GPTDecoder, HFDecoder)) or not decoder.kv_cache:
        raise ConfigError("--compile for inference needs a KV cache and the built-in GPT or a Hugging Face "
                          "model (not --no-kv-cache)")
    if isinstance(decoder, GPTDecoder):
        decoder.compile(cfg.compile_mode)
        notes.append(f"torch.compile (mode {cfg.compile_mode}): " + FUSED_NOTE)
        notes.append("torch.compile: static KV cache (attention over all prompt + new-token positions, masked; "
                     "the eager run attends to the positions written so far), so decode compiles once and "
                     "prefill once per prompt length")
        return
    fallback = decoder.compile(cfg.compile_mode)
    notes.append(fallback or "torch.compile: transformers' static KV cache (StaticCache), prefill and decode "
                 "compiled apart with static shapes: decode compiles once, prefill once per prompt length")
    notes.append(f"torch.compile (mode {cfg.compile_mode}): Hugging Face models get no block rows when compiled "
                 "(module hooks would break the graph; kernel provenance names built-in GPT blocks only): "
                 "the time is in each phase's 'other'")
