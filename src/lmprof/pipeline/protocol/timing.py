"""Every step's time, one clock for every door, kept by where it was taken.

A training step runs from one boundary to the next. A generation runs from its start to its end;
its prefill from its start to the end of its first forward; each decode step from the end of one
forward to the end of the next (token choice included). Each mark is the session's clock read
with the device synchronized, whether the loop is lmprof's own (it reports each forward's end) or
the user's (a hook on the model sees it), so ``ttft``, ``tpot`` and ``e2e_latency`` mean one thing.

Clean steps are the run's figures. Steps timed elsewhere (warm-up, the figures step, under lmprof's
profiler) are kept apart by kind, and used, with the basis ``first_call``, only when no clean step was
timed. A step the user's own profiler ran in is not timed at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from lmprof.pipeline.protocol.plan import Phase, PhasePlan
from lmprof.workloads.hf_interface import returned_cache

# Where rough timings come from, best first: steps under lmprof's profiler (no first-call costs),
# plain warm-up steps after the first, the profiler's own warm-up step, the figures step (memory
# recording on), the very first step. A step during which the user's own profiler ran is none of
# these: it is never timed (giveway.py).
ROUGH = {
    "profiled": "under lmprof's profiler (its overhead included)",
    "warm-up": "during warm-up (caches, allocator and kernel choice still settling)",
    "profiler warm-up": "in the profiler's own warm-up step (under lmprof's profiler, its first step)",
    "figures": "while lmprof recorded memory (and counted FLOPs where it has no formulas) during warm-up",
    "counting": "while lmprof counted FLOPs with FlopCounterMode during warm-up",
    "first": "on the very first call (allocation, kernel choice and any compilation included)",
}


def rough_kind(n: int, phase: Phase, *, counting: bool, figures: bool) -> str:
    """The rough kind (:data:`ROUGH`) of step ``n``, should it not be a clean one: the FLOPs step
    (``counting``), the figures step, the very first step, else by its phase (a gap step is timed as
    a warm-up one)."""
    if counting or figures:
        return "counting" if counting else "figures"
    if n == 1:
        return "first"
    return {Phase.PROFILER_WARMUP: "profiler warm-up", Phase.PROFILED: "profiled"}.get(phase, "warm-up")


@dataclass(frozen=True)
class Generation:
    """One generation's times (seconds) and sizes."""

    prefill_s: float
    decode_s: list[float]
    e2e_s: float
    batch: int | None
    prompt_len: int | None
    forwards: int
    # Every decode forward re-ran the whole sequence: its input grew past one token per sequence and it
    # handed back no KV cache (generate(use_cache=False), nanoGPT's generate). False when one went
    # through a cache, or the generation had no decode step.
    recomputed: bool = False
    # The prefill computed logits at its last position only (generate() asks for that with
    # logits_to_keep=1 where the model takes it); None when its output showed none.
    last_logits_only: bool | None = None
    # New tokens per sequence generate() returned; None: not seen (the loop's own generation, where each
    # forward makes one). More than ``forwards``: several tokens a forward (assisted, speculative decoding).
    tokens: int | None = None
    # ``batch`` is the rows the forwards ran; generate() may run more than it was given prompts (beam search
    # runs num_beams rows a prompt, num_return_sequences as many) and return fewer (a beam search returns
    # its best). The prompts it was given and the sequences it returned, where they differ from ``batch``.
    prompts: int | None = None
    returned: int | None = None
    # Prompt tokens the prefill did not run: a cache passed to generate() (past_key_values, a multi-turn
    # chat's or a shared system prompt's) held them, and the prefill ran only the prompt's last tokens.
    cached: int = 0

    @property
    def outputs(self) -> int | None:
        """The sequences generate() handed back (the rows the forwards ran, where it showed none)."""
        return self.returned if self.returned is not None else self.batch

    @property
    def generated(self) -> int:
        """Tokens made per sequence: what generate() returned, else one a forward."""
        return self.tokens if self.tokens is not None else self.forwards

    @property
    def several_per_forward(self) -> bool:
        """More tokens than forwards of the model (a draft model proposed them: assisted, speculative)."""
        return self.tokens is not None and self.tokens > self.forwards

    @classmethod
    def from_marks(cls, start: float, forward_ends: list[float], end: float,
                   shape: tuple[int, ...] | None, recomputes: list[bool] | None = None,
                   logits_positions: int | None = None, tokens: int | None = None,
                   prompts: int | None = None, returned: int | None = None, cached: int = 0) -> "Generation":
        """The generation between ``start`` and ``end`` whose forwards ended at ``forward_ends``
        (``shape``: the rows its forwards ran x the prompt's length; ``recomputes``: whether each decode
        forward re-ran the whole sequence; ``logits_positions``: the positions the prefill's logits had;
        ``tokens``: new tokens per sequence it returned; ``prompts``, ``returned``, ``cached``: see the fields)."""
        prompt = shape[1] if shape else None
        batch = shape[0] if shape else None
        return cls(prefill_s=forward_ends[0] - start,
                   decode_s=[b - a for a, b in zip(forward_ends, forward_ends[1:])], e2e_s=end - start,
                   batch=batch, prompt_len=prompt,
                   forwards=len(forward_ends), recomputed=bool(recomputes) and all(recomputes or ()),
                   last_logits_only=(None if logits_positions is None or not prompt or prompt < 2
                                     else logits_positions == 1), tokens=tokens,
                   prompts=prompts if prompts != batch else None, returned=returned if returned != batch else None,
                   cached=cached)


