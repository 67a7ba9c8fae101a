"""One-off runs: ``generate`` (one response) and ``eval`` (one configuration on a task)."""

from __future__ import annotations

import typer

from .app import app, console, status
from .options import cli_type, finite, group_of, setting_option
from .tables import JSON, Col, print_json, show


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="user message; the verifier's chat template is applied"),
    method: str = typer.Option("strict", help="method id (see `relaxtune methods`) or 'ar'"),
    alpha: float | None = typer.Option(
        None, callback=finite, help="the method's knob; default: the middle of its paper grid"
    ),
    n_draft: int = typer.Option(4, "--n-draft", "-n", min=1, help="draft length N"),
    drafter: cli_type("drafter") = setting_option("drafter"),
    verifier: cli_type("verifier") = setting_option("verifier"),
    temperature: float = typer.Option(0.6, callback=finite, help="sampling temperature"),
    top_k: int = typer.Option(20, min=0, help="keep the k most likely tokens; 0 keeps all"),
    top_p: float = typer.Option(
        0.95, callback=finite, help="keep the smallest set of tokens of at least this probability"
    ),
    max_new_tokens: int = typer.Option(256, min=1, help="the response's length limit, in tokens"),
    seed: cli_type("seed") = setting_option("seed"),
    dtype: cli_type("dtype") = setting_option("dtype"),
    runtime: cli_type("runtime") = setting_option("runtime"),
    tokenizer: str | None = setting_option("tokenizer"),
    baseline: bool = typer.Option(True, help="also run AR with the same seed and report the measured speed-up"),
    json_output: bool = JSON,
) -> None:
    """Generate one response with a relaxed method and print its decoding statistics."""
    from ..backends.load import load_backend
    from ..decoding.methods import get_method
    from ..decoding.sampling import SamplingParams
    from ..engine.sequence import AR, check_decode
    from ..engine.sequence import generate as run
    from ..tune.checks import check_draft_lengths
    from ..tune.setting_groups import PairSettings
    from .checks import check_pair

    try:
        try:
            sampling = SamplingParams(temperature, top_k, top_p)
        except ValueError as err:
            raise ValueError(f"--temperature {temperature:g} / --top-k {top_k} / --top-p {top_p:g}: {err}") from None
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        grid = get_method(method).grid if method != AR else ()
        if alpha is None and grid:
            alpha = grid[len(grid) // 2]  # the middle of the paper's grid
        check_decode(method, alpha, n_draft, temperature, max_new_tokens)
        if method != AR:
            check_draft_lengths([n_draft], max_new_tokens, flag="--n-draft")
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    runtime = check_pair(
        group_of(PairSettings, drafter=drafter, verifier=verifier, dtype=dtype, runtime=runtime, tokenizer=tokenizer),
        drafter=method != AR,
    )
    with status(f"loading {drafter} -> {verifier} ({'GGUF' if runtime == 'llamacpp' else dtype})", json_output):
        try:
            backend = load_backend(
                drafter if method != AR else None,
                verifier,
                dtype=dtype,
                runtime=runtime,
                batch_size=1 if runtime == "llamacpp" else None,
                tokenizer=tokenizer,
            )
        except (OSError, ValueError, RuntimeError) as err:
            raise typer.BadParameter(str(err)) from None
    ids = backend.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    runs = [(method, alpha)] + ([(AR, None)] if baseline and method != AR else [])
    results = {}
    for name, knob in runs:
        with status(f"generating with {name} (up to {max_new_tokens} tokens)", json_output):
            results[name] = run(
                backend,
                ids,
                method=name,
                knob=knob,
                n_draft=n_draft,
                sampling=sampling,
                max_new_tokens=max_new_tokens,
                seed=seed,
            )
    speed = (
        results[method].stats.tokens_per_second / results[AR].stats.tokens_per_second
        if AR in results and method != AR
        else None
    )
    if json_output:
        print_json(
            {
                "text": results[method].text,
                "stats": {name: g.stats.to_dict() for name, g in results.items()},
                "measured_speedup": speed,
            }
        )
        return
    console.rule(f"{method}" + (f" {alpha:g}" if alpha is not None else ""))
    console.print(results[method].text, markup=False, highlight=False)
    cols = [
        Col("run"),
        Col("tokens", justify="right"),
        Col("tok/s", justify="right"),
        Col("rounds", 3, justify="right"),
        Col("l_accept", justify="right"),
        Col("draft s", 2, justify="right"),
        Col("verify s", 2, justify="right"),
        Col("other s", 4, justify="right"),
        Col("finish", 1),
    ]
    rows = [
        [
            name,
            str(g.stats.response_tokens),
            f"{g.stats.tokens_per_second:.2f}",
            str(g.stats.rounds),
            f"{g.stats.acceptance_length:.2f}",
            f"{g.stats.draft_seconds:.1f}",
            f"{g.stats.verify_seconds:.1f}",
            f"{g.stats.overhead_seconds:.2f}",
            g.stats.finish_reason,
        ]
        for name, g in results.items()
    ]
    show("decoding statistics", cols, rows)
    if speed is not None:
        console.print(f"measured wall-clock speed-up over AR: {speed:.2f}x")


@app.command("eval")
def eval_(
    task: str = setting_option("task", default=...),
    method: str = typer.Option("strict", help="method id or 'ar'"),
    alpha: float | None = typer.Option(None, callback=finite, help="the method's knob"),
    n_draft: int = typer.Option(4, "--n-draft", "-n", min=1, help="draft length N"),
    limit: int | None = setting_option("limit", min=1),
    seed: cli_type("seed") = setting_option("seed"),
    drafter: cli_type("drafter") = setting_option("drafter"),
    verifier: cli_type("verifier") = setting_option("verifier"),
    dtype: cli_type("dtype") = setting_option("dtype"),
    runtime: cli_type("runtime") = setting_option("runtime"),
    drafter_url: str | None = setting_option("drafter_url"),
    verifier_url: str | None = setting_option("verifier_url"),
    tokenizer: str | None = setting_option("tokenizer"),
    native_url: str | None = setting_option("native_url"),
    concurrency: int = setting_option("concurrency", min=1),
    batch_size: int | None = setting_option("batch_size", min=1),
    output_dir: str = setting_option("output_dir"),
    relaxation_scope: cli_type("relaxation_scope") = setting_option("relaxation_scope"),
    json_output: bool = JSON,
) -> None:
    """Evaluate one decoding configuration on a task: accuracy with its interval, speed statistics."""
    import json
    from pathlib import Path

    from ..backends.load import LazyBackend, backend_name, load_backend
    from ..decoding.scope import check_scope
    from ..engine.sequence import AR, check_decode
    from ..tasks.spec import load_problems, load_task
    from ..tune.checks import check_draft_lengths
    from ..tune.evaluation import evaluate
    from ..tune.point_records import DecodeConfig, finished_samples, records_name
    from ..tune.setting_groups import PairSettings
    from .checks import check_folder, check_pair

    pair = group_of(
        PairSettings,
        drafter=drafter,
        verifier=verifier,
        dtype=dtype,
        runtime=runtime,
        drafter_url=drafter_url,
        verifier_url=verifier_url,
        tokenizer=tokenizer,
        native_url=native_url,
        concurrency=concurrency,
        batch_size=batch_size,
    )
    runtime = check_pair(pair, drafter=method != AR)
    check_folder("--output-dir", output_dir)
    try:
        spec = load_task(task)
        check_decode(method, alpha, n_draft, spec.sampling.temperature)
        if method != AR:
            check_draft_lengths([n_draft], spec.max_new_tokens, flag="--n-draft")
        if relaxation_scope == "both":
            raise ValueError("--relaxation-scope both: eval runs one point; give all or thinking")
        check_scope(relaxation_scope, spec.name, spec.thinks)
        problems = load_problems(spec, limit)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:
        raise typer.BadParameter(str(err)) from None

    def load():
        if verifier_url or drafter_url or native_url:
            return load_backend(
                drafter,
                verifier,
                drafter_url=drafter_url,
                verifier_url=verifier_url,
                tokenizer=tokenizer,
                native_url=native_url,
                concurrency=concurrency,
            )
        return load_backend(
            drafter if method != AR else None,
            verifier,
            dtype=dtype,
            batch_size=batch_size,
            tokenizer=tokenizer,
            runtime=runtime,
        )

    served = bool(verifier_url or drafter_url or native_url)
    name = backend_name(
        drafter if served or method != AR else None, verifier, dtype, drafter_url, verifier_url, runtime=runtime
    )
    backend = LazyBackend(load, name, native=bool(native_url))  # every sample recorded: no model loads
    config = DecodeConfig(method, alpha, n_draft, seed, relaxation_scope)
    if (
        finished_samples(Path(output_dir), spec, config, records_name(backend, method), problems)
        < len(problems) * spec.repeats
    ):
        with status(f"loading {drafter} -> {verifier}", json_output):
            try:
                backend = load()
            except (ValueError, RuntimeError, OSError) as err:
                raise typer.BadParameter(str(err)) from None
    try:
        reused = finished_samples(Path(output_dir), spec, config, records_name(backend, method), problems)
        result = evaluate(spec, backend, config, output_dir=output_dir, problems=problems)
    except ValueError as err:  # e.g. the task changed under the same version
        raise typer.BadParameter(str(err)) from None
    finally:
        if hasattr(backend, "close"):
            backend.close()
    summary = result.summary() | {
        "task": spec.name,
        "version": spec.version,
        "config": config.label,
        "reused_samples": reused,
    }
    result.path.with_suffix(".results.json").write_text(json.dumps(summary, indent=2))
    if json_output:
        print_json(summary | {"records": str(result.path)})
        return
    cols = [
        Col("accuracy", justify="right"),
        Col("95% CI", justify="right"),
        Col("n", justify="right"),
        Col("failed", 2, justify="right"),
        Col("l_accept", justify="right"),
        Col("mean length", 3, justify="right"),
        Col("truncated", 1, justify="right"),
        Col("tok/s", justify="right"),
    ]
    show(
        f"{spec.name} v{spec.version}, {config.label}",
        cols,
        [
            [
                f"{result.accuracy:.3f}",
                f"[{result.ci_low:.3f}, {result.ci_high:.3f}]",
                str(result.n),
                str(result.failed),
                f"{result.l_accept:.2f}",
                f"{result.mean_length:.0f}",
                f"{result.truncated:.0%}",
                f"{result.tokens_per_second:.2f}",
            ]
        ],
    )
    console.print(f"records: {result.path}", soft_wrap=True, markup=False)
    if reused:
        console.print(
            f"{reused} of {len(problems) * spec.repeats} samples were read back from these records, not "
            "generated now: their tok/s and timings are those of the run that wrote them (another "
            "--output-dir or --seed generates anew)",
            soft_wrap=True,
            markup=False,
        )
