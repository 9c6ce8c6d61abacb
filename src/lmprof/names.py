"""The shared vocabulary: block, step-part and phase names and their display order.

Bottom layer (no torch, no pandas): every other layer takes these names from here, so a block or
phase is spelled in exactly one place. The scope ranges that carry them in a trace are
``lmprof:<name>`` (:data:`SCOPE_PREFIX`).
"""
from __future__ import annotations

SCOPE_PREFIX = "lmprof:"

LOSS = "loss"  # the loss, wherever it is computed (in the model's forward or after it)

# Sub-blocks of the forward pass, in data-flow order. attn.sdpa replaces scores/softmax/av when the
# fused kernel is used.
FORWARD_BLOCKS: tuple[str, ...] = (
    "embedding",
    "ln_1",
    "attn.qkv",
    "attn.scores",
    "attn.softmax",
    "attn.av",
    "attn.sdpa",
    "attn.proj",
    # Mixers other than attention (hybrid models), each its input projections, its short causal
    # convolution, its own work (the scan or recurrence, gating, norms) and its output projection:
    # linear attention (Gated DeltaNet and kin), state-space models (Mamba) and gated short
    # convolutions (LFM2).
    *(f"{mixer}.{part}" for mixer in ("linear_attn", "ssm", "conv") for part in ("in_proj", "conv", "core", "out_proj")),
    "residual",
    "ln_2",
    "moe.router",  # mixture-of-experts: the router (scores, top-k) and the routed experts with their
    "moe.experts",  # dispatch and combine; shared experts are a dense MLP (mlp.fc, mlp.act, mlp.proj)
    "mlp.fc",
    "mlp.act",
    "mlp.proj",
    "ln_f",
    "lm_head",
    LOSS,
)

# Blocks whose work is matmuls against weights (advice's compute-bound share, the stopwatch's tighter
# goal); with the attention core's matmuls, the blocks whose FLOP/s may not pass the device's roof.
WEIGHT_MATMUL_BLOCKS: tuple[str, ...] = ("attn.qkv", "attn.proj", "moe.router", "moe.experts", "mlp.fc", "mlp.proj",
                                         "lm_head", *(f"{mixer}.{part}" for mixer in ("linear_attn", "ssm", "conv")
                                                      for part in ("in_proj", "out_proj")))
# What each mixer is called where a person reads it.
MIXER_KINDS: dict[str, str] = {"attn": "attention", "linear_attn": "linear attention", "ssm": "SSM",
                               "conv": "convolution"}
MATMUL_BLOCKS: frozenset[str] = frozenset({*WEIGHT_MATMUL_BLOCKS, "attn.scores", "attn.av", "attn.sdpa"})

# Scopes that enclose blocks: their own (exclusive) time is that phase's ``other``.
TRAIN_PHASES: tuple[str, ...] = ("forward", "backward")
INFER_PHASES: tuple[str, ...] = ("prefill", "decode")
PHASES: tuple[str, ...] = (*TRAIN_PHASES, *INFER_PHASES)
# The passes FLOPs and bytes are counted over (estimate/flops.py: a training step's forward and
# backward, a prefill, the decode steps) and the block phases each covers (a mode's passes: modes.py).
PASS_PHASES: dict[str, tuple[str, ...]] = {"train": TRAIN_PHASES, "prefill": ("prefill",), "decode": ("decode",)}
# The pseudo-phase of rows that belong to the whole step, not to one phase.
STEP = "step"
# Phases in display order, the step's own rows last.
PHASE_ORDER: tuple[str, ...] = (*PHASES, STEP)