@dataclass
class Timings:
    """Clean times (the run's figures) and rough ones by kind (:data:`ROUGH`)."""

    steps: list[float] = field(default_factory=list)  # clean training steps, seconds
    # Each clean training step's wait for its input, seconds (StepClock.first_forward); None: no forward seen
    waits: list[float | None] = field(default_factory=list)
    gens: list[Generation] = field(default_factory=list)  # clean generations
    rough_steps: dict[str, list[float]] = field(default_factory=dict)
    rough_gens: dict[str, list[Generation]] = field(default_factory=dict)
    first_call: str | None = None  # the run's times are rough ones: the kind they came from

    def keep(self, value: float | Generation, kind: str | None, wait: float | None = None) -> None:
        """A step's time: clean (``kind`` None, with its wait for input) or rough, kept by kind."""
        if isinstance(value, Generation):
            (self.gens if kind is None else self.rough_gens.setdefault(kind, [])).append(value)
        elif kind is None:
            self.steps.append(value)
            self.waits.append(wait)
        else:
            self.rough_steps.setdefault(kind, []).append(value)

    @property
    def clean(self) -> int:
        """Clean steps (or generations) timed."""
        return len(self.steps) or len(self.gens)

    def seconds(self) -> list[float]:
        """Each clean step's (or whole generation's) seconds."""
        return [g.e2e_s for g in self.gens] or list(self.steps)

    def first(self) -> float | None:
        """The very first step's (or generation's) seconds, when it was timed."""
        found = self.rough_steps.get("first") or [g.e2e_s for g in self.rough_gens.get("first", [])]
        return found[0] if found else None

    def warm(self) -> list[float]:
        """Warm-up steps' seconds after the first."""
        out = [t for k, v in self.rough_steps.items() if k != "first" for t in v]
        return out + [g.e2e_s for k, v in self.rough_gens.items() if k != "first" for g in v]

    def fall_back(self, unit: str, plan: PhasePlan) -> str | None:
        """No clean step was timed: take the best rough ones instead (:attr:`first_call` says which);
        the note that says so, or None when nothing was timed at all."""
        w, s, p = plan.warmup, plan.steps, plan.profile_steps
        how = "--steps 1" if s == 0 else f"--warmup {w} --steps {s} --profile-steps {p}, or lower them"
        kind = next((k for k in ROUGH if self.rough_steps.get(k) or self.rough_gens.get(k)), None)
        if kind is None:
            return None
        self.steps, self.gens = list(self.rough_steps.get(kind, [])), list(self.rough_gens.get(kind, []))
        self.waits = [None] * len(self.steps)
        self.first_call = kind
        return (f"first call: includes warm-up costs: no clean {unit} was timed, so the {self.clean} {unit}(s) here "
                f"were timed {ROUGH[kind]}: a rough figure, not a clean timing; for a clean one run at least "
                f"{plan.with_steps(max(s, 1)).needed} {unit}s ({how})")


def _prompt_shape(ids: Any) -> tuple[int, ...] | None:
    """(batch, prompt length) of a token-id tensor, else None."""
    if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point():
        return tuple(ids.shape)
    return None


def _recomputes(ids: Any, output: Any) -> bool:
    """A decode forward that re-ran the whole sequence: more than one new token per sequence in, no
    KV cache out (a model that takes every token with its cache, as CPM-Ant does, returns the cache)."""
    shape = _prompt_shape(ids)
    return shape is not None and shape[1] > 1 and returned_cache(output) is None


@dataclass
class _Running:
    """The generation running now: its clock marks and the prompt's shape."""

    start: float
    shape: tuple[int, ...] | None
    called_with: torch.Tensor | None = None  # the prompt generate() was called with (token ids)
    prompts: int | None = None  # its rows, where the forwards ran more (beams, several sequences a prompt)
    cached: int = 0  # prompt tokens a cache passed to generate() held: the prefill did not run them
    forwards: list[float] = field(default_factory=list)
    recomputes: list[bool] = field(default_factory=list)  # per decode forward: the whole sequence, no cache
    logits_positions: int | None = None  # positions of the prefill's logits, when its output showed them


