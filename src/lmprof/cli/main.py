"""Entry point of the ``lmprof`` command.

Verb modules are discovered in this package (every module but app/main/common), so adding a verb is
adding one file. User errors become one line on stderr and exit code 2; bugs keep their traceback.

A plain ``lmprof analyze PATH --json`` skips typer (:mod:`lmprof.cli._fast`): typer and the verb
modules are imported only when typer parses the command line.
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import os
import pkgutil
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from lmprof import gc_hold
from lmprof.errors import LmprofError

_NOT_VERBS = {"app", "main", "common"}
# Verbs that import torch (and dynamo) inside their command: the collector stays held through those
# imports and is released where measuring begins (lmprof/gc_hold.py). Every other verb gets it back
# before its command runs: plotting makes reference cycles (a figure and its canvas) that only the
# collector frees.
_HELD_INTO_THE_COMMAND = {"train", "infer", "run", "calibrate", "sweep"}


def _register_verbs() -> None:
    import lmprof.cli as cli_pkg
    from lmprof.cli.app import app

    if not app.registered_callback:
        import typer

        def _version(value: bool) -> None:
            if value:
                from lmprof.version import __version__

                typer.echo(f"lmprof {__version__}")
                raise typer.Exit(0)

        @app.callback()
        def _root(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                               help="Print lmprof's version and exit")) -> None:
            """Profile, explain and compare transformer language models in PyTorch."""

    for mod in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if mod.name not in _NOT_VERBS and not mod.name.startswith("_"):
            importlib.import_module(f"lmprof.cli.{mod.name}")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and on the console script, exits with) the process exit code."""
    from lmprof.cli._fast import fast_analyze_args

    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None:  # the console command, a process of lmprof's own (never a caller's, never a test's)
        gc_hold.hold()
        if next((a for a in args if not a.startswith("-")), None) != "run":  # a user's script keeps Python's own
            from lmprof.cli import _streams

            _streams.install()  # any encoding, a reader that stops early: the exit code keeps its meaning
    if args[:1] == ["analyze"]:
        # numpy's OpenBLAS starts a worker thread per extra core when numpy is imported, and an idle
        # worker spins about 0.1 s of CPU before it sleeps; analyze never calls BLAS, and on two
        # cores that spin is taken from the trace reader. A user's own setting is kept.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        if argv is None:
            from lmprof.trace.kineto.heap import tune_for_analyze

            tune_for_analyze()
    fast = fast_analyze_args(args)
    try:
        if fast is not None:
            return _run_fast(fast, argv)
        return _run_typer(argv, args)
    except OSError as exc:
        if exc.errno not in _NO_ROOM:
            raise
        where = f"cannot write {exc.filename}" if exc.filename else "cannot write to standard output"
        print(f"lmprof: error: {where}: {exc.strerror}", file=sys.stderr)
        if argv is None:
            # what could not be written is still buffered: the interpreter's final flush would fail
            # again and print a traceback-like report, so leave without it
            try:
                sys.stderr.flush()
            finally:
                os._exit(2)
        return 2


# A full disk (or quota, or file size limit) under a file lmprof writes without its own message
# (standard output redirected to a file, the terminal's report): one line, not a traceback.
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _run_fast(kwargs: dict[str, object], argv: list[str] | None) -> int:
    """``lmprof analyze PATH --json`` without typer, its errors reported as :func:`_run_typer` does."""
    from lmprof.cli._analyze_run import run_analyze
    from lmprof.cli._fast import Aborted, run_fast

    try:
        code = run_fast(kwargs, run_analyze)
    except LmprofError as exc:
        print(f"lmprof: error: {exc}", file=sys.stderr)
        return _exit(2, argv)
    except Aborted:
        print("lmprof: interrupted", file=sys.stderr)
        return _exit(130, argv)
    except KeyboardInterrupt:
        print("lmprof: interrupted", file=sys.stderr)
        return _exit(130, argv)
    except MemoryError:
        print("lmprof: error: out of memory (Python could not allocate more): try smaller sizes", file=sys.stderr)
        return _exit(2, argv)
    if argv is None and code == 0:
        _leave_now()
    return _exit(code, argv)


