"""The ``relaxtune`` Typer application and its console (every command module registers on ``app``).

Commands' help comes from their docstrings, re-flowed (``App``): Typer's rich help
keeps the source's line breaks, which land mid-sentence at any other width.
Output that is not a terminal (a pipe, a log file) gets plain lines instead of
spinners (``status``) and tables no wider than ``PIPE_WIDTH`` (``$COLUMNS`` when set).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Callable
from contextlib import contextmanager

import typer
from rich.console import Console

__all__ = ["App", "app", "console", "status", "say", "reflow", "PIPE_WIDTH"]

PIPE_WIDTH = 100


def reflow(doc: str | None) -> str | None:
    """A docstring as help text: each paragraph on one line (blank lines separate them)."""
    if doc is None:
        return None
    text = inspect.cleandoc(doc).replace("``", "`")  # reST literals read as Markdown-style ones
    return "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip())


class App(typer.Typer):
    """A ``typer.Typer`` whose commands and callbacks take their help from their
    docstrings, re-flowed (``reflow``)."""

    def command(self, *args, **kwargs):
        def register(fn):
            return super(App, self).command(*args, **({"help": reflow(fn.__doc__)} | kwargs))(fn)

        return register

    def callback(self, *args, **kwargs):
        def register(fn):
            return super(App, self).callback(*args, **({"help": reflow(fn.__doc__)} | kwargs))(fn)

        return register


app = App(add_completion=False, no_args_is_help=True, help="Tune relaxed speculative decoding per task.")
console = Console()


def _version(value: bool) -> None:
    if value:
        from importlib import metadata

        print(f"relaxtune {metadata.version('relaxtune')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print relaxtune's version and exit"
    ),
) -> None:
    """Tune relaxed speculative decoding per task."""


def fit_pipes() -> None:
    """Tables no wider than ``PIPE_WIDTH`` when the output is not a terminal and
    ``$COLUMNS`` is unset (rich would assume 80)."""
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH


def say(json_output: bool = False) -> Callable[[str], None]:
    """How one-line messages go out: plain lines on stdout, or on stderr when stdout
    carries ``--json`` output."""
    if json_output:
        return lambda message: print(message, file=sys.stderr, flush=True)
    return lambda message: console.print(message, soft_wrap=True, markup=False, highlight=False)


@contextmanager
def status(message: str, json_output: bool = False):
    """A spinner with ``message`` on a terminal; elsewhere (or with ``--json``, on
    stderr) the message as a plain line, so a piped job says what it is doing."""
    if console.is_terminal and not json_output:
        with console.status(message):
            yield
    else:
        say(json_output)(f"{message} ...")
        yield
