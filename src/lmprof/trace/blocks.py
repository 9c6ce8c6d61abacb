"""Blocks from named ranges: NVTX ranges (or any annotation or operator) mapped to model blocks.

A **block map** is an ordered list of rules ``pattern -> block``: the first rule whose pattern (a
glob: ``*`` any text, ``?`` one character, case-sensitive, matched against the whole range name; ``[...]`` a character class)
matches a range's name gives its block; a ``*`` in the block name stands for the text the
pattern's one ``*`` matched (``"lmprof:*": "*"`` keeps what follows the prefix). Ranges are the
trace's annotations and operators (for an Nsight Systems export: its NVTX ranges, emit_nvtx's
suffixes cut off, see :mod:`lmprof.trace.nsys.names`).

Maps: a user's YAML file (``--blocks map.yaml``: one mapping of pattern to block, in order, read
with :mod:`lmprof.safeyaml`) or the built-in presets (:data:`PRESETS`), used on Nsight Systems
exports whose ranges match one of a preset's marker patterns:

* ``lmprof``: lmprof's own ``lmprof:<block>`` scopes (emit_nvtx records them as NVTX ranges);
* ``llm.c``: llm.c's ``NvtxRange`` markers: ``Layer N`` per transformer layer, the kernels'
  launcher functions (``NVTX_RANGE_FN``: ``attention_forward_cudnn``, ``matmul_cublaslt``, ...),
  ``gpt2_forward`` / ``gpt2_backward_and_reduce`` as the forward and backward phases.

**Attribution.** Each device event of the device window (kernel, copy, set) belongs to the
innermost mapped range enclosing the runtime call that launched it (on the call's thread). Rows
are block **paths** (mapped ranges inside mapped ranges: ``forward > layer > attn.sdpa``), each with
its ranges (``calls``, split into forward and backward: a range is in the backward when its own
name or an enclosing range's contains ``backward``, any case), the device events and their summed
duration inside it at any depth (``device_us``, inclusive) and directly (``self_device_us``). The
top-level rows' ``device_us`` plus ``unattributed_us`` is the window's summed device time.
"""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import numpy as np

from lmprof.errors import ConfigError
from lmprof.trace import kinds
from lmprof.trace.launches import launch_columns
from lmprof.trace.load import TraceTable
from lmprof.trace.nesting import parents
from lmprof.trace.records import Record
from lmprof.trace.timeline import DeviceSelection, before_cutoff, launch_cutoff

SEP = " > "
MAX_RULES = 1_000
MAX_PATTERN = 500
_MAX_NAME = 2_000  # longer names are matched on their first characters only


class BlockMap(Record, frozen=True):
    """Rules ``(pattern, block)`` in order; ``source`` says where they came from."""

    source: str
    rules: list[tuple[str, str]]
    markers: list[str] = []  # patterns that say the preset applies (presets only)


PRESETS: tuple[BlockMap, ...] = (
    BlockMap("lmprof scopes", [("lmprof:*", "*")], ["lmprof:*"]),
    BlockMap(
        "llm.c",
        [
            ("gpt2_forward", "forward"),
            ("gpt2_backward_and_reduce", "backward"),
            ("Layer *", "layer"),
            ("encoder_forward", "embedding"), ("encoder_backward", "embedding"),
            ("layernorm_forward", "layernorm"), ("layernorm_backward", "layernorm"),
            ("attention_forward_cudnn", "attn.sdpa"), ("attention_backward_cudnn", "attn.sdpa"),
            ("attention_forward", "attn.sdpa"), ("attention_backward", "attn.sdpa"),
            ("matmul_cublaslt", "matmul"), ("matmul_backward", "matmul"), ("matmul_forward*", "matmul"),
            ("gelu_forward", "mlp.act"), ("gelu_backward*", "mlp.act"),
            ("residual_forward", "residual"),
            ("classifier_and_loss", "lm_head+loss"), ("fused_classifier", "loss"),
            ("gpt2_calculate_grad_norm", "grad_clip"),
            ("gpt2_update", "optimizer"),
            ("multi_gpu_async_reduce_gradient", "allreduce"),
        ],
        ["Layer *"],
    ),
)  # fmt: skip


