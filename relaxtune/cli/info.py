"""Listing commands: ``methods``, ``tasks`` (and ``tasks validate``), ``ui``."""

from __future__ import annotations

import math
import os

import typer

from ..decoding.methods import ALL_METHODS, Needs
from .app import App, app, console
from .tables import JSON, Col, print_json, show

MLFLOW_UI_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false"  # MLflow 3 starts job consumers for its GenAI jobs


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    if value == math.log(2.0):
        return "ln 2"
    return f"{value:g}"


@app.command()
def methods(json_output: bool = JSON) -> None:
    """List the verification methods (the per-position rules, then the engines' round-level
    ones): their knobs (alpha first, under the method's name for it; the further knobs the
    search tries beside it under their engine names), strict point and the engine that ships them."""
    rows = []
    for spec in ALL_METHODS.values():
        close = ")" if spec.high_open or math.isinf(spec.high) else "]"
        rng = f"[{_fmt(spec.low)}, {_fmt(spec.high)}{close}" if spec.has_knob else "-"
        strict = ("< 0" if spec.strict_below_zero else _fmt(spec.strict_point)) if spec.has_knob else "-"
        if spec.has_knob and spec.strict_point is None:
            strict = "none"
        full = "no" if spec.pointwise else ("yes" if Needs.FULL_ROWS in spec.needs else "p only")
        rows.append(
            {
                "method": spec.id,
                "knob": spec.knob or "-",
                "further knobs": ", ".join(k.name for k in spec.further_knobs) or "-",
                "valid range": rng,
                "strict at": strict,
                "paper grid": ", ".join(_fmt(g) for g in spec.grid) or "-",
                "full rows": full,
                "rule": spec.description,
                "engine": spec.engine or "-",
            }
        )
    if json_output:
        print_json(rows)
        return
    cols = [
        Col("method"),
        Col("knob", 2),
        Col("further knobs", 7, wrap=True),
        Col("valid range", 3),
        Col("strict at", 5),
        Col("paper grid", 4),
        Col("full rows", 6),
        Col("rule", wrap=True),
        Col("engine", 8, wrap=True),
    ]
    show("relaxed speculative sampling methods", cols, [list(r.values()) for r in rows])


tasks_app = App(help="List task specs, or validate one.", invoke_without_command=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.callback()
def tasks(ctx: typer.Context, json_output: bool = JSON) -> None:
    """List the task specs on the search path, $RELAXTUNE_EVALS then the packaged ones (name, version, grader, data)."""
    if ctx.invoked_subcommand is not None:
        return
    from ..tasks.spec import evals_dirs, list_tasks, load_task

    rows = []
    for name in list_tasks():
        try:
            t = load_task(name)
        except ValueError as err:
            problem = str(err).splitlines()
            rows.append(
                {
                    "task": name,
                    "version": "-",
                    "grader": "invalid",
                    "repeats": "-",
                    "max tokens": "-",
                    "data": problem[1].strip() if len(problem) > 1 else problem[0],
                }
            )
            continue
        d = t.dataset
        source = d.package or (str(d.data_files) if d.data_files else f"{d.path}:{d.split}")
        rows.append(
            {
                "task": t.name,
                "version": str(t.version),
                "grader": t.grader.kind,
                "repeats": str(t.repeats),
                "max tokens": str(t.max_new_tokens),
                "data": source,
            }
        )
    if json_output:
        print_json(rows)
        return
    cols = [
        Col("task"),
        Col("version", 3, justify="right"),
        Col("grader"),
        Col("repeats", 2, justify="right"),
        Col("max tokens", 1, justify="right"),
        Col("data", wrap=True),
    ]
    where = os.pathsep.join(map(str, evals_dirs()))
    show(
        f"tasks in {where}", cols, [[("[red]invalid[/red]" if v == "invalid" else v) for v in r.values()] for r in rows]
    )


@tasks_app.command("validate")
def tasks_validate(
    file: str = typer.Argument(..., help="path to a task YAML"),
    load: bool = typer.Option(False, help="also load the data and format the first prompt"),
) -> None:
    """Check a task spec (and optionally its data): one line per invalid field."""
    from ..tasks.spec import load_problems, load_task

    try:
        spec = load_task(file)
        first = load_problems(spec, limit=1) if load else None
        if load and not first:
            raise ValueError("the dataset holds no problems")
        console.print(f"[green]valid[/green]: {spec.name} v{spec.version} ({spec.grader.kind} grader)")
        if spec.grader.kind == "code":  # what contains its solutions on this host
            from ..graders.sandbox import sandbox_info

            info = sandbox_info()
            colour = "green" if info.kind == "bubblewrap" and not info.note else "yellow"
            console.print(f"[{colour}]{info.describe()}[/{colour}]", soft_wrap=True, highlight=False)
        if first:
            console.print(f"first problem {first[0].id}:\n{first[0].prompt}", markup=False)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        head, *fields = message.splitlines()
        console.print(f"[red]invalid[/red]: {head}", soft_wrap=True)
        for line in fields:
            console.print(f"  {line.strip()}", soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(1) from None


@app.command()
def ui(
    mlflow_uri: str = typer.Option("sqlite:///mlflow.db", help="the tuning runs' MLflow tracking URI"),
    storage: str = typer.Option("sqlite:///relaxtune-runs/optuna.db", help="the Optuna storage of the studies"),
    port: int = typer.Option(5000, min=1, max=65535 - 80, help="the MLflow UI's port (optuna-dashboard: port + 80)"),
) -> None:
    """Print how to open the results: the MLflow UI (runs, decision, figures) and
    optuna-dashboard (the studies, which are ordinary Optuna RDB studies)."""
    local = not mlflow_uri.startswith(("http://", "https://"))
    base = f"http://127.0.0.1:{port}" if local else mlflow_uri.rstrip("/")
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    run = lambda command: console.print(f"  {command}", soft_wrap=True, markup=False, highlight=False)  # noqa: E731
    say("MLflow: each task run's page holds the decision (params, metrics, description); figures are under Artifacts.")
    if local:  # no job-execution (huey) consumers, one web worker: the UI answers in seconds
        run(f"{MLFLOW_UI_ENV} mlflow ui --backend-store-uri {mlflow_uri} --port {port} --workers 1")
    run(f"open {base}/#/experiments?workflowType=machine_learning")
    say(
        "The experiments are relaxtune-<task>; MLflow 3.17 remembers its GenAI / Model training switch per "
        "browser, and the workflowType above selects the model-training view (runs, not traces)."
    )
    say(
        "Optuna: the studies are ordinary Optuna RDB studies, one per task and method (<task>__<method>__<pair>); "
        "optuna-dashboard shows their trials, the Pareto front of modeled speed-up and accuracy and the history; "
        "each trial's metrics are its user attribute 'metrics', its constraint values (each <= 0 when feasible) "
        "'constraints'."
    )
    run("pip install optuna-dashboard")
    run(f"optuna-dashboard {storage} --port {port + 80}")
    run(f"open http://127.0.0.1:{port + 80}")
