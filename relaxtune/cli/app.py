"""The ``relaxtune`` Typer application and its console (every command module registers on ``app``)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Tune relaxed speculative decoding per task.")
console = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get full-width tables
