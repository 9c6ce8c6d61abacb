"""The name of every figure in run.json's ``metrics``, for the code that writes (or reads) it.

The metric catalogue (catalogue.py) declares each figure under the name it takes from here, with its
unit, source and views; a writer takes the name from here as well instead of spelling it, so a typo
is an import error and a new figure is one name here and one catalogue entry.
tests/test_metric_catalogue.py checks both ways (every name here is catalogued, every catalogued
figure is named here) and that no module outside these two spells a figure's name as a metrics key.
"""
from __future__ import annotations

# -- timing and throughput (a training step; a generation) ------------------------------------------
STEP_TIME = "step_time"
TOKENS_PER_S = "tokens_per_s"
TOKENS_PER_STEP = "tokens_per_step"
TTFT = "ttft"
TPOT = "tpot"
DECODE_TOKENS_PER_S = "decode_tokens_per_s"
E2E_LATENCY = "e2e_latency"
PREFILL_TOKENS_PER_S = "prefill_tokens_per_s"
PROFILED_STEP_TIME = "profiled_step_time"
PROFILED_E2E_LATENCY = "profiled_e2e_latency"
PROFILER_OVERHEAD = "profiler_overhead"
LOSS = "loss"
PARAMS = "params"

# -- distributed runs: rank 0's merged record --------------------------------------------------------
WORLD_SIZE = "world_size"
SLOWEST_RANK = "slowest_rank"
STRAGGLER = "straggler"


def global_key(key: str) -> str:
    """A rank's figure summed over every rank: ``tokens_per_s.global``."""
    return f"{key}.global"


# -- the compute figures of one pass (a training step, a prefill, the decode steps) -----------------
MFU = "mfu"
HFU = "hfu"
MBU = "mbu"
FLOPS_MODEL = "flops.model_per_step"
FLOPS_HARDWARE = "flops.hardware_per_step"
BYTES_MODEL = "bytes.model_per_step"
FLOPS_ACHIEVED = "flops.achieved"
PEAK_FLOPS = "peak.flops"
PEAK_BANDWIDTH = "peak.bandwidth"
COSTS: tuple[str, ...] = (MFU, HFU, MBU, FLOPS_MODEL, FLOPS_HARDWARE, BYTES_MODEL, FLOPS_ACHIEVED, PEAK_FLOPS,
                          PEAK_BANDWIDTH)
# The key prefix of each pass's compute figures (names.PASS_PHASES): a training step's have none.
PASS_PREFIX: dict[str, str] = {"train": "", "prefill": "prefill.", "decode": "decode."}


def cost_key(pass_: str, key: str) -> str:
    """One pass's compute figure: ``mfu`` of a training step, ``prefill.mfu``, ``decode.mbu``."""
    return PASS_PREFIX[pass_] + key


# -- memory: measured beside estimated ---------------------------------------------------------------
MEMORY_PARTS: tuple[str, ...] = ("params", "grads", "optimizer", "activations", "kv_cache", "peak")
KV_CACHE = "kv_cache"  # the cache after a whole generation, and its estimate
KV_CACHE_ESTIMATED = "kv_cache.estimated"


def memory_key(part: str, estimated: bool = False) -> str:
    """``memory.<part>`` (measured) or ``memory.estimated.<part>``, a part of :data:`MEMORY_PARTS`."""
    if part not in MEMORY_PARTS:
        raise KeyError(f"no memory figure {part!r}")
    return f"memory.estimated.{part}" if estimated else f"memory.{part}"


# -- energy over the clean window: measured, or estimated (rated power x time) ------------------------
ENERGY_PARTS: tuple[str, ...] = ("total", "window", "power.avg", "power.idle", "above_idle", "per_step",
                                 "per_generation", "per_token", "per_generated_token", "flop_per_joule")


def energy_key(part: str, estimated: bool = False) -> str:
    """``energy.<part>`` or ``energy.estimated.<part>``; ``domain.<name>`` for one meter domain."""
    if part not in ENERGY_PARTS and not (part.startswith("domain.") and len(part) > len("domain.")):
        raise KeyError(f"no energy figure {part!r}")
    return f"energy.estimated.{part}" if estimated else f"energy.{part}"


# -- torch.compile ---------------------------------------------------------------------------------------
COMPILE_TIME = "compile.time"
COMPILE_DYNAMO_TIME = "compile.dynamo_time"
COMPILE_COMPILATIONS = "compile.compilations"
COMPILE_RECOMPILES = "compile.recompiles"
COMPILE_GRAPH_BREAKS = "compile.graph_breaks"
COMPILE_AFTER_WARMUP = "compile.after_warmup"
COMPILE_PER_STEP = "compile.per_step"

# -- sweeps -------------------------------------------------------------------------------------------
NOISY = "noisy"  # the results store's row of run.json's top-level `noisy`
