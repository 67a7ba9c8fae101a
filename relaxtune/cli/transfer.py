"""``transfer``: does a relaxation tuned on one task hold on another (``relaxtune.transfer``)."""

from __future__ import annotations

import typer
from rich.table import Table

from .app import app, console, say
from .options import finite, setting_option
from .tables import JSON, print_json


def _cell(cell) -> str:
    """A cell for the terminal: mark, drop bound vs the target's epsilon, speed-up, n."""
    from ..transfer.figure import OVER, WITHIN

    if cell is None:
        return "[dim]no tuned point[/dim]"
    if cell.error:
        return f"[red]{OVER} failed[/red]"
    m = cell.metrics
    mark = f"[green]{WITHIN}" if cell.within else f"[red]{OVER}"
    return f"{mark} <= {m['drop_ucb']:.3f}[/] (eps {cell.epsilon:g})\n{m['speedup']:.2f}x, n={m['n']}"


def _summary(matrix, written, uri: str | None) -> None:
    from ..decoding.methods import get_method
    from ..report.tracking import DEFAULT_URI

    for method in matrix.methods:
        table = Table(title=f"{method}: tuned point of each source task (rows) judged on each target (columns)")
        table.add_column("source (point)")
        for target in matrix.tasks:
            table.add_column(target, justify="right")
        for source in matrix.tasks:
            row = [matrix.cell(method, source, t) for t in matrix.tasks]
            point = next((c for c in row if c is not None), None)
            knob = "" if point is None or point.knob is None else f"{get_method(method).knob}={point.knob:.3g} "
            table.add_row(source if point is None else f"{source} ({knob}N={point.n_draft})", *(_cell(c) for c in row))
        console.print(table)
    console.print(
        f"each cell judged at {matrix.confidence_each:.2%} one-sided: the {matrix.confidence:.0%} split "
        f"over {len(matrix.cells)} cells (Bonferroni), so every cell marked within epsilon holds at once; "
        "the diagonal is each task's own point on its confirmation samples, the other cells use the "
        "target's search samples",
        soft_wrap=True,
    )
    for path in written:
        console.print(f"transfer section written to {path}", soft_wrap=True)
    console.print(
        f"MLflow: MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri "
        f"{uri or DEFAULT_URI} --workers 1  (experiment relaxtune-transfer, and "
        "a transfer run in each task's)",
        soft_wrap=True,
    )


@app.command("transfer")
def transfer_(
    tasks: str = typer.Option(..., help="comma-separated tasks (names or YAML paths), each tuned in --output-dir"),
    methods: str | None = typer.Option(
        None, help="comma-separated methods \\[default: every method some task's config confirmed a point for]"
    ),
    confidence: float | None = typer.Option(
        None,
        callback=finite,
        help="one-sided confidence that every cell marked within "
        "epsilon holds at once (split over the cells) \\[default: the highest "
        "of the tuned configs']",
    ),
    output_dir: str = setting_option("output_dir"),
    mlflow_uri: str | None = setting_option("mlflow_uri"),
    json_output: bool = JSON,
) -> None:
    """Judge each task's tuned point on every other task (rows: where it was tuned, columns: where it is
    judged), against that task's strict and epsilon; log the matrix to MLflow and add a transfer section to
    every tuned config."""
    from ..transfer.run import run_transfer

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    chosen = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    log = say(json_output)  # paths stay on one line; with --json, on stderr
    try:
        matrix, written = run_transfer(names, chosen, confidence, output_dir=output_dir, mlflow_uri=mlflow_uri, log=log)
    except (ValueError, OSError, KeyError, RuntimeError) as err:  # TransferError is a ValueError
        raise typer.BadParameter(str(err)) from None
    if json_output:
        print_json(
            {
                "tasks": matrix.tasks,
                "methods": matrix.methods,
                "confidence": matrix.confidence,
                "confidence_each": matrix.confidence_each,
                "cells": matrix.rows(),
                "written": [str(p) for p in written],
            }
        )
    else:
        _summary(matrix, written, mlflow_uri)
