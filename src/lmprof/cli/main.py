"""Entry point of the ``lmprof`` command.

Verb modules are discovered in this package (every module but app/main/common), so adding a verb is
adding one file. User errors become one line on stderr and exit code 2; bugs keep their traceback.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys

import click

import lmprof.cli as cli_pkg
from lmprof.cli.app import app
from lmprof.errors import LmprofError

_NOT_VERBS = {"app", "main", "common"}


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
        click.echo(f"lmprof: error: {exc}", err=True)
        return _exit(2, argv)
    except click.exceptions.Abort:
        click.echo("lmprof: aborted", err=True)
        return _exit(130, argv)
    except click.ClickException as exc:
        msg = exc.format_message().replace("\n", " ")
        click.echo(f"lmprof: error: {msg} (see lmprof --help)", err=True)
        return _exit(2, argv)
    except click.exceptions.Exit as exc:
        return _exit(exc.exit_code, argv)
    code = result if isinstance(result, int) else 0
    return _exit(code, argv)


def _exit(code: int, argv: list[str] | None) -> int:
    if argv is None:  # console script: really exit
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
