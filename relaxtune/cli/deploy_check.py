"""``relaxtune deploy-check``: run a tuned point through transformers' own assisted
generation and through relaxtune's loop (``--runtime hf``), and say whether they agree
(``relaxtune.report.deploy_check``)."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app, say

__all__ = ["deploy_check", "resolve_point", "parse_knobs"]

CONTROLS = ("none", "mirrored", "n+1")


def parse_knobs(items: list[str]) -> dict[str, float] | None:
    """``["alpha=0.2"]`` -> ``{"alpha": 0.2}`` (None for an empty list).

    Raises:
        typer.BadParameter: an item without ``=`` or a value that is not a number.
    """
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise typer.BadParameter(f"--knob takes NAME=VALUE, got {item!r}")
    return out or None


def resolve_point(config, method: str | None, knobs: dict | None, n_draft: int | None) -> tuple[str, float, int]:
    """The point to check: ``(method, alpha, N)``, from the options, else the
    method's confirmed point, else the recommendation; a plain recommendation (serve the
    verifier alone) is checked only when ``method`` is given: its fastest speculative point
    (``fastest_speculative``) supplies N and the knob where it is that method's.

    Raises:
        ValueError: a plain recommendation without ``method`` (naming the fastest speculative
            point), a method that transformers' assisted generation does not run (naming the
            engines that do), greedy sampling for ``ens``, a point without a knob or draft
            length, or a knob out of range.
    """
    from ..decoding.methods import get_method
    from ..report.deploy import engines_running
    from ..tune.recommend import PLAIN

    rec = config.recommendation
    point = rec.fastest_speculative if rec.method == PLAIN else rec  # plain: nothing speculative is deployed
    if method is None and rec.method == PLAIN:
        fast = f" ({point.method} N={point.n_draft})" if point is not None else ""
        raise ValueError(
            "the recommendation is plain decoding (serve the verifier alone): no speculative rule to check; "
            f"give --method to check a point anyway (the fastest speculative{fast}: --method {point.method})"
            if point is not None
            else "the recommendation is plain decoding (serve the verifier alone): no speculative rule to check"
        )
    method = method or rec.method
    spec = get_method(method)
    if "transformers" not in engines_running(spec.id):
        where = ", ".join(engines_running(spec.id)) or "no engine"
        raise ValueError(
            f"deploy-check runs transformers' assisted generation, which runs strict and ens only; "
            f"{spec.id} runs on {where}"
        )
    result = config.methods.get(spec.id)
    n = n_draft or (result.n_draft if result is not None and result.n_draft else None)
    n = n or (point.n_draft if point is not None else None) or min(config.strict_by_n_draft, default=None)
    if n is None:
        raise ValueError("no draft length in the config: give --n-draft")
    if spec.id == "strict":
        return "strict", 0.0, int(n)
    if not config.sampling.get("temperature"):
        raise ValueError(
            "transformers' greedy ensemble takes the argmax of the mixture, another rule than ens: "
            "deploy-check needs the task's temperature > 0"
        )
    if knobs is not None:
        alpha = spec.named(knobs)["alpha"]
    elif result is not None and result.knob is not None:
        alpha = result.knob
    elif point is not None and point.method == spec.id and point.knob is not None:
        alpha = point.knob
    else:
        raise ValueError(f"no confirmed point of {spec.id} in the config: give --knob alpha=VALUE")
    return spec.id, float(spec.check_knob(alpha)), int(n)


@app.command("deploy-check")
def deploy_check(
    config_path: str = typer.Argument(..., metavar="CONFIG", help="a tuned config (relaxtune-runs/<task>.tuned.yaml)"),
    method: str | None = typer.Option(None, "--method", help="method to check (default: the recommendation's)"),
    knob: list[str] = typer.Option([], "--knob", help="NAME=VALUE (ens: alpha=0.2); default: the confirmed point"),
    n_draft: int | None = typer.Option(None, "--n-draft", min=1, help="draft length N (default: the point's)"),
    task: str | None = typer.Option(None, help="task name or YAML path (default: the config's task)"),
    problems: int = typer.Option(40, min=1, help="problems to run"),
    samples: int = typer.Option(1, min=1, help="responses per problem and side"),
    min_rounds: int = typer.Option(500, min=1, help="compared rounds each side needs"),
    alpha: float = typer.Option(0.01, help="significance level of each test, in (0, 1)"),
    control: str = typer.Option("none", help="negative control: none, mirrored (w -> 1 - w) or n+1"),
    seed: int = typer.Option(0, help="first seed"),
    device: str = typer.Option("auto", help="cpu, cuda or auto"),
    runtime: str = typer.Option(
        "hf", help="relaxtune's side: hf (transformers weights, the ones transformers' side runs; the only one)"
    ),
    dtype: str | None = typer.Option(
        None, help="both sides' dtype (default: the config's; a llama.cpp config's GGUF dequantised to bfloat16)"
    ),
) -> None:
    """Run a tuned point through transformers' own assisted generation
    (``generate(assistant_model=..., assistant_ensemble_weight=1 - alpha)``) and through
    relaxtune's loop on the same converted weights, dtype, prompt ids, stop strings and
    sampling, and compare per-round acceptance counts, response lengths and accuracy
    (intervals, then "verdict: agree" or "verdict: disagree"). A negative control
    (--control mirrored or n+1) should print "disagree". Exit 1 when the verdict is not
    the expected one."""
    from ..backends.hf import load_pair
    from ..decoding.engine_rules import ensemble_weight
    from ..decoding.sampling import SamplingParams
    from ..report.deploy_check import compare, relaxtune_side, transformers_side
    from ..report.export import load_config
    from ..tasks.spec import build_prompt_ids, load_problems, load_task
    from ..tune.checks import check_draft_lengths
    from ..tune.evaluation import _grade
    from ..tune.setting_groups import DTYPES

    out = say()
    if control not in CONTROLS:
        raise typer.BadParameter(f"--control takes {', '.join(CONTROLS)}, got {control!r}")
    if runtime != "hf":
        out(
            f"refused: --runtime {runtime}: transformers runs its own weights, so relaxtune's side runs the same "
            "converted weights on transformers (--runtime hf)"
        )
        raise typer.Exit(2)
    if not 0.0 < alpha < 1.0:  # NaN too
        out(f"refused: --alpha {alpha}: a significance level lies in (0, 1)")
        raise typer.Exit(2)
    if dtype is not None and dtype not in DTYPES:
        out(f"refused: --dtype {dtype}: give one of {', '.join(DTYPES)}")
        raise typer.Exit(2)
    if not Path(config_path).is_file():
        out(f"refused: {config_path}: no such file (give the tuned config `relaxtune tune` exported)")
        raise typer.Exit(2)
    try:
        config = load_config(config_path)
    except (ValueError, OSError) as err:  # a missing file, or one the tuned config's schema refuses
        out(f"refused: {config_path} is not a tuned config relaxtune can read: {err}")
        raise typer.Exit(2)
    dtype = dtype or config.dtype or "bfloat16"
    try:
        m, a, n = resolve_point(config, method, parse_knobs(knob), n_draft)
    except ValueError as err:
        out(f"refused: {err}")
        raise typer.Exit(2)
    try:
        spec = load_task(task or config.task)
        check_draft_lengths([n], spec.max_new_tokens, flag="--n-draft")
    except (FileNotFoundError, ValueError) as err:
        out(f"refused: {err}")
        raise typer.Exit(2)
    backend = load_pair(config.drafter, config.verifier, dtype=dtype, device=device)
    chosen = load_problems(spec, problems)
    prompts = [build_prompt_ids(backend.tokenizer, spec, p) for p in chosen for _ in range(samples)]
    s = config.sampling
    sampling = SamplingParams(s["temperature"], s.get("top_k"), s.get("top_p"))
    budget = spec.thinking_budget or spec.max_new_tokens
    w = ensemble_weight(a) if m == "ens" else None
    their_w = (1.0 - w if w is not None else None) if control == "mirrored" else w
    their_n = n + 1 if control == "n+1" else n
    out(
        f"deploy-check {m} alpha={a:g} N={n} on {config.drafter} -> {config.verifier} ({dtype}, --runtime hf), "
        f"{len(prompts)} responses per side, max {budget} tokens; transformers: assistant_ensemble_weight="
        f"{their_w}, N={their_n}" + (f" (negative control: {control})" if control != "none" else "")
    )
    ours = relaxtune_side(
        backend,
        prompts,
        method=m,
        knob=a if m != "strict" else None,
        n_draft=n,
        sampling=sampling,
        max_new_tokens=budget,
        stop=tuple(spec.stop),
        seed=seed,
        label="relaxtune",
        log=out,
    )
    theirs = transformers_side(
        backend.drafter,
        backend.verifier,
        prompts,
        weight=their_w,
        n_draft=their_n,
        sampling=sampling,
        max_new_tokens=budget,
        stop=tuple(spec.stop),
        tokenizer=backend.tokenizer,
        eos=sorted(backend.eos_token_ids),
        seed=seed,
        label="transformers",
        log=out,
    )
    problems_of = [p for p in chosen for _ in range(samples)]
    for side in (ours, theirs):
        side.correct = [
            _grade(spec, p, t, n >= budget).correct for p, t, n in zip(problems_of, side.texts, side.lengths)
        ]
    try:
        result = compare(ours, theirs, alpha=alpha, min_rounds=min_rounds)
    except ValueError as err:
        out(f"refused: {err}")
        raise typer.Exit(2)
    for line in result.lines():
        out(line)
    expected = "agree" if control == "none" else "disagree"
    if result.verdict != expected:
        raise typer.Exit(1)
