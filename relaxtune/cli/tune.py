"""The main job: ``tune`` and ``export``, and the summary they print."""

from __future__ import annotations

import typer
from rich.markup import escape

from .app import app, console, say, status
from .options import settings_from, tune_options
from .tables import Col, print_json, show


def _summary(config, path) -> None:
    """The config as a table fitted to the console (a method without a confirmed
    point shows the last point that failed confirmation, or the closest), why a
    method exports no point, what the sample can certify, the recommendation (plain
    decoding: with the fastest speculative point beside it), what a reader must not miss
    (``relaxtune.report.export.cautions``) and where to read more."""
    from ..report.export import cautions
    from ..report.tracking import run_url
    from ..tune.pareto import knob_text, point_label
    from ..tune.recommend import PLAIN

    conf = config.confirmation

    def f(v, fmt=".3f"):
        return "-" if v is None else format(v, fmt)

    rows = []
    for r in config.methods.values():
        tried = len((r.confirmation or {}).get("attempts", []))
        if r.feasible:
            rows.append(
                [
                    r.method,
                    f"yes (try {tried})",
                    knob_text(r.method, r.knob_name, r.knob, r.n_draft, r.knobs or {}, compact=True) or "-",
                    f(r.n_draft, "d"),
                    f(r.modeled_speedup, ".2f"),
                    f(r.search_drop_upper_bound),
                    f(r.drop_upper_bound),
                    f(r.accuracy),
                    f(r.strict_accuracy),
                    f"{r.trials} ({r.pruned}/{r.failed})",
                    f(r.l_accept, ".2f"),
                    f(r.length_ratio, ".2f"),
                    str(r.tokens_spent),
                ]
            )
            continue
        attempts = (r.confirmation or {}).get("attempts") or []
        c = attempts[-1] if attempts else r.closest or {}  # the last point that failed confirmation, or the closest
        extra = c.get("extra_knobs") or {}
        knob = knob_text(r.method, r.knob_name, c.get("knob"), c.get("n_draft"), extra, compact=True) or "-"
        search = c["search_drop_upper_bound"] if attempts else c.get("drop_upper_bound")
        rows.append(
            [
                r.method,
                f"[red]no[/red], {tried} failed" if tried else "[red]no[/red]",
                knob,
                f(c.get("n_draft"), "d"),
                f(c.get("modeled_speedup"), ".2f"),
                f(search),
                f(c.get("drop_upper_bound") if attempts else None),
                f(c.get("accuracy")),
                f(c.get("strict_accuracy")),
                f"{r.trials} ({r.pruned}/{r.failed})",
                f(c.get("l_accept"), ".2f"),
                f(c.get("length_ratio"), ".2f"),
                str(r.tokens_spent),
            ]
        )
    cols = [
        Col("method"),
        Col("confirmed"),
        Col("knob"),  # compact: a rule's knobs less the words all share (acc=0.5, single=0.275)
        Col("N", justify="right"),
        Col("speed-up", justify="right"),
        Col("search UCB", justify="right"),
        Col("confirm UCB", justify="right"),
        Col("acc", 1, justify="right"),
        Col("strict acc", 2, justify="right"),
        Col("trials", 3, justify="right"),
        Col("l_accept", 4, justify="right"),
        Col("L ratio", 5, justify="right"),
        Col("tokens", 6, justify="right"),
    ]
    show(
        f"{config.task} v{config.task_version}: tuned under a drop of at most {config.epsilon:g} "
        f"({config.confidence:.0%} one-sided), c_rel {config.c_rel:.3f}",
        cols,
        rows,
        caption="UCB: upper bound of the accuracy drop vs strict (confirm: the exported one); trials: done "
        "(pruned/failed)",
    )
    for r in config.methods.values():  # why a method exports no point (its row: the last failed or the closest)
        if r.note:
            console.print(f"{r.method}: {r.note}", soft_wrap=True)
    if conf["planned"]:
        where = "fresh seeds" if conf["samples"] == "seeds" else "the held-out problems"
        console.print(
            f"confirmation on {where} ({conf['problems']} problems): {conf['planned']} allowed, each at "
            f"{conf['confidence_each']:.1%} one-sided (the {config.confidence:.0%} split evenly; confirm "
            "UCB is the exported bound)"
        )
    if conf.get("promise") and any(r.feasible for r in config.methods.values()):  # a bound of an exported point
        console.print(f"promise: {conf['promise']}", soft_wrap=True)
    sample = config.sample  # what would decide, when nothing could be certified
    console.print(
        sample["line"]
        if not any(r.feasible for r in config.methods.values())
        else f"with {sample['problems']} problems x {sample['repeats']} the smallest certifiable drop is "
        f"{sample['smallest_certifiable']:.3f}"
    )
    _by_batch(config)
    rec = config.recommendation
    plain = rec.method == PLAIN  # the reason says "serve the verifier alone"
    knob_name = config.methods[rec.method].knob_name if rec.method in config.methods else None
    point = point_label(rec.method, knob_name, rec.knob, rec.n_draft, rec.knobs, rec.scope)
    head = "" if plain else f"{point}, modeled {rec.modeled_speedup:.2f}x: "
    console.print(f"[bold]recommendation[/bold]: {head}{escape(rec.reason)}")
    if plain and (fast := rec.fastest_speculative) is not None:
        name = config.methods[fast.method].knob_name if fast.method in config.methods else None
        point = point_label(fast.method, name, fast.knob, fast.n_draft, fast.knobs, fast.scope)
        console.print(
            f"fastest speculative point (for information): {point}, modeled "
            f"{fast.modeled_speedup:.2f}x: {escape(fast.reason)}"
        )
    for line in cautions(config):
        console.print(f"[bold yellow]warning[/bold yellow]: {escape(line)}", soft_wrap=True)
    console.print(f"tuned config: {path}", soft_wrap=True, markup=False)
    m = config.mlflow
    if m:
        console.print(
            f"MLflow: MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow ui --backend-store-uri "
            f"{m['tracking_uri']} --workers 1  (experiment {m['experiment']})",
            soft_wrap=True,
            markup=False,
        )
        if m.get("experiment_id"):
            console.print(
                f"  this run: {run_url(m['tracking_uri'], m['experiment_id'], m['run_id'])}",
                soft_wrap=True,
                markup=False,
            )


