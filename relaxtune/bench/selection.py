"""Does the exported promise hold over the whole job (search, selection, confirmation)?
And does ``relaxtune plan``'s sample certify with the power it states?

    python -m relaxtune.bench.selection [--jobs 200] [--confirm holdout,seeds] [--quick] [--json PATH]
    python -m relaxtune.bench.selection --planner [--datasets 2000] [--json PATH]

Selection: each simulated job drives the product's own path, records -> judging ->
candidates -> confirmation: ``Tuner.evaluate_point`` evaluates every candidate point on
the search's problems (``point_metrics``: the drop bound at the job's confidence), the
points go into an Optuna study as completed trials, ``candidates`` ranks the feasible
ones (fastest first, strict dominance left out) and ``confirm`` confirms them in turn
on the confirmation problems, at the split confidence. The backend: strict is always
right; candidate point k (knob k, faster with k) harms its own random problems, each
problem harmed with probability h so that its true drop over the population of
problems is ``--drop`` (0.055, just above epsilon 0.05): so every exported point is a
bad one, and P(export) is the probability the promise is broken. Harm sets:
``independent`` (each candidate its own), ``half`` (half of each candidate's harm on
problems all candidates share), ``shared`` (the same problems for all). Outcomes:
``greedy`` (a harmed problem is wrong on every sample: temperature 0, seeds replay
outcomes) or ``sampled`` (wrong on each sample with probability 1/2, from the
sample's seed; twice as many problems harmed). Each job draws its own task of
``--problems`` problems. A cell passes when P(export) <= 1 - c + 3 SE.

Planner: for each (confidence, repeats) the plan's needed problems (``plan``, the
held-out split, 2 methods x 2 confirmations) are simulated ``--datasets`` times at the
stated true drop and discordance (loss spread evenly over problems and repeats), each
dataset bounded by ``drop_bound`` from ``paired_counts`` at the split confidence; the
measured power must be at least the stated power - 3 SE.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from relaxtune.bench.results import Recorder, add_json_option
from relaxtune.tasks.spec import Problem
from relaxtune.testing.synthetic import SPEC, SyntheticPair
from relaxtune.tune.confirm import confirm, holdout_split
from relaxtune.tune.evaluation import sample_seed
from relaxtune.tune.outcomes import MethodOutcome, candidates
from relaxtune.tune.point_records import EvalResult, summarize
from relaxtune.tune.setting_groups import SearchSettings, StatsSettings, StoreSettings
from relaxtune.tune.settings import TuneSettings
from relaxtune.tune.tuning import Tuner

STRUCTURES = ("independent", "half", "shared")
OUTCOMES = ("greedy", "sampled")
CANDIDATES = (3, 8, 24)
N_DRAFT = 4


class HarmBackend:
    """``evaluate`` stand-in: strict always right (acceptance 0.2 N); the point with knob
    k accepts ``N k / (k + 1)`` and is wrong on the problems in ``harm[k]`` (every sample,
    or each with probability ``loss`` drawn from the sample's seed)."""

    def __init__(self, harm: dict[float, set[str]], loss: float | None):
        self.harm, self.loss = harm, loss

    def __call__(self, spec, backend, config, *, output_dir, problems, progress) -> EvalResult:
        k, relaxed = config.knob, config.method != "strict"
        l_accept = config.n_draft * (k / (k + 1) if relaxed else 0.2)
        rounds, records = 10, []
        for p in problems:
            seed = sample_seed(config.seed, p.id, 0)
            wrong = (
                relaxed
                and p.id in self.harm[k]
                and (self.loss is None or (zlib.crc32(f"{seed}:{k}".encode()) % 10_000) / 10_000 < self.loss)
            )
            records.append(
                dict(
                    problem_id=p.id,
                    repeat=0,
                    seed=seed,
                    failed=False,
                    correct=not wrong,
                    verdict="wrong" if wrong else "correct",
                    output="x",
                    finish_reason="stop",
                    response_tokens=100,
                    stats={"rounds": rounds, "accepted": round(l_accept * rounds), "wall_seconds": 1.0},
                )
            )
        return summarize(records, Path(output_dir) / "unused.jsonl")


def harm_sets(rng: np.random.Generator, ids: list[str], knobs: list[float], rate: float, structure: str):
    """Each knob's harmed problems: each problem in with probability ``rate`` (module doc)."""
    if structure == "shared":
        common = {i for i in ids if rng.random() < rate}
        return {k: common for k in knobs}
    if structure == "independent":
        return {k: {i for i in ids if rng.random() < rate} for k in knobs}
    common = {i for i in ids if rng.random() < rate / 2}
    own = (rate / 2) / (1 - rate / 2)  # the union of both parts keeps each problem at ``rate``
    return {k: common | {i for i in ids if rng.random() < own} for k in knobs}


def one_job(
    rng,
    problems: int,
    n_candidates: int,
    structure: str,
    outcome: str,
    drop: float,
    mode: str,
    epsilon: float,
    confidence: float,
    folder: str,
) -> bool:
    """One job; True when it exported a point (every candidate's true drop is ``drop``)."""
    import optuna

    ids = [str(i) for i in range(problems)]
    task = [Problem(i, f"q{i}", i) for i in ids]
    knobs = [float(k) for k in range(1, n_candidates + 1)]
    loss = None if outcome == "greedy" else 0.5
    backend = HarmBackend(harm_sets(rng, ids, knobs, drop / (loss or 1.0), structure), loss)
    seed = int(rng.integers(1 << 30))
    stats = StatsSettings(c_rel=0.2, epsilon=epsilon, confidence=confidence, confirm=mode)
    settings = TuneSettings(
        task="synthetic",
        stats=stats,
        search=SearchSettings(
            methods=["cactus"], n_drafts=[N_DRAFT], trials=n_candidates, stage_size=10_000, seed=seed
        ),
        stores=StoreSettings(output_dir=folder),
    )
    search, held = holdout_split(task, seed) if mode == "holdout" else (task, task)
    tuner = Tuner(settings, SPEC, search, SyntheticPair(), 0.2, evaluate_fn=backend, progress=False)
    study = optuna.create_study(directions=["maximize", "maximize"])
    dists = {
        "knob": optuna.distributions.FloatDistribution(0.0, 1000.0),
        "n_draft": optuna.distributions.CategoricalDistribution([N_DRAFT]),
    }
    for k in knobs:
        metrics, _ = tuner.evaluate_point("cactus", k, N_DRAFT)
        study.add_trial(
            optuna.trial.create_trial(
                params={"knob": k, "n_draft": N_DRAFT},
                distributions=dists,
                values=[metrics["speedup"], metrics["accuracy"]],
                user_attrs={"metrics": metrics},
            )
        )
    ranked = candidates(study, stats, tuner.strict_points())
    result = confirm(tuner, [MethodOutcome("cactus", study, ranked[0] if ranked else None)], held)
    return any(c.confirmed is not None for c in result.values())


def selection(args, rec) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    modes = args.confirm.split(",")
    jobs, bad, alpha = args.jobs, 0, 1 - args.confidence
    print(
        f"\nP(an exported point's true drop > epsilon): {args.problems} problems x 1, epsilon {args.epsilon:g}, "
        f"c {args.confidence:g}, every candidate's true drop {args.drop:g}, 2 confirmations, {jobs} jobs per cell "
        f"(SE in brackets; ! = above 1 - c + 3 SE)\n"
    )
    print("| harm | outcomes | candidates | " + " | ".join(f"--confirm {m}" for m in modes) + " |")
    print("|---|---|---|" + "---|" * len(modes))
    start, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as folder:
        for structure in STRUCTURES:
            for outcome in OUTCOMES:
                for k in (
                    [int(x) for x in args.candidates.split(",")]
                    if args.candidates
                    else CANDIDATES[:2]
                    if args.quick
                    else CANDIDATES
                ):
                    cells = []
                    for mode in modes:
                        rng = np.random.default_rng(
                            [args.seed, STRUCTURES.index(structure), OUTCOMES.index(outcome), k]
                        )
                        p = float(
                            np.mean(
                                [
                                    one_job(
                                        rng,
                                        args.problems,
                                        k,
                                        structure,
                                        outcome,
                                        args.drop,
                                        mode,
                                        args.epsilon,
                                        args.confidence,
                                        folder,
                                    )
                                    for _ in range(jobs)
                                ]
                            )
                        )
                        se = math.sqrt(max(p * (1 - p), alpha * (1 - alpha)) / jobs)
                        over = p > alpha + 3 * se
                        bad += over and mode == "holdout"
                        cells.append(f"{p:.3f} ({se:.3f})" + (" !" if over else ""))
                    print(f"| {structure} | {outcome} | {k} | " + " | ".join(cells) + " |", flush=True)
                    rows.append([structure, outcome, k, *cells])
    note = f"--confirm holdout cells above 1 - c + 3 SE: {bad} ({time.perf_counter() - start:.0f} s)"
    print(f"\n{note}")
    rec.table(
        f"P(an exported point's true drop > epsilon): {args.problems} problems x 1, epsilon {args.epsilon:g}, "
        f"c {args.confidence:g}, every candidate's true drop {args.drop:g}, {jobs} jobs per cell (SE in brackets)",
        ["harm", "outcomes", "candidates", *(f"--confirm {m}" for m in modes)],
        rows,
        [note],
        show=False,
    )
    return 0


def planner(args, rec) -> int:
    eps = args.plan_epsilon
    from relaxtune.certify.planning import plan
    from relaxtune.certify.stats import drop_bound, paired_counts

    rng, low, rows = np.random.default_rng(args.seed), 0, []
    print(
        f"\nrelaxtune plan's sample (held-out half, 2 methods x 2 confirmations) at epsilon {eps:g}, "
        f"true drop {args.plan_drop:g}, discordance {args.discordance:g} (loss spread evenly), power "
        f"{args.power:g}; {args.datasets} simulated confirmations per row\n"
    )
    print("| c | repeats | problems (--limit) | confirmation problems | stated power | measured power (SE) |")
    print("|---|---|---|---|---|---|")
    start = time.perf_counter()
    for confidence in (0.9, 0.95):
        for repeats in (1, 4):
            p = plan(100, repeats, eps, confidence, args.discordance, args.plan_drop, args.power, planned=4)
            k = p.needed // 2
            probs = [(args.discordance + args.plan_drop) / 2, (args.discordance - args.plan_drop) / 2]
            probs.append(1 - sum(probs))
            hits = 0
            for _ in range(args.datasets):
                draw = rng.choice(3, p=probs, size=(k, repeats))  # 0 strict-only, 1 relaxed-only, 2 concordant
                strict = [
                    {"problem_id": str(j), "repeat": r, "correct": draw[j, r] != 1}
                    for j in range(k)
                    for r in range(repeats)
                ]
                relaxed = [
                    {"problem_id": str(j), "repeat": r, "correct": draw[j, r] != 0}
                    for j in range(k)
                    for r in range(repeats)
                ]
                hits += drop_bound(paired_counts(strict, relaxed), p.confidence_each).upper <= eps
            measured = hits / args.datasets
            se = math.sqrt(measured * (1 - measured) / args.datasets)
            ok = measured >= p.power_needed - 3 * se
            low += not ok
            power = f"{measured:.3f} ({se:.3f})" + " !" * (not ok)
            rows.append([confidence, repeats, p.needed, k, round(p.power_needed, 3), power])
            print(
                f"| {confidence:g} | {repeats} | {p.needed} | {k} | {p.power_needed:.3f} | {measured:.3f} ({se:.3f})"
                + ("" if ok else " !")
                + " |",
                flush=True,
            )
    note = f"rows below stated - 3 SE: {low} ({time.perf_counter() - start:.0f} s)"
    print(f"\n{note}")
    rec.table(
        f"relaxtune plan's sample (held-out half, 2 methods x 2 confirmations) at epsilon {eps:g}, true drop "
        f"{args.plan_drop:g}, discordance {args.discordance:g}, power {args.power:g}; {args.datasets} simulated "
        "confirmations per row",
        ["c", "repeats", "problems (--limit)", "confirmation problems", "stated power", "measured power (SE)"],
        rows,
        [note],
        show=False,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200, help="simulated jobs per cell")
    ap.add_argument("--problems", type=int, default=164)
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--confidence", type=float, default=0.9)
    ap.add_argument("--drop", type=float, default=0.055, help="every candidate's true drop")
    ap.add_argument("--confirm", default="holdout,seeds", help="confirmation modes, comma separated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="3 and 8 candidates only")
    ap.add_argument("--candidates", default=None, help="candidate counts, comma separated (default 3,8,24)")
    ap.add_argument("--planner", action="store_true", help="the planner's table instead")
    ap.add_argument("--datasets", type=int, default=1000, help="planner: simulated confirmations per row")
    ap.add_argument("--plan-epsilon", type=float, default=0.15, help="planner: the epsilon planned for")
    ap.add_argument("--plan-drop", type=float, default=0.0, help="planner: the true drop planned for")
    ap.add_argument("--discordance", type=float, default=0.1, help="planner: discordance per sample")
    ap.add_argument("--power", type=float, default=0.8)
    add_json_option(ap)
    args = ap.parse_args(argv)
    rec = Recorder("selection", "The exported promise over the whole job, and the planner's power", argv)
    status = planner(args, rec) if args.planner else selection(args, rec)
    rec.write(args.json)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
