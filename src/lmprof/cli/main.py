"""Entry point of the ``lmprof`` command.

Verb modules are discovered in this package (every module but app/main/common), so adding a verb is
adding one file. User errors become one line on stderr and exit code 2; bugs keep their traceback.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

import lmprof.cli as cli_pkg
from lmprof.cli.app import app
from lmprof.cli.common import Interrupted
from lmprof.errors import LmprofError

_NOT_VERBS = {"app", "main", "common"}


@app.callback()
def _root() -> None:
    """Profile, explain and compare transformer language models in PyTorch."""


def _register_verbs() -> None:
    for mod in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if mod.name not in _NOT_VERBS and not mod.name.startswith("_"):
            importlib.import_module(f"lmprof.cli.{mod.name}")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and on the console script, exits with) the process exit code."""
    _register_verbs()
    try:
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
    return _exit(code, argv)


def _exit(code: int, argv: list[str] | None) -> int:
    if argv is None:  # console script: really exit
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
