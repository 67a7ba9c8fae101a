"""Listing commands: ``methods``, ``tasks`` (and ``tasks validate``), ``ui``."""

from __future__ import annotations

import math

import typer
from rich.table import Table

from ..methods import METHODS
from .app import app, console


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    if value == math.log(2.0):
        return "ln 2"
    return f"{value:g}"


@app.command()
def methods() -> None:
    """List the relaxed verification methods, their knob (alpha) and strict point."""
    table = Table(title="relaxed speculative sampling methods")
    for col in ("method", "knob", "valid range", "strict at", "paper grid", "full rows"):
        table.add_column(col, no_wrap=True)
    table.add_column("rule")
    for spec in METHODS.values():
        close = ")" if spec.high_open or math.isinf(spec.high) else "]"
        rng = f"[{_fmt(spec.low)}, {_fmt(spec.high)}{close}" if spec.has_knob else "-"
        strict = ("< 0" if spec.strict_below_zero else _fmt(spec.strict_point)) if spec.has_knob else "-"
        table.add_row(
            spec.id, spec.knob or "-", rng, strict, ", ".join(_fmt(g) for g in spec.grid) or "-",
            "no" if spec.pointwise else "yes", spec.description,
        )
    console.print(table)


tasks_app = typer.Typer(help="List task specs, or validate one.", invoke_without_command=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.callback()
def tasks(ctx: typer.Context) -> None:
    """List the task specs of evals/ (name, version, grader, data source)."""
    if ctx.invoked_subcommand is not None:
        return
    from ..tasks import evals_dir, list_tasks, load_task

    table = Table(title=f"tasks in {evals_dir()}")
    for col in ("task", "version", "grader", "repeats", "max tokens", "data"):
        table.add_column(col)
    for name in list_tasks():
        try:
            t = load_task(name)
        except ValueError as err:
            table.add_row(name, "-", "[red]invalid[/red]", "-", "-", str(err).splitlines()[0])
            continue
        d = t.dataset
        source = d.package or (str(d.data_files) if d.data_files else f"{d.path}:{d.split}")
        table.add_row(t.name, str(t.version), t.grader.kind, str(t.repeats), str(t.max_new_tokens), source)
    console.print(table)


@tasks_app.command("validate")
def tasks_validate(
    file: str = typer.Argument(..., help="path to a task YAML"),
    load: bool = typer.Option(False, help="also load the data and format the first prompt"),
) -> None:
    """Check a task spec (and optionally its data)."""
    from ..tasks import load_problems, load_task

    try:
        spec = load_task(file)
        first = load_problems(spec, limit=1) if load else None
        if load and not first:
            raise ValueError("the dataset holds no problems")
        console.print(f"[green]valid[/green]: {spec.name} v{spec.version} ({spec.grader.kind} grader)")
        if first:
            console.print(f"first problem {first[0].id}:\n{first[0].prompt}")
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:
        console.print(f"[red]invalid[/red]: {err.args[0] if isinstance(err, KeyError) and err.args else err}")
        raise typer.Exit(1) from None


@app.command()
def ui(
    mlflow_uri: str = typer.Option("sqlite:///mlflow.db"),
    storage: str = typer.Option("sqlite:///relaxtune-runs/optuna.db"),
) -> None:
    """Print the commands that open the MLflow and Optuna dashboards."""
    console.print(f"MLflow (runs, Pareto figures, tuned configs):  mlflow ui --backend-store-uri {mlflow_uri}")
    console.print(f"Optuna (studies, trials):  pip install optuna-dashboard && optuna-dashboard {storage}")
