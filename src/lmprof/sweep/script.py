"""Sweeps over a user's own script: a grid over its command-line arguments, each point one ``lmprof run``.

A spec with ``script:`` is a script sweep (docs/sweeps.md). ``args`` maps each of the script's own
arguments to a list of values; the sweep is their Cartesian product (minus ``exclude`` rules, times
``repeats``). Each point runs ``python -m lmprof run --run-dir <runs/id> ... SCRIPT FIXED_ARGS GRID_ARGS``
as a subprocess of the sweep's worker, so a crash, an out-of-memory or a hang ends that point only,
exactly like a built-in point. Arguments are argv elements, never a shell line: a value with spaces,
``$`` or any unicode reaches the script exactly as written.

The store's ``batch_size`` and ``seq_len`` columns are NOT NULL: they take the values of the arguments
named by ``batch_size_arg`` / ``seq_len_arg``, and 0 (unknown) when the spec names none.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, field_validator, model_validator

from lmprof.config import AskedCounts
from lmprof.errors import LmprofError
from lmprof.modes import Mode, traits
from lmprof.safeyaml import short_repr

from lmprof.sweep.plan import Plan, check_rules, listed, matches, positive_seconds

ArgValue = str | int | float | bool
UNMAPPED = 0  # batch_size / seq_len of a point whose spec does not say which argument holds it
MAX_POINTS = 10_000  # the default grid bound of every sweep (spec.py too); `max_points: N` raises it


class ScriptPoint(AskedCounts):
    """One run of a script sweep: the script, its whole argv, and the axis values read from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ZERO_STEPS = True  # a script's run may time from its profiled steps (lmprof run --steps 0)

    mode: Mode
    model: str
    script: str
    argv: list[str]  # the script's own arguments, fixed ones first, exactly as it receives them
    grid: dict[str, str]  # this point's value of each swept argument (label, exclude rules)
    batch_size: int = UNMAPPED
    seq_len: int = UNMAPPED
    stop_after: bool = False
    repeat: int = 0

    # The store's axis columns a script does not choose through lmprof: the script picks its own
    # device and precision; `device_resolved` (from the run record) says which device it used.
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    attention: str = "auto"

    @property
    def id(self) -> str:
        """12 hex digits of a hash of the whole point (script, every argument, protocol, repeat)."""
        blob = json.dumps(self.model_dump(mode="json", exclude_none=True), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        """E.g. ``train nanogpt --batch_size=4 --block_size=32``."""
        parts = [self.mode, self.model, *(f"{k}={v}" for k, v in self.grid.items())]
        if self.repeat:
            parts.append(f"#{self.repeat + 1}")
        return " ".join(parts)

    @property
    def model_spec(self) -> dict[str, Any]:
        """What the store reads for its n_layer/n_head/n_embd columns: a script's model is its own."""
        return {"script": self.script}

    def command(self, run_dir: Path, python: str = sys.executable) -> list[str]:
        """The ``lmprof run`` command line of this point, as argv elements (never a shell string)."""
        cmd = [python, "-m", "lmprof", "run", "--no-report", "--out", str(run_dir.parent), "--run-dir", str(run_dir)]
        for key, value in self.asked().items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        if traits(self.mode).generates:
            cmd.append("--infer")
        if self.stop_after:
            cmd.append("--stop-after")
        return [*cmd, self.script, *self.argv]


def arg_text(value: ArgValue) -> str:
    """A YAML value as the argv element the script receives: ``str(value)`` (``true`` is ``True``,
    which nanoGPT's configurator reads back as a bool)."""
    return str(value)


def find_arg(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in an argv list, given as ``name value`` or ``name=value``; None when absent."""
    for i, item in enumerate(argv):
        if item == name and i + 1 < len(argv):
            return argv[i + 1]
        if item.startswith(name + "="):
            return item[len(name) + 1:]
    return None


class ScriptSweepSpec(AskedCounts):
    """A validated script sweep: ``args`` are the product's axes; the rest applies to every point."""

    model_config = ConfigDict(extra="forbid")
    ZERO_STEPS = True  # a script's run may time from its profiled steps (lmprof run --steps 0)

    script: str
    name: str | None = None
    args: dict[str, list[ArgValue]] = {}
    fixed_args: list[ArgValue] = []
    arg_style: Literal["separate", "equals"] = "separate"
    batch_size_arg: str | None = None
    seq_len_arg: str | None = None
    infer: bool = False
    stop_after: bool = False
    repeats: int = 1
    timeout_s: float = 600.0
    exclude: list[dict[str, Any]] = []
    max_points: int = MAX_POINTS

    @field_validator("script")
    @classmethod
    def _script(cls, v: str) -> str:
        from lmprof.pipeline.usercode.guard import check_target

        try:
            check_target(v, module=False)  # the rule `lmprof run` applies, said before anything runs
        except LmprofError as exc:
            raise ValueError(str(exc)) from None
        return v

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, v: object) -> object:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("must be a mapping of argument: [values], e.g. {--batch_size: [4, 8]}")
        out: dict[str, object] = {}
        for key, values in v.items():
            name = str(key)
            if not name.startswith("-"):
                raise ValueError(f"{short_repr(name, 40)}: an argument name starts with - "
                                 "(positional arguments go in fixed_args)")
            values = values if isinstance(values, list) else [values]
            if not values:
                raise ValueError(f"{name}: must not be empty (give at least one value)")
            bad = [x for x in values if x is None or isinstance(x, (list, dict))]
            if bad:
                raise ValueError(f"{name}: values must be strings or numbers, got {short_repr(bad[0], 40)}")
            texts = [arg_text(x) for x in values]
            dupes = sorted({t for t in texts if texts.count(t) > 1})
            if dupes:
                raise ValueError(f"{name}: duplicate value {short_repr(dupes[0], 40)}")
            out[name] = values
        return out

    @field_validator("fixed_args", mode="before")
    @classmethod
    def _fixed(cls, v: object) -> object:
        args = listed(v, "a list of argv elements, e.g. [config/train.py, --max_iters, 20]")
        bad = [x for x in args if x is None or isinstance(x, (list, dict))]
        if bad:
            raise ValueError(f"elements must be strings or numbers, got {short_repr(bad[0], 40)}")
        return args

    @field_validator("repeats")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if not 1 <= v <= 2**62:
            raise ValueError(f"must be between 1 and {2**62:,}, got {short_repr(v, 40)}")
        return v

    _timeout = field_validator("timeout_s")(positive_seconds)

    @model_validator(mode="after")
    def _mapped_axes(self) -> "ScriptSweepSpec":
        for key in ("batch_size_arg", "seq_len_arg"):
            name = getattr(self, key)
            if name is None:
                continue
            if name in self.args:
                values = [arg_text(x) for x in self.args[name]]
            else:
                found = find_arg([arg_text(x) for x in self.fixed_args], name)
                if found is None:
                    raise ValueError(f"{key}: {short_repr(name, 40)} is neither a key of args nor in fixed_args")
                values = [found]
            bad = [x for x in values if not (x.isdigit() and 0 < int(x) < 2**31)]
            if bad:
                raise ValueError(f"{key}: {name} must take whole numbers > 0 to fill the {key[:-4]} column, "
                                 f"got {short_repr(bad[0], 40)}")
        return self

    @model_validator(mode="after")
    def _rules(self) -> "ScriptSweepSpec":
        try:
            check_rules(self.exclude, list(self.args), "argument")
        except ValueError as exc:
            raise ValueError(f"exclude: {exc}") from None  # after the fields: say which one
        return self

    @model_validator(mode="after")
    def _bounded_grid(self) -> "ScriptSweepSpec":
        total = math.prod(len(v) for v in self.args.values()) * self.repeats
        if total > self.max_points:
            raise ValueError(f"the grid has {total:,} points, more than max_points ({self.max_points:,}): shrink "
                             f"args, or set max_points: {total} in the spec if you mean it")
        return self

    @property
    def model_name(self) -> str:
        """The ``model`` column: ``name``, else the script's file name without its suffix."""
        return self.name or Path(self.script).stem or "script"

    def expand(self) -> Plan[ScriptPoint]:
        """The product of ``args``, minus excluded points, times ``repeats``, in a stable order."""
        fixed = [arg_text(x) for x in self.fixed_args]
        names = list(self.args)
        kept: list[ScriptPoint] = []
        excluded = 0
        used = [0] * len(self.exclude)
        for combo in itertools.product(*(self.args[n] for n in names)):
            where = {n: arg_text(x) for n, x in zip(names, combo)}
            hits = [i for i, rule in enumerate(self.exclude)
                    if matches({k: _texts(v) for k, v in rule.items()}, where)]
            for i in hits:
                used[i] += 1
            if hits:
                excluded += 1
                continue
            argv = [*fixed]
            for n, value in where.items():
                argv += [f"{n}={value}"] if self.arg_style == "equals" else [n, value]
            batch, seq = (int(find_arg(argv, name) or UNMAPPED) if name else UNMAPPED
                          for name in (self.batch_size_arg, self.seq_len_arg))
            for r in range(self.repeats):
                kept.append(ScriptPoint(
                    mode="infer" if self.infer else "train", model=self.model_name, script=self.script, argv=argv,
                    grid=where, **self.asked(),
                    stop_after=self.stop_after, repeat=r, batch_size=batch, seq_len=seq))
        unused = [self.exclude[i] for i, n in enumerate(used) if n == 0]
        return Plan(points=kept, excluded=excluded, unused_rules=unused)


def _texts(value: Any) -> Any:
    """A rule's value(s) as argv text, so `--batch_size: 4` matches the argument "4"."""
    return [arg_text(x) for x in value] if isinstance(value, list) else arg_text(value)


class ScriptFailed(LmprofError):
    """The script's ``lmprof run`` ended without a run record; the message says how."""


def _last_line(log: Path, skip: int) -> str | None:
    """What the point's ``lmprof run`` said last in the log (after byte ``skip``): the exception line of
    the last traceback (``ValueError: boom``) when there is one, else its last non-empty line."""
    if not log.is_file():
        return None
    with log.open("rb") as fh:
        fh.seek(max(skip, log.stat().st_size - 64 * 1024))
        lines = [ln.rstrip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last):")]
    if starts:
        # A traceback's frames are indented; its first unindented line after them is the exception.
        raised = [ln for ln in lines[starts[-1] + 1:] if not ln[:1].isspace()]
        if raised:
            return raised[0][:300]
    return lines[-1].strip()[:300] if lines else None


def run_script_point(point: ScriptPoint, run_dir: Path) -> None:
    """Run the point's ``lmprof run`` (its output into this process's stdout/stderr: worker.log).

    Raises :class:`ScriptFailed` when it exits non-zero or writes no run record; a script killed by
    SIGKILL is reported as out of memory (the kernel's OOM killer), which the worker records as ``oom``.
    """
    log = run_dir / "worker.log"
    start = log.stat().st_size if log.is_file() else 0
    sys.stdout.flush()
    sys.stderr.flush()
    # The child stays in this worker's process group: a timeout kills the group, and an orphaned
    # worker kills it on its way out (worker._leave_if_orphaned).
    rc = subprocess.run(point.command(run_dir), stdin=subprocess.DEVNULL, env=dict(os.environ)).returncode
    last = _last_line(log, start)
    if rc < 0 and -rc == 9:
        raise ScriptFailed("the script was killed by signal 9 (SIGKILL): most likely out of memory "
                           "(the system's OOM killer)")
    if rc != 0:
        how = f"the script exited with code {rc}" if rc > 0 else f"the script died from signal {-rc}"
        raise ScriptFailed(how + (f": {last}" if last else ""))
    if not (run_dir / "run.json").is_file():
        raise ScriptFailed("lmprof run wrote no run record" + (f": {last}" if last else ""))