def _leave_now() -> None:
    """End a finished console-script ``analyze --json`` at once: its report is written and flushed,
    and tearing the interpreter down (freeing every module, array and cached table) took 20 ms, a
    fortieth of analysing a 270 MB trace. A stream that cannot be flushed returns instead, so the
    interpreter's own exit reports it as always."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(0)


_COMPLETION_FLAGS = frozenset({"--show-completion", "--install-completion"})
_COMPLETION_SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")  # the scripts typer has


def _check_completion_shell(args: list[str]) -> None:
    """Shell completion is for the shell lmprof runs under, found from the process tree (typer's way): in
    one typer has no script for (sh, dash, tcsh), typer prints 'Shell sh not supported.' and exits 1,
    the code lmprof keeps for a failed run or gate. One line and exit 2 instead, saying which shells."""
    if not _COMPLETION_FLAGS.intersection(args):
        return
    try:
        import shellingham  # typer's own dependency, what it detects the shell with

        name = str(shellingham.detect_shell()[0]).lower()
    except Exception:  # noqa: BLE001 - no shell found (a service, a container's init): said below
        name = ""
    if name not in _COMPLETION_SHELLS:
        found = f"this one is {name}" if name else "no shell was found above this process"
        raise LmprofError(f"shell completion is for bash, zsh, fish and PowerShell; {found}: run "
                          "lmprof --install-completion (or --show-completion) from one of those")


def _run_typer(argv: list[str] | None, args: list[str]) -> int:
    import typer

    from lmprof.cli.app import app
    from lmprof.cli.common import Interrupted

    _register_verbs()
    verb = next((a for a in args if not a.startswith("-")), None)
    if verb not in _HELD_INTO_THE_COMMAND:
        gc_hold.release()
    ctrl_c: list[int] = []
    try:
        _check_completion_shell(args)
        with _ctrl_c_seen(ctrl_c, verb != "run"):  # the user's script keeps its own Ctrl-C (docs/reliability.md)
            result = app(args=argv, standalone_mode=False, prog_name="lmprof")
    except LmprofError as exc:
        print(f"lmprof: error: {exc}", file=sys.stderr)
        return _exit(2, argv)
    except Interrupted as exc:
        print(f"lmprof: {exc}", file=sys.stderr)
        return _exit(exc.code, argv)
    except (KeyboardInterrupt, typer.Abort):
        print("lmprof: interrupted", file=sys.stderr)
        return _exit(130, argv)
    except typer.Exit as exc:
        code = int(getattr(exc, "exit_code", 0) or 0)
        if code == 130 and isinstance(exc.__cause__, KeyboardInterrupt):  # typer's own Ctrl-C conversion
            print("lmprof: interrupted", file=sys.stderr)
        return _exit(code, argv)
    except MemoryError:
        print("lmprof: error: out of memory (Python could not allocate more): try smaller sizes", file=sys.stderr)
        return _exit(2, argv)
    except SystemExit as exc:  # typer's --show/--install-completion leave with sys.exit
        return _exit(exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1, argv)
    except Exception as exc:
        # typer vendors click in recent versions: recognise its usage errors by shape, not by class.
        if type(exc).__name__ == "NoArgsIsHelpError":
            ctx = getattr(exc, "ctx", None)
            print(ctx.get_help() if ctx else "see lmprof --help")
            return _exit(0, argv)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            msg = " ".join(exc.format_message().split())
            print(f"lmprof: error: {msg} (see --help)", file=sys.stderr)
            return _exit(2, argv)
        raise
    code = result if isinstance(result, int) else 0
    if code == 130 and ctrl_c:  # typer, out of standalone mode, turns a Ctrl-C into this code and says nothing
        print("lmprof: interrupted", file=sys.stderr)
    return _exit(code, argv)


@contextlib.contextmanager
def _ctrl_c_seen(seen: list[int], watch: bool) -> Iterator[None]:
    """Note a SIGINT in ``seen`` (it still raises KeyboardInterrupt, as Python's own handler does), where
    ``watch`` and Python's own handler is the one installed in the main thread."""
    if not watch or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def on_int(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_int)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _exit(code: int, argv: list[str] | None) -> int:
    if argv is None:  # console script: really exit
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
