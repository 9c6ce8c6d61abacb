"""The fast path of ``lmprof analyze PATH --json``: parsed here, run without importing typer.

Why: importing typer (with the pydantic and rich it pulls in) and every verb module costs about
0.15 s, as much as analysing a mid-sized trace. A script that runs ``lmprof analyze`` on many traces
pays it each time.

Only a command line whose meaning is certain takes this path: ``analyze``, one PATH, ``--json``,
and optionally ``--top N`` (N plain digits, at least 1), ``--include-last-step`` and ``--device
NAME``. Anything else (``--help``, another option, ``--top=5``, a value that looks like an option,
a second PATH, an unreadable PATH, shell completion, an odd stdout) returns None and typer parses it
as always, so help, usage errors and their messages are typer's own. On this path the command does
what the typer command does with the same values (both call
:func:`lmprof.cli._analyze_run.run_analyze`), and typer's handling around it is reproduced:
Ctrl-C exits 130 silently, an end of input prints an empty line and exits like an abort, a closed
pipe exits 1 quietly.
"""
from __future__ import annotations

import codecs
import errno
import os
import sys
from pathlib import Path
from typing import Any, Callable

_COMPLETE_VAR = "_LMPROF_COMPLETE"  # what typer (click) reads for shell completion, from prog_name "lmprof"
_FLAGS = {"--json": "json_out", "--include-last-step": "include_last_step"}
_VALUED = {"--top", "--device"}


def fast_analyze_args(args: list[str]) -> dict[str, Any] | None:
    """The keyword arguments of :func:`run_analyze` for a plain ``analyze ... --json`` command
    line, or None when typer must parse it (see the module docstring)."""
    if len(args) < 3 or args[0] != "analyze" or _COMPLETE_VAR in os.environ or not _plain_stdout():
        return None
    out: dict[str, Any] = {}
    path = None
    i = 1
    while i < len(args):
        a = args[i]
        if a in _FLAGS:
            out[_FLAGS[a]] = True
        elif a in _VALUED:
            if i + 1 == len(args):
                return None
            v = args[i + 1]
            if not v or v.startswith("-"):
                return None
            if a == "--top":
                if not (v.isascii() and v.isdigit()) or int(v) < 1:
                    return None
                out["top"] = int(v)
            else:
                out["device"] = v
            i += 1
        elif a and not a.startswith("-") and path is None:
            path = a
        else:
            return None
        i += 1
    if path is None or not out.get("json_out") or not _readable_or_absent(path):
        return None
    out["path"] = Path(path)
    return out


def _readable_or_absent(path: str) -> bool:
    """What typer's Path parameter accepts without a message: a missing path, or a readable one."""
    try:
        os.stat(path)
    except ValueError:  # a NUL in the path: typer's own handling, whatever it is
        return False
    except OSError:
        return True
    return os.access(path, os.R_OK)


def _plain_stdout() -> bool:
    """stdout is a text stream typer's echo would write to as it is (not wrapped, not re-encoded)."""
    out = sys.stdout
    if out is None or os.name == "nt":
        return False
    enc, errs = getattr(out, "encoding", None), getattr(out, "errors", None)
    if not isinstance(enc, str) or errs is None:
        return False
    try:
        return codecs.lookup(enc).name != "ascii"
    except LookupError:
        return False


def echo(message: str) -> None:
    """One line on stdout, flushed (as typer's echo writes text to a stream that is not a terminal,
    JSON holding no escape sequence to strip)."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


class Aborted(Exception):
    """Where typer raises ``typer.Abort`` (an end of input): the caller reports an interruption."""


def run_fast(kwargs: dict[str, Any], run: Callable[..., None]) -> int:
    """Run the command as typer's runner would; returns the exit code, or raises what typer would
    let through (the caller turns lmprof's errors and a Ctrl-C into one line)."""
    try:
        run(**kwargs, echo=echo)
    except EOFError:
        print(file=sys.stderr)
        raise Aborted from None
    except OSError as exc:
        if exc.errno == errno.EPIPE:  # `lmprof analyze ... | head`: nothing more to say
            sys.stdout = _QuietFlush(sys.stdout)
            sys.stderr = _QuietFlush(sys.stderr)
            sys.exit(1)
        raise
    return 0


class _QuietFlush:
    """A stream whose flush ignores a closed pipe, so the interpreter's final flush stays quiet."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)
