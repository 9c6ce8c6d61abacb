"""Attribute each profiled step's time to blocks, forward and backward, from a trace table.

Built on the trace engine's primitives (steps, nesting, launches, kinds, autograd links), so a trace
rule exists once. How a trace event becomes a block's time:

* **Owners** are the intervals that can own time: lmprof's ``lmprof:<name>`` ranges (block scopes
  and step parts), the ``ProfilerStep#N`` range, host-side collectives, and in the backward pass
  every autograd node evaluation (``autograd::engine::evaluate_function: XBackward0``).
* A backward node belongs to the block whose forward op created it (:func:`autograd.forward_op`:
  the same autograd sequence number). AccumulateGrad (writing .grad of parameters) has no forward
  op and gets its own row, ``accumulate_grad``.
* **Nesting.** An owner's parent is the innermost owner enclosing it on its own thread
  (:mod:`lmprof.trace.nesting`). The autograd engine may run nodes (and DDP's reducer) on a thread
  of its own: such an owner with no parent on its thread is nested, by time, in the ``backward``
  scope that was running; any other orphan in the step range, in the step.
* **CPU clock** (CPU runs): an owner's time is its exclusive wall time, its duration minus that of
  the owners nested in it. Exclusive times of all owners in a step add up to the step exactly; what
  no block claims shows as ``other`` in its phase, never hidden. The backward scope's own time (the
  autograd engine between nodes, the seed gradient) is ``autograd_engine``.
* **Device clock** (GPU traces): an owner's time is the summed duration of the kernels, copies and
  sets launched from inside it (runtime call -> device event by correlation id). The step's
  remainder, wall time with no device work attributed, is ``idle``.

* **Compiled calls.** The ranges torch.compile's runtime records around a compiled graph
  (``Torch-Compiled Region``, ``TorchDynamo Cache Lookup``, ``Pregraph bytecode``, ``AOTDispatcher
  Runtime Wrapper Prologue``, ``CompiledFunction``, ``## Call CompiledFxGraph``, and the backward
  node ``CompiledFunctionBackward``) are owners of their own, ``compiled_call``: their exclusive time
  is the host cost of calling compiled code (guards, wrappers, buffer handling), which belongs to no
  block and is what CUDA graphs (``reduce-overhead``) remove. The kernels inside stay their blocks'.
  Only with a kernel record: without one the kernels are unnamed and the ranges stay ``other``.
  On the CPU clock, the graph call's time just before each of its kernels (since the call began or
  its previous kernel ended) is that kernel's: inductor's generated wrapper spends it allocating the
  kernel's buffers and calling it, in the order compile time recorded, so it goes to the kernel's
  blocks; only the time after its last kernel (returning, freeing) stays ``compiled_call``.
* **Compiled kernels** (``compiled=``, trace/compiled.py): each kernel of a compiled graph is an
  owner whose time is split among its blocks by the shares compile time recorded (FLOPs, else bytes).
  A kernel with two or more blocks is *fused*: the part of a block's time that came from fused
  kernels is kept apart (:attr:`Attribution.fused_per_step`), and each fused kernel's time and
  split is listed (:attr:`Attribution.fused_kernels`). Its recorded events count for its largest
  block.

The result keeps every step apart (:attr:`Attribution.per_step`) and gives the mean per step.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np

from lmprof import names
from lmprof.trace import kinds
from lmprof.trace.autograd import backward_node_mask, forward_op
from lmprof.trace.compiled import KernelOwner, kernel_owners
from lmprof.trace.launches import launching_calls
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import enclosing, parents
from lmprof.trace.phases import DATA_PREFIX
from lmprof.trace.steps import profiler_steps

# Host-side collective calls, DDP's gradient-bucket work and FSDP's gather/reduce ranges.
COMM_PREFIXES = ("c10d::", "torch.distributed.ddp.reducer::", "torch::distributed::reducer::", "FSDP::")

Clock = Literal["cpu", "device"]
Key = tuple[str, str]  # (block or part name, phase)


@dataclass
class Part:
    """Mean time per step of one (name, phase), microseconds; calls per step."""

    name: str
    phase: str
    us: float
    calls: float


@dataclass
class EventCounts:
    """Recorded events per step that inflate one (name, phase)'s time (means over the steps).

    ``ops``: host operators (and foreign ranges) whose innermost owner it is; ``scopes`` /
    ``op_ranges``: its own owner ranges (lmprof scopes, or operator ranges such as autograd nodes
    and collectives); ``child_scopes`` / ``child_op_ranges``: owner ranges nested directly in it.
    """

    ops: float = 0.0
    scopes: float = 0.0
    op_ranges: float = 0.0
    child_scopes: float = 0.0
    child_op_ranges: float = 0.0


@dataclass
class FusedKernel:
    """One fused compiled kernel: its time per step (mean, us) and how it was split among blocks."""

    kernel: str
    phase: str
    blocks: tuple[str, ...]
    shares: tuple[float, ...]
    basis: str  # "flops", "bytes" or "even"
    us: float
    calls: float

    @property
    def label(self) -> str:
        """The blocks it fused, joined with '+'."""
        return "+".join(self.blocks)


@dataclass(frozen=True)
class Repeats:
    """One owner that runs several times in a step (a block's scope or backward node in every layer):
    its exclusive times there, as the median and the largest; only kept where the largest is at
    least twice the median (an instance worth a look: analysis/noise.py judges it)."""

    name: str  # block or part
    phase: str
    owner: str  # the range's own name (a scope, or an autograd node such as AddmmBackward0)
    step: int
    n: int
    median_us: float
    max_us: float


@dataclass
class Attribution:
    """Per-block time of the profiled steps; ``per_step[i]`` maps (name, phase) to us in step i."""

    steps: int
    step_us: list[float]
    parts: list[Part]
    clock: Clock
    notes: list[str] = field(default_factory=list)
    per_step: list[dict[Key, float]] = field(default_factory=list)
    # What the profiler recorded per step, by the (name, phase) whose time each record inflates:
    # the profiler's cost is per event, so these counts are what a correction scales with.
    events: dict[Key, EventCounts] = field(default_factory=dict)
    # Compiled runs: the part of each (name, phase)'s time per step that came from fused kernels,
    # and the fused kernels themselves; ``compiled`` says a kernel record was applied.
    fused_per_step: list[dict[Key, float]] = field(default_factory=list)
    fused_kernels: list[FusedKernel] = field(default_factory=list)
    compiled: bool = False
    # Work each (name, phase) issued per step (mean): the operators called directly in it (eager),
    # plus the compiled kernels it owns (a fused kernel counts once for each of its blocks).
    issued: dict[Key, float] = field(default_factory=dict)
    # CPU clock: owners repeated in a step whose largest instance is far above their median.
    repeats: list[Repeats] = field(default_factory=list)
    # CPU clock: for the time no block claims (``other`` in a phase), the operators called directly in it: their
    # profiled time per step (us, children included) all together, and by name, largest first (at most three)
    other_ops: dict[Key, tuple[float, list[tuple[str, float]]]] = field(default_factory=dict)

    @property
    def mean_step_us(self) -> float:
        """Mean profiled step, microseconds."""
        return float(np.mean(self.step_us)) if self.step_us else 0.0

    def total_us(self) -> float:
        """Sum of the parts: the mean profiled step (CPU clock) or the step with idle (device clock)."""
        return sum(p.us for p in self.parts)

    def by_phase(self, phase: str) -> dict[str, float]:
        """Block name -> mean us per step, for one phase."""
        return {p.name: p.us for p in self.parts if p.phase == phase}


def comm_label(name: str) -> str:
    """The row a communication event belongs to."""
    low = name.lower()
    if "all_gather" in low or "allgather" in low:
        return names.ALLGATHER
    if "allreduce" in low or "reducer" in low or "reduce" in low:
        return names.ALLREDUCE
    return names.COMM  # e.g. DDP's buffer broadcast, FSDP's resharding


def _step_windows(table: TraceTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, row) of each profiled step; row -1 when the trace has no ProfilerStep range."""
    steps = profiler_steps(table)
    if len(steps):
        ts = steps["ts"].astype(float)
        return ts, ts + steps["dur"].astype(float), steps["row"]
    ev = table.event_cols
    host = np.flatnonzero(kinds.op_mask(table) | kinds.annotation_mask(table))
    if host.size == 0:
        return np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
    ts = ev["ts"][host]
    end = ts + ev["dur"][host]
    return np.array([ts.min()]), np.array([end.max()]), np.array([-1])


def _containing(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the latest-starting interval in (starts, ends) that contains each t, else -1.

    The intervals are phase scopes or steps: they do not overlap, so the latest start is the one.
    """
    if starts.size == 0:
        return np.full(len(t), -1, dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    pos = np.searchsorted(s, t, side="right") - 1
    ok = (pos >= 0) & (t < e[np.maximum(pos, 0)])
    return np.where(ok, order[np.maximum(pos, 0)], -1)


def _pick(rows: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """rows[idx] where idx >= 0, else -1 (rows may be empty)."""
    if rows.size == 0:
        return np.full(len(idx), -1, dtype=np.int64)
    return np.where(idx >= 0, rows[np.maximum(idx, 0)], -1)


@dataclass
class _Owners:
    """The owner ranges of a trace: which rows, in which step, under which (name, phase)."""

    rows: np.ndarray  # owner rows in the profiled steps
    step_of: np.ndarray  # index of the step each row is in
    mask: np.ndarray  # owner rows, over the whole table
    scope_mask: np.ndarray  # lmprof scopes and ProfilerStep ranges (record_function), over the table
    phase_rows: np.ndarray  # rows of phase scopes (forward, backward, prefill, decode)
    bwd_rows: np.ndarray  # rows of backward scopes
    label: dict[int, Key]
    unmapped_backward: int  # backward nodes with no forward op in a block scope
    kernels: dict[int, KernelOwner] = field(default_factory=dict)  # compiled kernels' rows: their split


# torch.compile's runtime ranges around a compiled graph (see the module docstring)
_COMPILED_CALL_NAMES = frozenset({
    "TorchDynamo Cache Lookup", "Pregraph bytecode", "AOTDispatcher Runtime Wrapper Prologue", "CompiledFunction",
})  # fmt: skip
_COMPILED_CALL_PREFIXES = ("Torch-Compiled Region", "## Call CompiledFxGraph")
_COMPILED_BACKWARD = "CompiledFunctionBackward"


def _is_compiled_call(name: str) -> bool:
    return name in _COMPILED_CALL_NAMES or name.startswith(_COMPILED_CALL_PREFIXES)


def _scope_name(name: str) -> str:
    return name[len(names.SCOPE_PREFIX):]


def _find_owners(table: TraceTable, s0: np.ndarray, s1: np.ndarray, step_rows: np.ndarray,
                 compiled: Sequence[dict[str, Any]] = ()) -> _Owners:
    """Every owner range of the profiled steps, labelled (see the module doc for the rules)."""
    ev = table.event_cols
    name_col = table.names()
    ts, dur = np.asarray(ev["ts"], dtype=float), np.maximum(np.asarray(ev["dur"], dtype=float), 0.0)
    host = kinds.op_mask(table) | kinds.annotation_mask(table)
    scope_mask = kinds.annotation_mask(table) & kinds.name_mask(table, lambda n: n.startswith(names.SCOPE_PREFIX))
    phase_mask = scope_mask & kinds.name_mask(table, lambda n: _scope_name(n) in names.PHASES)
    leaf_mask = scope_mask & kinds.name_mask(table, lambda n: _scope_name(n) in names.LEAF_PARTS)
    block_mask = scope_mask & ~phase_mask & ~leaf_mask
    comm_mask = host & kinds.name_mask(table, lambda n: n.startswith(COMM_PREFIXES))
    # torch's own range around a DataLoader's __next__ (the loop fetching its batch): the step's data
    data_mask = host & kinds.name_mask(table, lambda n: n.startswith(DATA_PREFIX))
    phase_rows = np.flatnonzero(phase_mask)
    phase_name = np.array([_scope_name(n) for n in name_col[phase_rows]], dtype=object)
    bwd_rows = phase_rows[phase_name == "backward"]
    bwd_start, bwd_end = ts[bwd_rows], ts[bwd_rows] + dur[bwd_rows]
    # Backward nodes count only inside a backward scope (never, say, a stray one before the steps).
    node_mask = backward_node_mask(table)
    node_rows = np.flatnonzero(node_mask)
    node_mask[node_rows[_containing(bwd_start, bwd_end, ts[node_rows]) < 0]] = False
    step_mask = np.zeros(len(ev), dtype=bool)
    step_mask[step_rows[step_rows >= 0]] = True
    # Compiled graphs' kernels, named by the blocks they came from (trace/compiled.py).
    kernel_label = kernel_owners(table, compiled) if compiled else {}
    kernel_mask = np.zeros(len(ev), dtype=bool)
    kernel_mask[list(kernel_label)] = True
    # Only with the kernel record: without it the kernels inside are unnamed, and the call's whole
    # time (compute included) would pass for overhead.
    call_mask = host & kinds.name_mask(table, _is_compiled_call) & ~node_mask if compiled else np.zeros(len(ev), bool)
    owner_mask = scope_mask | node_mask | comm_mask | step_mask | kernel_mask | call_mask | data_mask
    rows = np.flatnonzero(owner_mask)
    step_of = _containing(s0, s1, ts[rows])
    rows, step_of = rows[step_of >= 0], step_of[step_of >= 0]

    label: dict[int, Key] = {}
    for r in rows[leaf_mask[rows]]:
        label[int(r)] = (_scope_name(name_col[r]), names.STEP)
    for r in rows[data_mask[rows]]:
        label[int(r)] = (names.DATA, names.STEP)
    # the model's forward is claimed whole (its model_glue range holds all of it): in a generation, the
    # phase's own time is then the generation loop's, between forwards
    glue = bool((block_mask & kinds.name_mask(table, lambda n: _scope_name(n) == names.MODEL_GLUE)).any())
    for r, p in zip(phase_rows, phase_name):
        # a phase scope's own time: in the backward, the autograd engine between nodes; in a generation
        # whose model's forward is claimed, the generation loop; else unclaimed
        own = (names.AUTOGRAD_ENGINE if p == "backward"
               else names.GENERATE_LOOP if glue and p in names.INFER_PHASES else names.OTHER)
        label[int(r)] = (own, str(p))
    # Blocks take the phase of the innermost phase scope around them on their thread.
    blocks = rows[block_mask[rows]]
    for r, p in zip(blocks, enclosing(table, blocks, phase_mask)):
        label[int(r)] = (_scope_name(name_col[r]), _scope_name(name_col[p]) if p >= 0 else names.STEP)
    # Backward nodes: the block of the forward op that made them.
    nodes = rows[node_mask[rows]]
    unmapped = 0
    any_blocks = bool(block_mask.any())
    for r, b in zip(nodes, enclosing(table, forward_op(table, nodes), block_mask)):
        if "AccumulateGrad" in name_col[r]:
            block = names.ACCUMULATE_GRAD
        elif compiled and name_col[r].endswith(_COMPILED_BACKWARD):
            block = names.COMPILED_CALL
        else:
            block = _scope_name(name_col[b]) if b >= 0 else names.OTHER
            unmapped += b < 0 and any_blocks  # worth a note only when the trace has block scopes
        label[int(r)] = (block, "backward")
    # Collectives: in the backward scope running at the time (the reducer runs on the engine's
    # thread), else in the phase scope around them on their thread, else the step.
    comms = rows[comm_mask[rows] & ~node_mask[rows]]
    comm_bwd = _containing(bwd_start, bwd_end, ts[comms])
    for r, b, p in zip(comms, comm_bwd, enclosing(table, comms, phase_mask)):
        phase = "backward" if b >= 0 else (_scope_name(name_col[p]) if p >= 0 else names.STEP)
        label[int(r)] = (comm_label(name_col[r]), phase)
    for r in rows[step_mask[rows]]:
        label[int(r)] = (names.OTHER, names.STEP)
    calls = rows[call_mask[rows]]  # compiled backward graphs may run on the engine's thread
    for r, b, p in zip(calls, _containing(bwd_start, bwd_end, ts[calls]), enclosing(table, calls, phase_mask)):
        phase = "backward" if b >= 0 else (_scope_name(name_col[p]) if p >= 0 else names.STEP)
        label[int(r)] = (names.COMPILED_CALL, phase)
    kernels = rows[kernel_mask[rows]]  # a compiled backward graph may run on the engine's thread
    for r, b, p in zip(kernels, _containing(bwd_start, bwd_end, ts[kernels]), enclosing(table, kernels, phase_mask)):
        phase = "backward" if b >= 0 else (_scope_name(name_col[p]) if p >= 0 else names.STEP)
        label[int(r)] = (kernel_label[int(r)].main, phase)
    return _Owners(rows, step_of, owner_mask, scope_mask | step_mask, phase_rows, bwd_rows, label, unmapped,
                   {int(r): kernel_label[int(r)] for r in kernels})


class _Credit:
    """Adds an owner's time to its (name, phase) per step, splitting a compiled kernel among its blocks."""

    def __init__(self, n_steps: int, kernels: dict[int, KernelOwner]):
        self.totals: list[dict[Key, float]] = [defaultdict(float) for _ in range(n_steps)]
        self.fused: list[dict[Key, float]] = [defaultdict(float) for _ in range(n_steps)]
        self.calls: dict[Key, int] = defaultdict(int)
        self.kernels = kernels
        # (kernel, phase, blocks, shares, basis) -> [us over all steps, calls over all steps]
        self.fused_kernels: dict[tuple[str, str, tuple[str, ...], tuple[float, ...], str], list[float]] = {}

    def add(self, step: int, row: int, key: Key, us: float, call: bool = True) -> None:
        """Credit ``us`` of owner ``row`` (labelled ``key``) in ``step``; ``call``: count one call."""
        owner = self.kernels.get(row)
        if owner is None:
            self.totals[step][key] += us
            self.calls[key] += call
            return
        for block, share in zip(owner.blocks, owner.shares):
            bk = (block, key[1])
            self.totals[step][bk] += us * share
            self.calls[bk] += call
            if owner.fused:
                self.fused[step][bk] += us * share
        if owner.fused:
            acc = self.fused_kernels.setdefault((owner.kernel, key[1], owner.blocks, owner.shares, owner.basis), [0.0, 0.0])
            acc[0] += us
            acc[1] += call

    def count_call(self, row: int, key: Key) -> None:
        """One call of owner ``row`` (device clock: counted once per owner that launched work)."""
        owner = self.kernels.get(row)
        for block in owner.blocks if owner else (key[0],):
            self.calls[(block, key[1])] += 1
        if owner and owner.fused:
            self.fused_kernels.setdefault((owner.kernel, key[1], owner.blocks, owner.shares, owner.basis),
                                          [0.0, 0.0])[1] += 1

    def fused_table(self, n_steps: int) -> list[FusedKernel]:
        """The fused kernels, per step means, largest first."""
        rows = [FusedKernel(k, phase, blocks, shares, basis, us / n_steps, calls / n_steps)
                for (k, phase, blocks, shares, basis), (us, calls) in self.fused_kernels.items()]
        return sorted(rows, key=lambda f: -f.us)


def _logical_parents(table: TraceTable, own: _Owners, step_rows: np.ndarray) -> np.ndarray:
    """Parent owner row of each owner: the innermost owner around it on its thread; an orphan inside
    a backward scope (the autograd engine's thread) nests in that scope, any other orphan in its
    step (-1 where the step is not a ProfilerStep range)."""
    ev = table.event_cols
    ts, dur = np.asarray(ev["ts"], dtype=float), np.maximum(np.asarray(ev["dur"], dtype=float), 0.0)
    tid = ev["tid"]
    rows = own.rows
    parent = enclosing(table, rows, own.mask)
    orphan = (parent < 0) & ~np.isin(rows, step_rows)
    bwd_row = _pick(own.bwd_rows, _containing(ts[own.bwd_rows], ts[own.bwd_rows] + dur[own.bwd_rows], ts[rows]))
    to_bwd = orphan & (bwd_row >= 0) & (tid[rows] != tid[np.maximum(bwd_row, 0)])
    parent[to_bwd] = bwd_row[to_bwd]
    to_step = orphan & ~to_bwd
    parent[to_step] = step_rows[own.step_of[to_step]]
    return parent


def _exclusive_us(table: TraceTable, rows: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each owner's duration minus its children's time inside it (clipped to the parent: a node on
    the engine's thread can outlive the backward scope by a little)."""
    ev = table.event_cols
    ts, dur = np.asarray(ev["ts"], dtype=float), np.maximum(np.asarray(ev["dur"], dtype=float), 0.0)
    exclusive = dur[rows].copy()
    pos = {int(r): i for i, r in enumerate(rows)}
    for i, p in enumerate(parent):
        if p >= 0:
            exclusive[pos[int(p)]] -= max(0.0, min(ts[rows[i]] + dur[rows[i]], ts[p] + dur[p]) - ts[rows[i]])
    return exclusive


def attribute(table: TraceTable, clock: Clock | None = None, compiled: Sequence[dict[str, Any]] = ()) -> Attribution:
    """Per-block time of the profiled steps in ``table`` (see the module doc for the rules).

    ``compiled``: the compiled graphs' kernel records (compiled_kernels.json), so that compiled
    kernels' time goes to their blocks (trace/compiled.py).
    """
    clock = clock or ("device" if table.has_gpu else "cpu")
    s0, s1, step_rows = _step_windows(table)
    if s0.size == 0:
        return Attribution(0, [], [], clock, ["trace has no host events"])
    own = _find_owners(table, s0, s1, step_rows, compiled)
    parent = _logical_parents(table, own, step_rows)
    n_steps = len(s0)
    credit = _Credit(n_steps, own.kernels)
    totals, calls = credit.totals, credit.calls
    notes: list[str] = []
    repeats: list[Repeats] = []
    if clock == "cpu":
        exclusive = _exclusive_us(table, own.rows, parent)
        _give_launch_gaps(table, own, parent, exclusive)
        for i, (r, us) in enumerate(zip(own.rows, exclusive)):
            credit.add(int(own.step_of[i]), int(r), own.label[int(r)], float(us))
        repeats = _repeats(table, own, exclusive)
        # A step without a ProfilerStep range: what no top-level owner covers is the step's "other".
        ev = table.event_cols
        start = np.asarray(ev["ts"], dtype=float)[own.rows]
        end = start + np.maximum(np.asarray(ev["dur"], dtype=float)[own.rows], 0.0)
        for k in np.flatnonzero(step_rows < 0):
            top = (own.step_of == k) & (parent < 0)
            covered = float(np.minimum(end[top], s1[k]).sum() - start[top].sum())
            totals[k][(names.OTHER, names.STEP)] += (s1[k] - s0[k]) - covered
            calls[(names.OTHER, names.STEP)] += 1
    else:
        step_set = set(step_rows.tolist())
        for r in _device_time(table, own.mask, own.label, own.phase_rows, s0, s1, credit, notes):
            if r not in step_set:
                credit.count_call(r, own.label[r])
    if own.unmapped_backward:
        notes.append(f"{own.unmapped_backward} backward node(s) had no forward op inside a block scope: "
                     "shown as backward 'other'")
    keys = sorted({k for t in totals for k in t})
    parts = [Part(k[0], k[1], sum(t.get(k, 0.0) for t in totals) / n_steps, calls[k] / n_steps) for k in keys]
    parts = [p for p in parts if p.us != 0.0 or p.calls]
    host = kinds.op_mask(table) | kinds.annotation_mask(table)
    counts = _event_counts(table, host, own.mask, own.scope_mask, own.rows, parent, own.label, n_steps)
    return Attribution(n_steps, [float(e - s) for s, e in zip(s0, s1)], parts, clock, notes,
                       [dict(t) for t in totals], counts, [dict(f) for f in credit.fused],
                       credit.fused_table(n_steps), bool(compiled), _issued(table, own, n_steps), repeats,
                       _other_ops(table, own, n_steps) if clock == "cpu" else {})


def _give_launch_gaps(table: TraceTable, own: _Owners, parent: np.ndarray, exclusive: np.ndarray) -> None:
    """Move each compiled graph call's time before one of its kernels (since the call began, or its
    previous owner ended) from the call's exclusive time to that kernel's (module doc: compiled calls)."""
    if not own.kernels:
        return
    ev = table.event_cols
    ts, dur = np.asarray(ev["ts"], dtype=float), np.maximum(np.asarray(ev["dur"], dtype=float), 0.0)
    pos = {int(r): i for i, r in enumerate(own.rows)}
    children: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(parent):
        if p >= 0 and own.label.get(int(p), ("",))[0] == names.COMPILED_CALL:
            children[int(p)].append(i)
    for call, kids in children.items():
        if not any(int(own.rows[i]) in own.kernels for i in kids):
            continue
        at = ts[call]  # where the wrapper's own time since the last owner began
        for i in sorted(kids, key=lambda i: ts[own.rows[i]]):
            r = int(own.rows[i])
            if r in own.kernels:
                gap = max(0.0, ts[r] - at)
                exclusive[i] += gap
                exclusive[pos[call]] -= gap
            at = max(at, ts[r] + dur[r])


def _repeats(table: TraceTable, own: _Owners, exclusive: np.ndarray) -> list[Repeats]:
    """Owners of one name and label run 3+ times in a step whose largest exclusive time is at least
    twice their median: with one profiled step, the only sign of a disturbance inside a block."""
    name_col = table.names()
    groups: dict[tuple[int, Key, str], list[float]] = defaultdict(list)
    for i, r in enumerate(own.rows):
        if int(r) not in own.kernels:
            groups[(int(own.step_of[i]), own.label[int(r)], str(name_col[r]))].append(float(exclusive[i]))
    out = []
    for (step, key, owner), xs in groups.items():
        if len(xs) >= 3:
            med, top = float(np.median(xs)), max(xs)
            if top >= 2 * med:
                out.append(Repeats(key[0], key[1], owner, step, len(xs), med, top))
    return out


def _issued(table: TraceTable, own: _Owners, n_steps: int) -> dict[Key, float]:
    """Per (name, phase), operators per step whose direct parent is one of its owner ranges, plus
    its compiled kernels (each kernel owner counts 1 for each block it is split among)."""
    out: dict[Key, float] = defaultdict(float)
    in_steps = set(own.rows.tolist())
    ops = np.flatnonzero(kinds.op_mask(table) & ~own.mask)
    par = parents(table)[ops]
    for p in par[par >= 0].tolist():
        if p in in_steps and p not in own.kernels:
            out[own.label[p]] += 1 / n_steps
    for r, owner in own.kernels.items():
        for block in owner.blocks:
            out[(block, own.label[r][1])] += 1 / n_steps
    return dict(out)


def _other_ops(table: TraceTable, own: _Owners, n_steps: int,
               most: int = 3) -> dict[Key, tuple[float, list[tuple[str, float]]]]:
    """Per ``other`` (name, phase), the operators whose direct parent is one of its ranges: their time per step
    (us, their own children included), all together and by name, the ``most`` largest."""
    others = np.array([r for r, k in own.label.items() if k[0] == names.OTHER], dtype=np.int64)
    if others.size == 0:
        return {}
    ops = np.flatnonzero(kinds.op_mask(table) & ~own.mask)
    par = parents(table)[ops]
    hit = np.isin(par, others)
    ops, par = ops[hit], par[hit]
    dur = np.maximum(np.asarray(table.event_cols["dur"], dtype=float), 0.0)
    name_col = table.names()
    sums: dict[Key, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r, p in zip(ops.tolist(), par.tolist()):
        sums[own.label[p]][str(name_col[r])] += float(dur[r]) / n_steps
    return {k: (sum(v.values()), sorted(v.items(), key=lambda kv: -kv[1])[:most]) for k, v in sums.items()}


def _event_counts(
    table: TraceTable, host: np.ndarray, owner_mask: np.ndarray, range_is_scope: np.ndarray,
    owners: np.ndarray, parent: np.ndarray, label: dict[int, Key], n_steps: int,
) -> dict[Key, EventCounts]:
    """Per (name, phase), the recorded events per step whose cost lands in its time."""
    counts: dict[Key, EventCounts] = defaultdict(EventCounts)
    known = set(owners.tolist())
    rows = np.flatnonzero(host & ~owner_mask)
    inner = enclosing(table, rows, owner_mask)
    hit, n = np.unique(inner[inner >= 0], return_counts=True)
    for r, c in zip(hit, n):
        if int(r) in known:
            counts[label[int(r)]].ops += c / n_steps
    for r, p in zip(owners, parent):
        scope = bool(range_is_scope[r])
        own = counts[label[int(r)]]
        if scope:
            own.scopes += 1 / n_steps
        else:
            own.op_ranges += 1 / n_steps
        if p >= 0 and int(p) in known:
            up = counts[label[int(p)]]
            if scope:
                up.child_scopes += 1 / n_steps
            else:
                up.child_op_ranges += 1 / n_steps
    return dict(counts)


def _device_time(
    table: TraceTable, owner_mask: np.ndarray, label: dict[int, Key], phase_rows: np.ndarray,
    s0: np.ndarray, s1: np.ndarray, credit: _Credit, notes: list[str],
) -> set[int]:
    """Device clock: kernels' time to the owner around their launch; the rest of the step is idle.

    Returns the owner rows that launched device work (each is one call of its row).
    """
    ev = table.event_cols
    ts, dur = np.asarray(ev["ts"], dtype=float), np.maximum(np.asarray(ev["dur"], dtype=float), 0.0)
    dev = np.flatnonzero(kinds.device_mask(table) & (ev["correlation"] >= 0))
    rt = launching_calls(table, dev)
    dev, rt = dev[rt >= 0], rt[rt >= 0]
    step_k = _containing(s0, s1, ts[rt])
    dev, rt, step_k = dev[step_k >= 0], rt[step_k >= 0], step_k[step_k >= 0]
    owner = enclosing(table, rt, owner_mask)
    # A launch outside every owner on its thread (the autograd engine's own work, a helper thread)
    # belongs to the phase that was running at the time, else to the step.
    in_phase = _containing(ts[phase_rows], ts[phase_rows] + dur[phase_rows], ts[rt])
    owner = np.where(owner >= 0, owner, _pick(phase_rows, in_phase))
    busy = np.zeros(len(s0))
    launched: set[int] = set()
    for k, o, d in zip(step_k, owner, dur[dev]):
        if o >= 0 and int(o) in label:
            launched.add(int(o))
        key = label.get(int(o), (names.OTHER, names.STEP)) if o >= 0 else (names.OTHER, names.STEP)
        credit.add(int(k), int(o), key, float(d), call=False)
        busy[k] += float(d)
    # Device clock: owners with no device time are not rows of their own.
    totals = credit.totals
    for k in range(len(s0)):
        for key in [key for key, v in totals[k].items() if v == 0.0]:
            del totals[k][key]
        idle = (s1[k] - s0[k]) - busy[k]
        if idle < 0 and not any("overlap" in n for n in notes):
            notes.append("kernels on several streams overlap: device time exceeds the step's wall time")
        totals[k][(names.IDLE, names.STEP)] += idle
    return launched