def _by_batch(config) -> None:
    """The best confirmed point per serving batch size and where speculation stops paying
    (``by_batch_size``), when more than one batch size was priced."""
    from ..tune.pareto import point_label

    batches = config.by_batch_size
    if batches is None or len(batches.best) < 2:
        return
    declared = config.recommendation.batch_size
    weights = {int(b): w for b, w in ((config.cost_profile or {}).get("weights") or {}).items()}

    def label(b: int) -> str:  # what the recommendation was chosen for: one declared size, or a weighting
        if len(weights) > 1:
            return f"{b} (weight {weights[b]:g})" if b in weights else str(b)
        return f"{b} (declared)" if b == declared else str(b)

    rows = []
    for b, best in sorted(batches.best.items()):
        plain = best.decoding == "plain"
        rows.append(
            [
                label(b),
                point_label(best.method, None, best.knob, best.n_draft, best.knobs),
                f"{best.modeled_speedup:.2f}",
                "[yellow]plain[/yellow] (verifier alone)" if plain else "speculative",
            ]
        )
    show(
        "best confirmed point by serving batch size (modeled speed-up over batched AR at the same size)",
        [Col("batch size", justify="right"), Col("best point"), Col("speed-up", justify="right"), Col("decoding", 1)],
        rows,
    )
    console.print(batches.line, soft_wrap=True, markup=False)


def _json_option(fn):
    """Add ``--json`` to a ``tune_options`` command's signature."""
    import inspect

    option = typer.Option(False, "--json", help="print the tuned config as JSON on stdout (progress goes to stderr)")
    param = inspect.Parameter("json_output", inspect.Parameter.KEYWORD_ONLY, default=option, annotation=bool)
    fn.__signature__ = fn.__signature__.replace(parameters=[*fn.__signature__.parameters.values(), param])
    return fn


def _cost_profile_option(fn):
    """Add ``--cost-profile`` to ``export``'s signature."""
    import inspect

    option = typer.Option(
        None,
        "--cost-profile",
        help="re-price the finished job with this cost table (JSON, measured on the serving host by "
        "`relaxtune costs`; a job's cost_profile.json reads as batch size 1): strict's and every confirmed "
        "point's speed-ups, the recommendation and the best point per batch size, without running any trial",
        show_default=False,
    )
    param = inspect.Parameter("cost_profile", inspect.Parameter.KEYWORD_ONLY, default=option, annotation=str | None)
    fn.__signature__ = fn.__signature__.replace(parameters=[*fn.__signature__.parameters.values(), param])
    return fn


@app.command()
@_json_option
@tune_options
def tune(config: str | None = None, json_output: bool = False, **flags) -> None:
    """Tune alpha (and N) per method on a task under a capability-loss budget; log to MLflow; export a config."""
    _run_job(settings_from(config, flags), new_trials=True, json_output=json_output)


