"""``plan``: what a sample can certify, and the problems x repeats a target needs (no models loaded)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import typer

from .app import app, console
from .options import cli_type, finite, group_of, setting_option
from .tables import JSON, Col, print_json, show


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
    task: str = setting_option("task", default=...),
    epsilon: float = setting_option("epsilon", default=..., callback=finite),
    confidence: float = setting_option("confidence", callback=finite),
    drop: float = typer.Option(0.0, callback=finite, help="true accuracy drop of the relaxed point planned for"),
    discordance: float = typer.Option(
        0.1,
        callback=finite,
        help="share of paired samples where relaxed and strict differ (common random numbers give about 0.1)",
    ),
    power: float = typer.Option(0.8, callback=finite, help="chance that the exported bound certifies epsilon"),
    methods: int = typer.Option(
        2, min=1, help="methods the job tunes (the confidence is split over their confirmations)"
    ),
    confirmations: int = setting_option("confirmations", min=1),
    confirm: cli_type("confirm") = setting_option("confirm"),
    problems: int | None = typer.Option(
        None, min=1, help="the sample to assess \\[default: strict's records in --output-dir, else the task's problems]"
    ),
    output_dir: str = setting_option("output_dir"),
    json_output: bool = JSON,
) -> None:
    """Print what the exported bound of a job on the current sample can certify, and the problems x repeats
    at which it certifies EPSILON with probability POWER, at the export's own confidence (CONFIDENCE split
    over METHODS x CONFIRMATIONS confirmations) and split (--confirm), for a relaxed point with a given true
    drop and discordance. Power is exact (the bound's own test summed over every outcome); repeats change
    neither it nor the floor (the bound reads each problem's first repeat)."""
    from ..certify.planning import plan
    from ..tune.setting_groups import StatsSettings

    group_of(StatsSettings, epsilon=epsilon, confidence=confidence, confirmations=confirmations, confirm=confirm)
    try:
        from ..tasks.spec import load_problems, load_task

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
        with console.status("computing the exact power"):
            result = plan(
                problems,
                repeats,
                epsilon,
                confidence,
                discordance,
                drop,
                power,
                planned=methods * confirmations,
                holdout=confirm == "holdout",
            )
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as err:  # plan's own checks name the option
        raise typer.BadParameter(re.sub(r"^(drop|discordance|power|epsilon|confidence) ", r"--\1 ", str(err))) from None
    if json_output:
        print_json(
            {"source": source, "plan": asdict(result) | {"line": result.line(), "assumptions": result.assumptions()}}
        )
        return
    console.print(f"sample: {problems} problems x {repeats}, from {source}", soft_wrap=True)
    console.print(f"assumes: {result.assumptions()}")
    console.print(result.line())
    rows = [["this sample", str(result.problems), f"{result.power_now:.3f}"]]
    if result.needed is not None:
        rows.append(["needed", str(result.needed), f"{result.power_needed:.3f}"])
    show(None, [Col("sample"), Col(f"problems x {repeats}", justify="right"), Col("P(certify)", justify="right")], rows)
