"""The typer application every verb module registers on (``from lmprof.cli.app import app``).

Shell completion is typer's: ``lmprof --install-completion`` (bash, zsh, fish, PowerShell) or
``lmprof --show-completion`` to see the script.
"""
from __future__ import annotations

import typer

app = typer.Typer(
    name="lmprof",
    help="Profile, explain and compare transformer language models in PyTorch.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
