"""The ``relaxtune`` command line."""

from __future__ import annotations

import inspect
import math
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from .methods import METHODS

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Tune relaxed speculative decoding per task.")
console = Console(width=None if sys.stdout.isatty() else 160)  # logs and pipes get full-width tables

_TUNE_FLAGS = dict(
    task=typer.Option(None, help="task name (see `relaxtune tasks`) or YAML path"),
    methods=typer.Option(None, help="comma-separated method ids \\[default: cactus,mentored]"),
    drafter=typer.Option(None, help="drafter: embedded name, folder or hub id \\[default: embedded 0.5B]"),
    verifier=typer.Option(None, help="verifier \\[default: embedded 1.5B]"),
    dtype=typer.Option(None, help="bfloat16 (default), float16 or float32"),
    drafter_url=typer.Option(None, help="SGLang drafter server URL (with --verifier-url: tune against SGLang)"),
    verifier_url=typer.Option(None, help="SGLang verifier server URL"),
    tokenizer=typer.Option(None, help="tokenizer id/folder for SGLang \\[default: --verifier]"),
    native_url=typer.Option(None, help="STANDALONE speculative SGLang server for sglang_threshold "
                            "(`relaxtune serve --native-threshold`)"),
    concurrency=typer.Option(None, help="sequences in flight against SGLang \\[default: 8]"),
    epsilon=typer.Option(None, help="allowed accuracy drop vs strict \\[default: 0.05]"),
    confidence=typer.Option(None, help="one-sided confidence of the drop bound \\[default: 0.9]"),
    c_rel=typer.Option(None, help="drafter/verifier cost ratio or 'measured' \\[default: measured]"),
    n_drafts=typer.Option(None, help="comma-separated draft lengths \\[default: 3,5,10,20]"),
    trials=typer.Option(None, help="trials per method \\[default: 8]"),
    limit=typer.Option(None, help="first N problems only"),
    seed=typer.Option(None, help="base seed \\[default: 0]"),
    stage_size=typer.Option(None, help="problems per pruning stage \\[default: 4]"),
    output_dir=typer.Option(None, help="records, Optuna db and tuned config \\[default: relaxtune-runs]"),
    storage=typer.Option(None, help="Optuna storage URL \\[default: sqlite:///<output-dir>/optuna.db]"),
    mlflow_uri=typer.Option(None, help="MLflow tracking URI \\[default: sqlite:///mlflow.db]"),
    max_length_ratio=typer.Option(None, help="optional guard on L_relax / L_strict"),
    max_truncated=typer.Option(None, help="optional guard on the truncated share"),
    export=typer.Option(None, help="tuned config path \\[default: <output-dir>/<task>.tuned.yaml]"),
)
_TUNE_TYPES = dict(concurrency=int, trials=int, limit=int, seed=int, stage_size=int, epsilon=float, confidence=float,
                   max_length_ratio=float, max_truncated=float)  # the others are str


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


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="user message; the verifier's chat template is applied"),
    method: str = typer.Option("strict", help="method id (see `relaxtune methods`) or 'ar'"),
    alpha: Optional[float] = typer.Option(None, help="the method's knob; default: the middle of its paper grid"),
    n_draft: int = typer.Option(4, "--n-draft", "-n", help="draft length N"),
    drafter: str = typer.Option("qwen2.5-coder-0.5b-instruct", help="embedded name, local folder or hub id"),
    verifier: str = typer.Option("qwen2.5-coder-1.5b-instruct", help="embedded name, local folder or hub id"),
    temperature: float = typer.Option(0.6),
    top_k: int = typer.Option(20, help="keep the k most likely tokens; 0 keeps all"),
    top_p: float = typer.Option(0.95),
    max_new_tokens: int = typer.Option(256),
    seed: int = typer.Option(0),
    dtype: str = typer.Option("bfloat16", help="bfloat16 (fastest on CPU), float16 or float32"),
    baseline: bool = typer.Option(True, help="also run AR with the same seed and report the measured speed-up"),
) -> None:
    """Generate one response with a relaxed method and print its decoding statistics."""
    from .backends.hf import load_pair
    from .engine import AR, check_decode
    from .engine import generate as run
    from .methods import get_method
    from .sampling import SamplingParams

    try:
        sampling = SamplingParams(temperature, top_k, top_p)
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        grid = get_method(method).grid if method != AR else ()
        if alpha is None and grid:
            alpha = grid[len(grid) // 2]  # the middle of the paper's grid
        check_decode(method, alpha, n_draft, temperature, max_new_tokens)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    with console.status(f"loading {drafter} -> {verifier} ({dtype})"):
        try:
            backend = load_pair(drafter if method != AR else None, verifier, dtype=dtype)
        except (OSError, ValueError, RuntimeError) as err:
            raise typer.BadParameter(str(err)) from None
    ids = backend.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    runs = [(method, alpha)] + ([(AR, None)] if baseline and method != AR else [])
    results = {}
    for name, knob in runs:
        with console.status(f"generating with {name} (up to {max_new_tokens} tokens)"):
            results[name] = run(backend, ids, method=name, knob=knob, n_draft=n_draft, sampling=sampling,
                                max_new_tokens=max_new_tokens, seed=seed)
    console.rule(f"{method}" + (f" {alpha:g}" if alpha is not None else ""))
    console.print(results[method].text)
    table = Table(title="decoding statistics")
    for col in ("run", "tokens", "tok/s", "rounds", "l_accept", "draft s", "verify s", "other s", "finish"):
        table.add_column(col, justify="right")
    for name, g in results.items():
        s = g.stats
        table.add_row(name, str(s.response_tokens), f"{s.tokens_per_second:.2f}", str(s.rounds),
                      f"{s.acceptance_length:.2f}", f"{s.draft_seconds:.1f}", f"{s.verify_seconds:.1f}",
                      f"{s.overhead_seconds:.2f}", s.finish_reason)
    console.print(table)
    if AR in results and method != AR:
        speed = results[method].stats.tokens_per_second / results[AR].stats.tokens_per_second
        console.print(f"measured wall-clock speed-up over AR: {speed:.2f}x")


tasks_app = typer.Typer(help="List task specs, or validate one.", invoke_without_command=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.callback()
def tasks(ctx: typer.Context) -> None:
    """List the task specs of evals/ (name, version, grader, data source)."""
    if ctx.invoked_subcommand is not None:
        return
    from .tasks import evals_dir, list_tasks, load_task

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
    from .tasks import load_problems, load_task

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


@app.command("eval")
def eval_(
    task: str = typer.Option(..., help="task name (see `relaxtune tasks`) or a YAML path"),
    method: str = typer.Option("strict", help="method id or 'ar'"),
    alpha: Optional[float] = typer.Option(None, help="the method's knob"),
    n_draft: int = typer.Option(4, "--n-draft", "-n"),
    limit: Optional[int] = typer.Option(None, min=1, help="first N problems only"),
    seed: int = typer.Option(0),
    drafter: str = typer.Option("qwen2.5-coder-0.5b-instruct"),
    verifier: str = typer.Option("qwen2.5-coder-1.5b-instruct"),
    dtype: str = typer.Option("bfloat16"),
    drafter_url: Optional[str] = _TUNE_FLAGS["drafter_url"],
    verifier_url: Optional[str] = _TUNE_FLAGS["verifier_url"],
    tokenizer: Optional[str] = _TUNE_FLAGS["tokenizer"],
    native_url: Optional[str] = _TUNE_FLAGS["native_url"],
    concurrency: int = typer.Option(8, min=1, help="sequences in flight against SGLang"),
    output_dir: str = typer.Option("relaxtune-runs", help="records and results go here"),
) -> None:
    """Evaluate one decoding configuration on a task: accuracy with its interval, speed statistics."""
    import json

    from .backends.hf import load_pair
    from .engine import AR, check_decode
    from .evaluation import DecodeConfig, evaluate
    from .tasks import load_problems, load_task

    try:
        spec = load_task(task)
        check_decode(method, alpha, n_draft, spec.sampling.temperature)
        problems = load_problems(spec, limit)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:
        raise typer.BadParameter(str(err)) from None
    with console.status(f"loading {drafter} -> {verifier}"):
        try:
            if verifier_url or drafter_url or native_url:
                from .job import load_backend
                from .tuning import TuneSettings

                backend = load_backend(TuneSettings(task=spec.name, drafter=drafter, verifier=verifier,
                                                    drafter_url=drafter_url, verifier_url=verifier_url,
                                                    tokenizer=tokenizer, native_url=native_url,
                                                    concurrency=concurrency))
            else:
                backend = load_pair(drafter if method != AR else None, verifier, dtype=dtype)
        except (ValueError, RuntimeError, OSError) as err:
            raise typer.BadParameter(str(err)) from None
    config = DecodeConfig(method, alpha, n_draft, seed)
    try:
        result = evaluate(spec, backend, config, output_dir=output_dir, problems=problems)
    except ValueError as err:  # e.g. the task changed under the same version
        raise typer.BadParameter(str(err)) from None
    finally:
        if hasattr(backend, "close"):
            backend.close()
    summary = result.summary() | {"task": spec.name, "version": spec.version, "config": config.label}
    result.path.with_suffix(".results.json").write_text(json.dumps(summary, indent=2))
    table = Table(title=f"{spec.name} v{spec.version}, {config.label}")
    for col in ("accuracy", "95% CI", "n", "failed", "l_accept", "mean length", "truncated", "tok/s"):
        table.add_column(col, justify="right")
    table.add_row(f"{result.accuracy:.3f}", f"[{result.ci_low:.3f}, {result.ci_high:.3f}]", str(result.n),
                  str(result.failed), f"{result.l_accept:.2f}", f"{result.mean_length:.0f}",
                  f"{result.truncated:.0%}", f"{result.tokens_per_second:.2f}")
    console.print(table)
    console.print(f"records: {result.path}", soft_wrap=True)


def _settings(config: Optional[str], flags: dict, base: Optional[dict] = None):
    """TuneSettings from ``base`` (a saved job), then a YAML config file, then
    command-line flags on top.

    Raises:
        typer.BadParameter: an unreadable file or an invalid option, named.
    """
    import pydantic
    import yaml

    from .tuning import TuneSettings

    merged: dict = dict(base or {})
    if config:
        try:
            loaded = yaml.safe_load(open(config)) or {}
        except (OSError, yaml.YAMLError) as err:
            raise typer.BadParameter(f"cannot read --config {config}: {err}") from None
        if not isinstance(loaded, dict):
            raise typer.BadParameter(f"--config {config} must hold a mapping of options, got {type(loaded).__name__}")
        merged |= {k.replace("-", "_"): v for k, v in loaded.items()}  # n-drafts and n_drafts both work
    for key, value in flags.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key in ("methods", "n_drafts") and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
            if key == "n_drafts":
                bad = [v for v in value if not v.lstrip("-").isdigit()]
                if bad:
                    raise typer.BadParameter(f"{flag}: {bad[0]!r} is not an integer (give e.g. 3,5,10)")
                value = [int(v) for v in value]
        if key == "c_rel" and value != "measured":
            try:
                value = float(value)
            except ValueError:
                raise typer.BadParameter(f"{flag}: {value!r} is neither a number nor 'measured'") from None
        merged[key] = value
    try:
        return TuneSettings(**merged)
    except pydantic.ValidationError as err:
        given = {k for k, v in flags.items() if v is not None}

        def where(loc) -> str:  # the flag, or the key of the --config file it came from
            key = str(loc[0]) if loc else ""
            return f"--{key.replace('_', '-')}" if key in given or not config else f"{config}: {key}"

        lines = [f"{where(e['loc'])}: {e['msg']}" for e in err.errors()]
        raise typer.BadParameter("; ".join(lines)) from None
    except (ValueError, TypeError) as err:
        raise typer.BadParameter(str(err)) from None


def _summary(config, path) -> None:
    table = Table(title=f"{config.task} v{config.task_version}: tuned under a drop of at most {config.epsilon:g} "
                        f"({config.confidence:.0%} one-sided), c_rel {config.c_rel:.3f}")
    for col in ("method", "feasible", "knob", "N", "strict acc", "acc", "drop UCB", "l_accept", "L ratio", "speed-up",
                "trials (pruned/failed)", "tokens"):
        table.add_column(col, justify="right")
    f = (lambda v, fmt=".3f": "-" if v is None else format(v, fmt))
    for r in config.methods.values():
        if r.feasible:
            table.add_row(r.method, "yes", "-" if r.knob is None else f"{r.knob_name}={r.knob:.3g}", f(r.n_draft, "d"),
                          f(r.strict_accuracy), f(r.accuracy), f(r.drop_upper_bound), f(r.l_accept, ".2f"),
                          f(r.length_ratio, ".2f"), f(r.modeled_speedup, ".2f"), f"{r.trials} ({r.pruned}/{r.failed})",
                          str(r.tokens_spent))
            continue
        c = r.closest or {}
        knob = "-" if c.get("knob") is None else f"{r.knob_name}={c['knob']:.3g}"
        table.add_row(r.method, "[red]no[/red] (closest)", knob, f(c.get("n_draft"), "d"), f(c.get("strict_accuracy")),
                      f(c.get("accuracy")), f(c.get("drop_upper_bound")), f(c.get("l_accept"), ".2f"),
                      f(c.get("length_ratio"), ".2f"), f(c.get("modeled_speedup"), ".2f"),
                      f"{r.trials} ({r.pruned}/{r.failed})", str(r.tokens_spent))
    console.print(table)
    rec = config.recommendation
    knob = "" if rec.knob is None else f" alpha={rec.knob:.3g}"
    console.print(f"[bold]recommendation[/bold]: {rec.method}{knob} N={rec.n_draft}, modeled {rec.modeled_speedup:.2f}x: {rec.reason}")
    console.print(f"tuned config: {path}", soft_wrap=True)
    if config.mlflow:
        console.print(f"MLflow: mlflow ui --backend-store-uri {config.mlflow['tracking_uri']}  "
                      f"(experiment {config.mlflow['experiment']})")




def _tune_options(fn):
    """Give ``fn(config, **flags)`` a ``--config`` option and every option of
    ``_TUNE_FLAGS`` (typer reads the signature), so ``tune`` and ``export`` share them."""
    kw = inspect.Parameter.KEYWORD_ONLY
    config = typer.Option(None, "--config", help="YAML with any of the options below")
    params = [inspect.Parameter("config", kw, default=config, annotation=Optional[str])]
    params += [inspect.Parameter(name, kw, default=option, annotation=Optional[_TUNE_TYPES.get(name, str)])
               for name, option in _TUNE_FLAGS.items()]
    fn.__signature__ = inspect.Signature(params)
    return fn


@app.command()
@_tune_options
def tune(config: Optional[str] = None, **flags) -> None:
    """Tune alpha (and N) per method on a task under a capability-loss budget; log to MLflow; export a config."""
    _run_job(_settings(config, flags), new_trials=True)


@app.command("export")
@_tune_options
def export_(config: Optional[str] = None, **flags) -> None:
    """Re-export the tuned config from finished studies (no new trials). Starts
    from the settings of the task's last tuning run (<output-dir>/<task>.job.yaml);
    options override them, e.g. another --epsilon."""
    import yaml

    from .job import job_file
    from .tasks import load_task

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
    _run_job(_settings(config, flags, base), new_trials=False)


def _run_job(settings, new_trials: bool) -> None:
    from .job import JobError, prepare, run_tune_job

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


@app.command()
def serve(
    drafter: str = typer.Option(..., help="drafter model path or hub id"),
    verifier: str = typer.Option(..., help="verifier model path or hub id"),
    port: int = typer.Option(30000, help="drafter port; the verifier gets port + 1"),
    mem_fraction: float = typer.Option(0.4, help="static GPU memory fraction per server"),
    log_dir: Optional[str] = typer.Option(None, help="write the servers' logs here"),
    native_threshold: Optional[float] = typer.Option(
        None, min=0.0, max=1.0, help="also start a STANDALONE speculative server (port + 2) running SGLang's "
        "own relaxation at this threshold, for the sglang_threshold method"),
    n_draft: int = typer.Option(4, "--n-draft", "-n", min=1, help="draft length N of the speculative server"),
) -> None:
    """Start a drafter and a verifier SGLang server on loopback and keep them up until Ctrl-C."""
    import time

    from .backends.sglang_launch import ServerSpec, launch
    from .backends.sglang_native import native_flags

    specs = [ServerSpec(drafter, port, mem_fraction), ServerSpec(verifier, port + 1, mem_fraction)]
    if native_threshold is not None:
        specs[0] = ServerSpec(drafter, port, mem_fraction / 2)  # the drafter is small
        specs.append(ServerSpec(verifier, port + 2, mem_fraction,
                                ("--speculative-draft-model-path", drafter, *native_flags(native_threshold, n_draft))))
    try:
        with launch(specs, log_dir=log_dir) as urls:
            d_url, v_url = urls[:2]
            native = f" --native-url {urls[2]} --methods sglang_threshold" if len(urls) > 2 else ""
            console.print(f"drafter  {d_url}\nverifier {v_url}\n" + (f"speculative {urls[2]}\n" if native else "")
                          + f"tune with: relaxtune tune --drafter-url {d_url} --verifier-url {v_url}{native} "
                          f"--drafter {drafter} --verifier {verifier} --task ...   (Ctrl-C stops the servers)")
            while True:
                time.sleep(3600)
    except RuntimeError as err:
        console.print(str(err), style="red", markup=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("servers stopped")


@app.command()
def ui(
    mlflow_uri: str = typer.Option("sqlite:///mlflow.db"),
    storage: str = typer.Option("sqlite:///relaxtune-runs/optuna.db"),
) -> None:
    """Print the commands that open the MLflow and Optuna dashboards."""
    console.print(f"MLflow (runs, Pareto figures, tuned configs):  mlflow ui --backend-store-uri {mlflow_uri}")
    console.print(f"Optuna (studies, trials):  pip install optuna-dashboard && optuna-dashboard {storage}")


def main() -> None:
    """Entry point of the ``relaxtune`` command."""
    app()


if __name__ == "__main__":
    main()
