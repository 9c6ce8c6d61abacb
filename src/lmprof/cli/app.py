"""The typer application every verb module registers on (``from lmprof.cli.app import app``)."""
from __future__ import annotations

import typer

app = typer.Typer(
    name="lmprof",
    help="Profile, explain and compare transformer language models in PyTorch.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
