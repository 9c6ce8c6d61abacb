"""Advice on a training step's parts outside the model: the optimizer's step, fetching the batch, and an
RL loop's rollout (``generate()`` inside the step). Each fires on the part's share of the profiled step
(a ``step`` row); docs/reports.md lists them with the other rules of :mod:`lmprof.analysis.advice`.
Pure: no I/O, no torch.
"""
from __future__ import annotations

from typing import Mapping

from lmprof import names
from lmprof.analysis.doors import door_of
from lmprof.analysis.recommendation import Evidence, Recommendation, Rule, block_share
from lmprof.analysis.watch_detect import Rules
from lmprof.modes import traits
from lmprof.record.run import Run

#: The optimizer step takes more than this share of the training step (%).
OPTIMIZER_SHARE_MAX_PCT = 15.0
#: Fetching the batch (the ``data`` row) takes at least this share of the training step (%): the whole-run
#: watch's input-bound share (analysis/watch_detect.py: Rules.input_share).
DATA_SHARE_MIN_PCT = 100.0 * Rules().input_share
#: generate() inside the training step (an RL loop's rollout) takes at least this share of it (%): the
#: rollout, not the training, is what sets the step time.
ROLLOUT_SHARE_MIN_PCT = 50.0


def _training_step_share(run: Run, part: str, above: float, equal: bool = False) -> float | None:
    """A training run's step part (a row of phase ``step``) as a share of the step, when it is above
    ``above`` (or ``equal`` to it); else None."""
    share = block_share(run, (part,), phase="step") if traits(run.mode).trains else None
    return share if share is not None and (share > above or (equal and share == above)) else None


def rule_optimizer_share(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
    """The optimizer step is a large share of a training step."""
    share = _training_step_share(run, "optimizer", OPTIMIZER_SHARE_MAX_PCT)
    if share is None:
        return None
    opt = str(run.config.get("optimizer") or "the optimizer")
    return Recommendation(
        rule="optimizer_share", title="The optimizer step is a large part of the step",
        why=(f"{opt} takes {share:.1f}% of the profiled step. A per-parameter loop launches several small "
             "ops for every parameter tensor."),
        actions=(f"Update all parameters in a few multi-tensor kernels: {door_of(run).fused_optimizer}.",
                 "A larger batch amortises the optimizer over more tokens."),
        evidence=(Evidence("blocks[optimizer].pct", share, "%", OPTIMIZER_SHARE_MAX_PCT, ">"),),
    )


def _step_part_rule(part: str, min_pct: float, rule: str, title: str, why: str,
                    actions: tuple[str, ...]) -> Rule:
    """A rule that fires when a training step's part (a ``step`` row) is at least ``min_pct`` of the step;
    ``why`` is formatted with that ``share``."""

    def check(run: Run, trace: Mapping[str, float]) -> Recommendation | None:
        share = _training_step_share(run, part, min_pct, equal=True)
        if share is None:
            return None
        return Recommendation(rule=rule, title=title, why=why.format(share=share), actions=actions,
                              evidence=(Evidence(f"blocks[{part}].pct", share, "%", min_pct, ">="),))

    check.__name__ = f"rule_{rule}"
    check.__doc__ = f"{title} (the step's {part!r} row at {min_pct:g}% or more)."
    return check


rule_data_share = _step_part_rule(
    names.DATA, DATA_SHARE_MIN_PCT, "data_share", "The step waits for its data",
    "Fetching the batch takes {share:.1f}% of the profiled step: the model waits while the batch is read, decoded "
    "or collated in the training process.",
    ("Load in the background: DataLoader(num_workers=N, persistent_workers=True, prefetch_factor=...), "
     "pin_memory=True with non_blocking copies on CUDA.",
     "Move per-sample work out of the loop: tokenize and pack ahead of time, read from a faster disk or "
     "memory-mapped arrays."))

rule_rollout_share = _step_part_rule(
    names.GENERATE, ROLLOUT_SHARE_MIN_PCT, "rollout_share", "Generation, not training, sets the step time",
    "generate() inside the training step takes {share:.1f}% of the profiled step: the rollout's token-by-token "
    "decoding, not the forward and backward, is what to speed up.",
    ("Generate with an inference engine (vLLM, SGLang: TRL's use_vllm=True) or at least a static KV cache with "
     "torch.compile (generate(cache_implementation='static')).",
     "Generate for the whole batch at once and reuse rollouts for several optimizer steps where the algorithm "
     "allows it."))