class BlockRow(Record, frozen=True):
    """One block path; device figures summed over the device events attributed to it (microseconds)."""

    path: str
    block: str
    depth: int
    calls: int  # ranges mapped to this path (those of the device window's steps, see block_breakdown)
    forward_calls: int
    backward_calls: int  # ranges inside a range named like a backward (see the module docstring)
    device_events: int  # inside at any depth
    device_us: float  # inclusive: summed duration of those events (concurrent ones each counted)
    self_device_us: float  # attributed to this path directly
    kernels: int  # of device_events, kernels (not copies or sets)
    device_pct: float  # device_us over the window's summed device time


class BlockBreakdown(Record, frozen=True):
    """Blocks of one trace (see the module docstring); every figure measured from the trace."""

    source: str  # the map: a preset's name or the user's file
    ranges: int  # ranges mapped to a block and counted
    device_events: int  # in the device window
    device_us: float  # their summed duration
    unattributed_events: int  # device events outside every mapped range (or not linked to a launch)
    unattributed_us: float
    rows: list[BlockRow]


def read_block_map(path: str | Path) -> BlockMap:
    """A user's map: a YAML mapping ``pattern: block`` (strings), in order; ConfigError otherwise."""
    from lmprof.safeyaml import load_file

    data = load_file(Path(path))
    if isinstance(data, dict) and set(data) == {"blocks"}:
        data = data["blocks"]  # also accepted: the rules under one "blocks:" key
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--blocks {path}: expected a YAML mapping of NVTX name pattern to block, "
                          f"like '\"Layer *\": layer'")
    if len(data) > MAX_RULES:
        raise ConfigError(f"--blocks {path}: {len(data):,} rules; at most {MAX_RULES:,}")
    rules = []
    for k, v in data.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or not v.strip():
            raise ConfigError(f"--blocks {path}: every rule is a pattern (text) and a block name (text); "
                              f"got {_short(k)}: {_short(v)}")
        if len(k) > MAX_PATTERN or len(v) > MAX_PATTERN:
            raise ConfigError(f"--blocks {path}: a pattern or block longer than {MAX_PATTERN} characters")
        if "*" in v and (k.count("*") != 1 or "?" in k or "[" in k):
            raise ConfigError(f"--blocks {path}: block {_short(v)} takes what '*' matched, so its pattern "
                              f"{_short(k)} must hold exactly one '*' (and no '?' or '[')")
        rules.append((k, v.strip()))
    return BlockMap(str(path), rules)


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


class _Matcher:
    """First matching rule wins. Globs are compiled by :func:`fnmatch.translate`, whose regexes never
    backtrack catastrophically; a block's ``*`` takes what the pattern's one ``*`` matched."""

    def __init__(self, bmap: BlockMap) -> None:
        self.rules = [(re.compile(fnmatch.translate(p)), p, b) for p, b in bmap.rules]

    def block(self, name: str) -> str | None:
        name = name[:_MAX_NAME]
        for rx, pattern, b in self.rules:
            if rx.match(name):
                if "*" not in b:
                    return b
                head, _, tail = pattern.partition("*")
                return b.replace("*", name[len(head): len(name) - len(tail)]) or None
        return None


def preset_for(table: TraceTable) -> BlockMap | None:
    """The first preset whose marker patterns match a range of ``table`` (None: no preset applies)."""
    names = _range_names(table)
    for preset in PRESETS:
        rx = [re.compile(fnmatch.translate(m)) for m in preset.markers]
        if any(r.match(str(n)[:_MAX_NAME]) for n in names for r in rx):
            return preset
    return None


def _range_mask(table: TraceTable) -> np.ndarray:
    return kinds.annotation_mask(table) | kinds.op_mask(table)


def _range_names(table: TraceTable) -> list[str]:
    ev = table.event_cols
    codes = np.unique(ev["name"][_range_mask(table)])
    labels = ev.labels("name")
    return [str(labels[c]) for c in codes if c >= 0]