class StepClock:
    """The session's clock: every mark is read with the device synchronized; the running step's start
    and kind (:data:`ROUGH`), and the running generation's marks."""

    def __init__(self, clock: Callable[[], float], sync: Callable[[], None]):
        self.clock, self.sync = clock, sync
        self.start: float | None = None  # when the running step began (None: untimed)
        # When the running step's first forward of the model began: host clock, no sync (a sync in a forward
        # hook would change the user's step); the time before it is the step's wait for its input
        self.first_forward: float | None = None
        self.kind: str | None = None  # what the running warm-up step is
        self.gen: _Running | None = None

    def mark(self) -> float:
        self.sync()
        return self.clock()

    def restart(self) -> None:
        """The next step's clock starts (a fresh mark)."""
        self.start = self.mark()
        self.first_forward = None

    def forward_began(self) -> None:
        """A forward of the model begins: the running step's first one is marked (host clock)."""
        if self.first_forward is None and self.start is not None:
            self.first_forward = self.clock()

    def wait(self) -> float | None:
        """The running step's wait for its input: from its start to its first forward (None: none seen)."""
        if self.first_forward is None or self.start is None:
            return None
        return max(0.0, self.first_forward - self.start)

    def generation_begins(self, ids: Any) -> None:
        """The running step is a generation (``ids``: its prompt, when the loop handed it over: token ids, or
        the embeddings of ``generate(inputs_embeds=...)``)."""
        assert self.start is not None
        if isinstance(ids, torch.Tensor) and ids.dim() == 3 and ids.is_floating_point():  # embeddings
            self.gen = _Running(self.start, (int(ids.shape[0]), int(ids.shape[1])), None)
            return
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None
        self.gen = _Running(self.start, shape, ids if shape else None)

    def forward_ends(self, ids: Any, output: Any = None) -> bool:
        """The running generation's forward (on ``ids``, returning ``output``) ended: marked; False when
        none runs."""
        gen = self.gen
        if gen is None:
            return False
        if not gen.forwards:  # the prefill's input: batch x prompt
            ran = _prompt_shape(ids)
            if gen.shape is None:
                gen.shape = ran
            elif ran is not None and ran[1] == gen.shape[1] and ran[0] != gen.shape[0] and ran[0] % gen.shape[0] == 0:
                # generate() expanded its prompts before the prefill: num_beams, num_return_sequences
                gen.prompts, gen.shape = gen.shape[0], ran
            elif ran is not None and ran[0] == gen.shape[0] and ran[1] < gen.shape[1]:
                gen.cached = gen.shape[1] - ran[1]  # the prompt's first tokens came from a cache passed in
        decode = bool(gen.forwards)
        gen.forwards.append(self.mark())
        # after the mark: looking costs the step nothing
        if decode:
            gen.recomputes.append(_recomputes(ids, output))
        else:
            logits = getattr(output, "logits", None)
            if isinstance(logits, torch.Tensor) and logits.dim() == 3:
                gen.logits_positions = int(logits.shape[1])
        return True

    def generation_ends(self, shape: tuple[int, ...] | None,
                        output: Any = None) -> tuple[Generation | None, tuple[int, ...] | None]:
        """The running generation ended (``output``: what generate() returned): its times (None when no
        forward was seen) and its prompt's shape (``shape`` when it showed none)."""
        gen, self.gen = self.gen, None
        end = self.mark()
        if gen is None or not gen.forwards:
            return None, shape
        shape = gen.shape or shape
        seq = _sequences(output)
        return Generation.from_marks(gen.start, gen.forwards, end, shape, gen.recomputes, gen.logits_positions,
                                     _new_tokens(seq, gen.called_with), prompts=gen.prompts,
                                     returned=int(seq.shape[0]) if seq is not None else None,
                                     cached=gen.cached), shape


def _sequences(output: Any) -> torch.Tensor | None:
    """The token ids generate() returned: its sequences, or the tensor itself (None: neither)."""
    seq = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
    return seq if isinstance(seq, torch.Tensor) and seq.dim() == 2 and not seq.is_floating_point() else None


def _new_tokens(seq: torch.Tensor | None, prompt: torch.Tensor | None) -> int | None:
    """New tokens per sequence in ``seq`` (what generate() returned) after ``prompt``; None unless the
    sequences begin with the prompt (an encoder-decoder's do not), or with each prompt repeated as many
    times as it returned sequences for each (num_return_sequences)."""
    if prompt is None or seq is None or seq.device != prompt.device or seq.shape[1] < prompt.shape[1] \
            or not prompt.shape[0] or seq.shape[0] % prompt.shape[0]:
        return None
    each = seq.shape[0] // prompt.shape[0]
    if not torch.equal(seq[:, :prompt.shape[1]], prompt.repeat_interleave(each, 0) if each > 1 else prompt):
        return None
    return int(seq.shape[1] - prompt.shape[1])
