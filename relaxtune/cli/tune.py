"""The main job: ``tune`` and ``export``, and the summary they print."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .app import app, console
from .options import settings_from, tune_options


def _summary(config, path) -> None:
    from ..job import cautions

    conf = config.confirmation
    table = Table(title=f"{config.task} v{config.task_version}: tuned under a drop of at most {config.epsilon:g} "
                        f"({config.confidence:.0%} one-sided), c_rel {config.c_rel:.3f}")
    for col in ("method", "confirmed", "knob", "N", "strict acc", "acc", "search UCB", "confirm UCB", "l_accept",
                "L ratio", "speed-up", "trials (pruned/failed)", "tokens"):
        table.add_column(col, justify="right")
    f = (lambda v, fmt=".3f": "-" if v is None else format(v, fmt))
    for r in config.methods.values():
        tried = len((r.confirmation or {}).get("attempts", []))
        if r.feasible:
            table.add_row(r.method, f"yes (try {tried})", "-" if r.knob is None else f"{r.knob_name}={r.knob:.3g}",
                          f(r.n_draft, "d"), f(r.strict_accuracy), f(r.accuracy), f(r.search_drop_upper_bound),
                          f(r.drop_upper_bound), f(r.l_accept, ".2f"), f(r.length_ratio, ".2f"),
                          f(r.modeled_speedup, ".2f"), f"{r.trials} ({r.pruned}/{r.failed})", str(r.tokens_spent))
            continue
        attempts = (r.confirmation or {}).get("attempts") or []
        c = attempts[-1] if attempts else r.closest or {}  # the last point that failed confirmation, or the closest
        knob = "-" if c.get("knob") is None else f"{r.knob_name}={c['knob']:.3g}"
        search = c["search_drop_upper_bound"] if attempts else c.get("drop_upper_bound")
        table.add_row(r.method, f"[red]no[/red], {tried} failed" if tried else "[red]no[/red]", knob,
                      f(c.get("n_draft"), "d"), f(c.get("strict_accuracy")), f(c.get("accuracy")), f(search),
                      f(c.get("drop_upper_bound") if attempts else None), f(c.get("l_accept"), ".2f"),
                      f(c.get("length_ratio"), ".2f"), f(c.get("modeled_speedup"), ".2f"),
                      f"{r.trials} ({r.pruned}/{r.failed})", str(r.tokens_spent))
    console.print(table)
    for r in config.methods.values():  # why a method exports no point (its row: the last failed or the closest)
        if r.note:
            console.print(f"{r.method}: {r.note}", soft_wrap=True)
    if conf["planned"]:
        where = "fresh seeds" if conf["samples"] == "seeds" else "the held-out problems"
        console.print(f"confirmation on {where} ({conf['problems']} problems): {conf['planned']} allowed, each at "
                      f"{conf['confidence_each']:.1%} one-sided (the {config.confidence:.0%} split evenly; confirm "
                      "UCB is the exported bound)")
    sample = config.sample  # what would decide, when nothing could be certified
    console.print(sample["line"] if not any(r.feasible for r in config.methods.values()) else
                  f"with {sample['problems']} problems x {sample['repeats']} the smallest certifiable drop is "
                  f"{sample['smallest_certifiable']:.3f}")
    rec = config.recommendation
    knob = "" if rec.knob is None else f" alpha={rec.knob:.3g}"
    console.print(f"[bold]recommendation[/bold]: {rec.method}{knob} N={rec.n_draft}, modeled {rec.modeled_speedup:.2f}x: {rec.reason}")
    for line in cautions(config):
        console.print(f"[bold yellow]warning[/bold yellow]: {escape(line)}", soft_wrap=True)
    console.print(f"tuned config: {path}", soft_wrap=True)
    if config.mlflow:
        console.print(f"MLflow: mlflow ui --backend-store-uri {config.mlflow['tracking_uri']}  "
                      f"(experiment {config.mlflow['experiment']})")


@app.command()
@tune_options
def tune(config: Optional[str] = None, **flags) -> None:
    """Tune alpha (and N) per method on a task under a capability-loss budget; log to MLflow; export a config."""
    _run_job(settings_from(config, flags), new_trials=True)


@app.command("export")
@tune_options
def export_(config: Optional[str] = None, **flags) -> None:
    """Re-export the tuned config from finished studies (no new trials). Starts
    from the settings of the task's last tuning run (<output-dir>/<task>.job.yaml);
    options override them, e.g. another --epsilon."""
    import yaml

    from ..job import job_file
    from ..tasks import load_task

    base = None
    from_file = {}
    if config:  # the job's YAML may name the task and the output folder
        try:
            from_file = yaml.safe_load(open(config)) or {}
        except (OSError, yaml.YAMLError) as err:
            raise typer.BadParameter(f"cannot read --config {config}: {err}") from None
        from_file = from_file if isinstance(from_file, dict) else {}
    task = flags["task"] or from_file.get("task")
    if task:
        try:
            folder = flags["output_dir"] or from_file.get("output_dir") or from_file.get("output-dir") or "relaxtune-runs"
            saved = job_file(folder, load_task(task).name)
        except (ValueError, FileNotFoundError, KeyError) as err:
            raise typer.BadParameter(str(err)) from None
        if saved.exists():
            base = yaml.safe_load(saved.read_text())
            console.print(f"starting from the tuning run's settings: {saved}", soft_wrap=True)
        else:
            console.print(f"[yellow]no {saved}: give the tuning run's --limit, --n-drafts and --methods[/yellow]")
    _run_job(settings_from(config, flags, base), new_trials=False)


def _run_job(settings, new_trials: bool) -> None:
    from ..job import JobError, prepare, run_tune_job

    try:
        with console.status(f"loading {settings.task} and {settings.drafter} -> {settings.verifier}"):
            spec, problems, backend = prepare(settings)
    except (ValueError, OSError, KeyError, RuntimeError) as err:  # SGLangError is a RuntimeError
        raise typer.BadParameter(str(err)) from None
    try:
        log = lambda message: console.print(message, soft_wrap=True)  # noqa: E731 - paths stay on one line
        config, path = run_tune_job(settings, backend, new_trials=new_trials, log=log)
    except JobError as err:
        raise typer.BadParameter(str(err)) from None
    finally:
        if hasattr(backend, "close"):  # SGLang: the HTTP client and its event loop
            backend.close()
    _summary(config, path)