# Parts of a training step that are rows on their own (phase ``step``).
# grad_clip: torch.nn.utils.clip_grad_norm_ / clip_grad_value_ in a user's loop (nanoGPT, the HF
# Trainer and Lightning clip by default), timed where the loop calls them.
# data: lmprof's own loop's batch, or in a user's loop torch's range around its DataLoader's __next__
DATA = "data"
# generate: a generate() call inside a training step (an RL loop's rollout), one row
GENERATE = "generate"
# lmprof's own work inside a profiled step of someone else's loop (its optimizer hooks before and after
# the optimizer's step, the step's end, each forward's end in a generation): a range of its own, so that
# the time is neither 'other' (the user's loop) nor a block's; the rows leave it out
# (analysis/reconcile.py) and the run says how much it was.
LMPROF = "lmprof"
LEAF_PARTS: tuple[str, ...] = (DATA, GENERATE, "grad_clip", "optimizer", "zero_grad", LMPROF)
# Scopes a training step is made of, in order.
STEP_PARTS: tuple[str, ...] = (DATA, GENERATE, "forward", "backward", "grad_clip", "optimizer", "zero_grad")
# Scopes an inference run is made of.
INFER_PARTS: tuple[str, ...] = INFER_PHASES

# Rows that are not blocks of the model.
OTHER = "other"  # time inside a phase (or the step) that no block claims
IDLE = "idle"  # device clock: step wall time with no kernel running
ACCUMULATE_GRAD = "accumulate_grad"  # writing .grad of parameters (no forward block owns it)
# Host time of calling compiled graphs outside their kernels: dynamo's guards, AOT wrappers, glue.
COMPILED_CALL = "compiled_call"
# The model's own top-level forward outside every module of it (models lmprof hooks, not its own GPT):
# causal-mask building, position ids and adds, dropout of the embeddings, output objects. At small
# sizes this Python is a tenth of the forward; it was `other` before it had a name.
MODEL_GLUE = "model_glue"
# backward() outside every autograd node: the engine's scheduling between nodes and the seed gradient
# (what compiled autograd removes). Its own row, so that `other` in the backward is only nodes no
# block claims.
AUTOGRAD_ENGINE = "autograd_engine"
# A generation's prefill or decode outside the model's forward, where model_glue shows that forward is
# claimed whole: the generation loop's own work (token choice: logits processors, sampling; stopping
# criteria, cache bookkeeping, a streamer). Without model_glue (a compiled model) that time is `other`.
GENERATE_LOOP = "generate_loop"
# The forwards of models beside the profiled one that the step or generation ran: a distillation
# teacher, a DPO reference, a reward model, a GAN's other half, speculative decoding's assistant. Each
# call of such a model (a live root module with parameters, none of them the profiled model's) is one
# range, its row in the phase it ran in: their time was the loss's, `other` or the generation loop's.
OTHER_MODELS = "other_models"
# Communication rows: gradient reduction, FSDP's parameter gathers, anything else collective.
ALLREDUCE, ALLGATHER, COMM = "allreduce", "allgather", "comm"

# Rows of a phase that are not sub-blocks of a layer, in display order after the blocks.
PHASE_ROWS: tuple[str, ...] = (OTHER_MODELS, MODEL_GLUE, GENERATE_LOOP, ACCUMULATE_GRAD, AUTOGRAD_ENGINE, COMPILED_CALL,
                                OTHER)
# Step rows in display order after the blocks.
STEP_ROWS: tuple[str, ...] = (DATA, GENERATE, OTHER_MODELS, "grad_clip", "optimizer", "zero_grad", ALLREDUCE, COMM, OTHER, IDLE)


def folded(block: str) -> str:
    """A per-layer block name without its layer index: ``layers.*.fc1[3]`` -> ``layers.*.fc1``.

    Models lmprof has no rules for get one block per module path with layer-stack indices replaced
    by ``*`` and kept in a ``[i]`` suffix (``[i,j]`` when nested): run records keep the per-layer
    rows, tables fold them into one.
    """
    if block.endswith("]") and "[" in block:
        head, _, idx = block[:-1].rpartition("[")
        if idx and all(part.isdigit() for part in idx.split(",")):
            return head
    return block


def block_of(event_name: str) -> str | None:
    """The block name of a scope event, or None when the event is not an lmprof scope."""
    if event_name.startswith(SCOPE_PREFIX):
        return event_name[len(SCOPE_PREFIX):]
    return None