def block_breakdown(
    table: TraceTable, sel: DeviceSelection | None, bmap: BlockMap, include_last_step: bool = False
) -> BlockBreakdown | None:
    """Device time per block path of ``table`` under ``bmap``; None when no range maps to a block.

    ``sel``: the device window (:func:`lmprof.trace.timeline.select_device`); its events are the
    ones counted, and when its rule cuts at the last step, so are the ranges (``calls``): those that
    start before the cut, as the window's events were launched before it."""
    ev = table.event_cols
    labels, codes = ev.labels("name"), ev["name"]
    match = _Matcher(bmap)
    by_code = [match.block(str(n)) for n in labels]
    block_names = sorted({b for b in by_code if b is not None})
    if not block_names:
        return None
    index = {b: i for i, b in enumerate(block_names)}
    code_block = np.array([index[b] if b is not None else -1 for b in by_code] + [-1], dtype=np.int64)
    ranges = _range_mask(table)
    row_block = np.where(ranges, code_block[codes], -1)
    mapped = np.flatnonzero(row_block >= 0)
    if mapped.size == 0:
        return None
    parent = parents(table)
    backward_code = np.array(["backward" in str(n).lower() for n in labels] + [False], dtype=bool)
    backward_row = np.where(ranges | kinds.host_mask(table), backward_code[codes], False)
    # each mapped range's path (tuple of blocks, outermost first) and phase, parents before children
    path_id: dict[int, int] = {}
    paths: list[tuple[str, ...]] = []
    path_index: dict[tuple[str, ...], int] = {}
    in_backward: dict[int, bool] = {}
    calls: dict[int, list[int]] = {}

    def resolve(r: int) -> tuple[int, bool]:
        """(path id of mapped row r, whether r is in the backward); walks up to the nearest resolved row."""
        chain = []
        cur = r
        while cur >= 0 and cur not in path_id:
            chain.append(cur)
            cur = int(parent[cur])
        base = path_id.get(cur, -1)
        back = in_backward.get(cur, False)
        for x in reversed(chain):
            back = back or bool(backward_row[x])
            if row_block[x] >= 0:
                key = (paths[base] if base >= 0 else ()) + (block_names[row_block[x]],)
                base = path_index.setdefault(key, len(paths))
                if base == len(paths):
                    paths.append(key)
            path_id[x] = base
            in_backward[x] = back
        return base, back

    cut = None if sel is not None and sel.window.rule.startswith("all") else launch_cutoff(table, include_last_step)
    counted = mapped if cut is None else mapped[before_cutoff(ev["ts"][mapped], cut, include_last_step)]
    for r in counted.tolist():
        pid, back = resolve(r)
        fc = calls.setdefault(pid, [0, 0])
        fc[1 if back else 0] += 1
    # device events: the path of the innermost mapped range around their launching call
    rows = np.flatnonzero(kinds.device_mask(table)) if sel is None else sel.rows
    dur = table.durations()[rows]
    is_kernel = kinds.kernel_mask(table)[rows]
    rt = launch_columns(table, rows, ["runtime"])["runtime"]
    ev_path = np.full(len(rows), -1, dtype=np.int64)
    for i, call in enumerate(rt.tolist()):
        if call >= 0:
            ev_path[i] = resolve(call)[0]
    n_paths = len(paths)
    ok = ev_path >= 0
    self_us = np.bincount(ev_path[ok], weights=dur[ok], minlength=n_paths)
    self_n = np.bincount(ev_path[ok], minlength=n_paths)
    self_k = np.bincount(ev_path[ok], weights=is_kernel[ok], minlength=n_paths)
    total_us = float(dur.sum())
    out_rows = []
    for key in sorted(paths, key=_order(paths, self_us)):
        i = path_index[key]
        inside = [j for j, p in enumerate(paths) if p[: len(key)] == key]
        us = float(self_us[inside].sum())
        fc = calls.get(i, [0, 0])
        out_rows.append(BlockRow(
            path=SEP.join(key), block=key[-1], depth=len(key) - 1, calls=fc[0] + fc[1], forward_calls=fc[0],
            backward_calls=fc[1], device_events=int(self_n[inside].sum()), device_us=us,
            self_device_us=float(self_us[i]), kernels=int(self_k[inside].sum()),
            device_pct=100.0 * us / total_us if total_us > 0 else 0.0,
        ))  # fmt: skip
    return BlockBreakdown(
        source=bmap.source, ranges=int(counted.size), device_events=int(len(rows)), device_us=total_us,
        unattributed_events=int((~ok).sum()), unattributed_us=float(dur[~ok].sum()), rows=out_rows,
    )


def _order(paths: list[tuple[str, ...]], self_us: np.ndarray) -> Any:
    """Parents before children, siblings by inclusive device time (largest first), then name."""
    inclusive: dict[tuple[str, ...], float] = {}
    for i, p in enumerate(paths):
        for k in range(1, len(p) + 1):
            inclusive[p[:k]] = inclusive.get(p[:k], 0.0) + float(self_us[i])

    def key(p: tuple[str, ...]) -> list[tuple[float, str]]:
        return [(-inclusive.get(p[:k], 0.0), p[k - 1]) for k in range(1, len(p) + 1)]

    return key
