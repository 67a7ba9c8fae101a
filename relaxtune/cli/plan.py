"""``plan``: what a sample can certify, and the problems x repeats a target needs (no models loaded)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from .app import app, console
from .tables import JSON, Col, print_json, show

DISCORDANCES = (0.02, 0.05, 0.1, 0.2, 0.4)


def strict_sample(output_dir: str, spec) -> tuple[int, int, Path] | None:
    """``(problems, repeats, file)`` of the largest strict records of the task in
    ``output_dir`` (any pair, N and seed; finished samples only), or None."""
    best = None
    for path in sorted(Path(output_dir).glob(f"{spec.name}-v{spec.version}/*/strict__*.jsonl")):
        per: dict[str, set[int]] = {}
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill
                continue
            if not rec.get("failed"):
                per.setdefault(rec["problem_id"], set()).add(rec["repeat"])
        if per and (best is None or sum(map(len, per.values())) > best[0]):
            best = (sum(map(len, per.values())), len(per), min(map(len, per.values())), path)
    return None if best is None else best[1:]


@app.command("plan")
def plan_(
    task: str = typer.Option(..., help="task name (see `relaxtune tasks`) or YAML path"),
    epsilon: float = typer.Option(..., help="the accuracy drop vs strict to certify"),
    confidence: float = typer.Option(0.9, help="one-sided confidence of the bound"),
    drop: float = typer.Option(0.0, help="true accuracy drop of the relaxed point planned for"),
    discordance: float = typer.Option(0.1, help="share of paired samples where relaxed and strict differ (common "
                                      "random numbers give about 0.1)"),
    power: float = typer.Option(0.8, help="chance of certifying epsilon"),
    problems: Optional[int] = typer.Option(None, min=1, help="the sample to assess \\[default: strict's records in "
                                           "--output-dir, else the task's problems]"),
    output_dir: str = typer.Option("relaxtune-runs", help="where the tuning runs' records are"),
    json_output: bool = JSON,
) -> None:
    """Print the smallest drop the current sample can certify, and the problems x repeats needed to
    certify EPSILON at CONFIDENCE for a relaxed point with a given true drop and discordance."""
    from ..certify.planning import plan, problems_needed
    from ..tasks.spec import load_problems, load_task

    try:
        spec = load_task(task)
        repeats = spec.repeats
        if problems is not None:
            source = "--problems"
        elif (found := strict_sample(output_dir, spec)) is not None:
            problems, repeats, path = found
            source = f"strict's records {path}"
        else:
            problems = len(load_problems(spec))
            source = f"the task's problems (no strict records under {output_dir})"
        result = plan(problems, repeats, epsilon, confidence, discordance, drop, power)
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:
        raise typer.BadParameter(str(err)) from None
    rows = []
    for delta in sorted({*DISCORDANCES, discordance}):
        if delta >= abs(drop):
            spread, concentrated = (problems_needed(epsilon, confidence, delta, drop, power, repeats, concentrated=c)
                                    for c in ((False, True) if repeats > 1 else (False, False)))
            rows.append({"discordance": delta, "problems": spread, "problems_concentrated": concentrated})
    if json_output:
        print_json({"source": source, "plan": asdict(result) | {"line": result.line()}, "needed": rows})
        return
    console.print(f"sample: {problems} problems x {repeats}, from {source}", soft_wrap=True)
    console.print(result.line())
    cols = [Col("discordance", justify="right"),
            Col(f"problems x {repeats}" + (" (loss spread evenly)" if repeats > 1 else ""), justify="right")]
    if repeats > 1:
        cols.append(Col("(loss in a few problems)", justify="right"))
    # title and caption as lines: a table this narrow would wrap them into a column
    console.print(f"to certify {epsilon:g} at {confidence:.0%}, {power:.0%} of the time (true drop {drop:g}):")
    show(None, cols, [[f"{r['discordance']:.2f}", *("-" if k is None else str(k) for k in
                                                    (r["problems"], r["problems_concentrated"])[: len(cols) - 1])]
                      for r in rows])
    console.print("normal approximation to the bound, never below what a perfect sample needs; the exact bounds "
                  "need somewhat more at small samples")