@app.command("export")
@_cost_profile_option
@_json_option
@tune_options
def export_(config: str | None = None, json_output: bool = False, cost_profile: str | None = None, **flags) -> None:
    """Re-export the tuned config from finished studies with another budget (no new trials).

    Starts from the settings of the task's last tuning run (<output-dir>/<task>.job.yaml); options override them,
    e.g. another --epsilon. Writes its own file (<output-dir>/<task>.tuned.eps<epsilon>.yaml, or --export) and its
    own MLflow run, linked to the tuning run it read, which it never modifies. Refuses, before loading any model,
    when there is nothing to export. With --cost-profile, re-prices the confirmed points with the serving host's
    costs and chooses the recommendation again."""
    import yaml

    from ..report.reexport import JobError, check_cost_profile, job_file, read_cost_profile
    from ..tasks.spec import load_task

    costs = None
    if cost_profile is not None:  # a bad file is refused before anything is read or loaded
        try:
            costs = read_cost_profile(cost_profile)
        except JobError as err:
            raise typer.BadParameter(str(err)) from None
    tell = say(json_output)
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
            folder = (
                flags["output_dir"] or from_file.get("output_dir") or from_file.get("output-dir") or "relaxtune-runs"
            )
            saved = job_file(folder, load_task(task).name)
        except (ValueError, FileNotFoundError, KeyError) as err:
            raise typer.BadParameter(str(err)) from None
        if saved.exists():
            base = yaml.safe_load(saved.read_text())
            base.pop("export", None)  # the tuning run's config path: an export writes its own file
            tell(f"starting from the tuning run's settings: {saved}")
        else:
            tell(f"no {saved}: give the tuning run's --limit, --n-drafts and --methods")
    settings = settings_from(config, flags, base)
    if costs is not None:  # the job's draft lengths and batch sizes priced by the file, before anything loads
        try:
            check_cost_profile(costs, settings.n_drafts, settings.stats.serving_weights, cost_profile)
        except JobError as err:
            raise typer.BadParameter(str(err)) from None
    _run_job(settings, new_trials=False, json_output=json_output, cost_profile=cost_profile)


def _run_job(settings, new_trials: bool, json_output: bool = False, cost_profile: str | None = None) -> None:
    from ..tune.phases import activate, process_age

    with activate() as timer:
        if (age := process_age()) is not None:
            timer.add("imports", *age)  # the command's start: Python, relaxtune and what it imports
        _run_job_timed(settings, new_trials, json_output, cost_profile)


def _run_job_timed(settings, new_trials: bool, json_output: bool = False, cost_profile: str | None = None) -> None:
    import shlex
    import sys

    from ..backends.load import lazy_backend
    from ..job.run import run_tune_job
    from ..job.steps import check_request, deployable, guarded_job, prepare
    from ..report.reexport import JobError
    from ..tune.checks import ConfirmationError
    from ..tune.phases import phase
    from ..tune.settings import start
    from .checks import check_job

    runtime = check_job(settings.pair, settings.stores, export=not new_trials)  # before anything loads or is written
    if new_trials and runtime == "llamacpp":  # the sizes llama.cpp's contexts can hold, before they are made
        from ..tune.serving_sizes import check_slots

        try:
            check_slots(settings.pair, settings.stats.serving_batch_sizes, list(settings.stats.serving_weights))
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
    if settings.relaxation_scope != "all":  # a thinking scope on a task that does not think, refused by name
        from ..decoding.scope import check_scope
        from ..tasks.spec import load_task

        try:
            task = load_task(settings.task)
        except Exception:  # a task that does not load is the start's to report, as without a scope
            task = None
        try:
            if task is not None:
                check_scope(settings.relaxation_scope, task.name, task.thinks)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
    log = say(json_output)
    if new_trials and settings.deployable_on:  # the methods the named engines run, the rest refused by name
        try:
            settings = deployable(settings, log)
        except JobError as err:
            raise typer.BadParameter(str(err)) from None
    loading = f"loading {settings.task} and {settings.drafter} -> {settings.verifier}"
    try:
        check_request(settings, new_trials)  # refused before the loading line: nothing loads for it
        with status(loading, json_output):
            # an export only reads records: the pair loads if something needs it, which nothing should
            lazy = None if new_trials else lazy_backend(**settings.backend)
            with phase("start"):
                spec, problems, backend = prepare(
                    settings, lazy, new_trials=new_trials, log=lambda m: None
                )  # the job warns
        settings = start(settings)  # the output folder made, the auto runtime resolved (and recorded by the job)
    except ConfirmationError as err:  # too few problems for epsilon: the flags that decide it, named
        raise typer.BadParameter(
            f"--limit {settings.limit}, --epsilon {settings.epsilon:g}, --confidence {settings.confidence:g}: {err}"
        ) from None
    except (ValueError, OSError, KeyError, RuntimeError) as err:  # SGLangError is a RuntimeError; JobError a ValueError
        raise typer.BadParameter(str(err)) from None
    resume = "relaxtune " + shlex.join(sys.argv[1:])  # a stop or a failure: the same command resumes
    try:
        with guarded_job(
            settings, spec, getattr(backend, "name", "backend"), resume, log, passthrough=(JobError,), exit_now=True
        ):
            extra = {} if cost_profile is None else {"cost_profile": cost_profile}  # export only
            config, path = run_tune_job(settings, backend, new_trials=new_trials, log=log, **extra)
    except JobError as err:
        raise typer.BadParameter(str(err)) from None
    finally:
        if hasattr(backend, "close"):  # SGLang: the HTTP client and its event loop
            backend.close()
    if json_output:
        print_json(config.model_dump(mode="json") | {"path": str(path)})
    else:
        _summary(config, path)
