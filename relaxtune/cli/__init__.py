"""The ``relaxtune`` command line: ``tune``, ``export``, ``transfer``, ``plan``, ``eval``, ``generate``,
``methods``, ``tasks``, ``serve``, ``ui`` (one module per group of commands, all on one Typer ``app``).

May import: every wing and ``relaxtune.job``.
"""

from __future__ import annotations

from . import costs, deploy_check, info, plan, run, serve, transfer, tune  # noqa: F401 - each registers its commands on app
from .app import app, console, fit_pipes

__all__ = ["app", "console", "main"]


def main() -> None:
    """Entry point of the ``relaxtune`` command."""
    fit_pipes()
    app()
