"""Tuning efficiency: the shipped search against the paper's full grid and random search,
on simulated tasks with a known truth.

    python -m relaxtune.bench.tuning [--tasks 5] [--families aime,gpqa,lcb] [--methods cactus,mentored,ens]
                                     [--seeds 1] [--jobs 2] [--quick] [--json PATH]

Each simulated task (``relaxtune.bench.simulated``: accuracy, acceptance and
length surfaces over (knob, N), calibrated as stated there) is tuned per method
by three strategies, all through the product's ``Tuner`` with the simulation as
its ``evaluate_fn`` (so trials, stages, pruning, pairing with strict, the drop
bound, feasibility and ``choose`` are the product's own):

- search: the shipped search at its defaults (``TuneSettings``: trials, stage size,
  N in {3, 5, 10, 20}, the paper's grid first, then the sampler's points);
- grid: the paper's full grid, every grid knob at every N, each evaluated on every
  problem (one stage: no pruning);
- random: as many trials as the search, drawn uniformly from the same ranges
  (Optuna's ``RandomSampler``, no grid), evaluated as the search evaluates.

Model tokens count as the product counts them: the trials' tokens
(``relaxtune.tune.tuning.study_tokens``, pruned trials up to their last stage) plus
strict's baseline at every N the strategy used (``EvalResult.tokens``). After
each trial a strategy's pick is the product's choice so far (``choose``: fastest
feasible trial strict does not dominate) or, without one, strict at its fastest
evaluated N. Per run:

- tokens to reach the grid: tokens spent until the pick is at least as good as
  the grid's final pick in truth (true speed-up within ``TOLERANCE`` of it, and
  feasible when the grid's is); the grid itself picks only after its last point,
  so its figure is its total;
- regret: ``1 - S(pick) / S(best)``, true speed-ups, where ``best`` is the fastest
  truly feasible point of the whole search range (a dense scan of the knob at
  every N, strict included); an infeasible pick can score below 0;
- infeasible: the final pick's true drop exceeds epsilon.

Target (issue 14): the search reaches the grid's pick with at most 40 % of the
grid's tokens in at least 80 % of (task, method) runs. Every share is printed
with its 90 % Wilson interval over the runs (the benchmark's own noise).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from relaxtune.bench.results import Recorder, add_json_option, markdown
from relaxtune.bench.simulated import FAMILIES, GAINS, PAPER_N, SimPair, SimTask, Truth
from relaxtune.certify.stats import wilson_interval
from relaxtune.decoding.methods import get_method
from relaxtune.tune.result import JobResult
from relaxtune.tune.setting_groups import StatsSettings
from relaxtune.tune.settings import TuneSettings
from relaxtune.tune.tuning import Tuner, choose

__all__ = [
    "Run",
    "run_strategy",
    "oracle",
    "trace",
    "reached",
    "summarize",
    "STRATEGIES",
    "TARGET_SHARE",
    "TARGET_TOKENS",
    "TOLERANCE",
]

STRATEGIES = ("search", "grid", "random")
TARGET_TOKENS = 0.4  # share of the grid's tokens ...
TARGET_SHARE = 0.8  # ... within which the search reaches the grid's pick, in this share of runs
TOLERANCE = 0.01  # a pick within 1 % of the grid's true speed-up reaches it
SCAN = 200  # knob values per N of the truth's dense scan


class GridTuner(Tuner):
    """The paper's protocol: every grid knob at every N, each on every problem (no pruning)."""

    def grid_points(self, method: str) -> list[dict]:
        return [{"n_draft": n, "knob": k} for n in self.settings.n_drafts for k in get_method(method).grid]


class RandomTuner(Tuner):
    """Random search: no grid, points drawn uniformly (seeded per trial number)."""

    def grid_points(self, method: str) -> list[dict]:
        return []

    def sampler(self, method: str, number: int):
        import optuna

        return optuna.samplers.RandomSampler(seed=(self.settings.seed * 1_000_003 + number) % 2**32)


@dataclass
class Run:
    """One strategy on one (task, method, seed).

    Attributes:
        strategy, task, method, seed: what ran.
        tokens: model tokens spent in all (trials and strict baselines).
        steps: ``(tokens so far, pick)`` after each trial, in the order they ran
            (a pick is ``(knob, n_draft)``, knob None for strict).
        pick: the final pick; truth: its ``Truth``; trials: finished trials.
    """

    strategy: str
    task: str
    method: str
    seed: int
    tokens: int
    steps: list[tuple[int, tuple]]
    pick: tuple
    truth: Truth
    trials: int


class _Prefix:
    """A study's first trials, as ``choose`` reads a study."""

    def __init__(self, trials: list) -> None:
        self.trials = trials

    def get_trials(self, deepcopy: bool = False) -> list:
        return self.trials


def _pick(trials: list, stats: StatsSettings, strict: dict[int, tuple[float, float]]) -> tuple:
    """The product's choice among ``trials`` with strict known at the draft lengths of ``strict``;
    strict at its fastest N when no relaxed point is chosen or strict is faster."""
    chosen = choose(_Prefix(trials), stats, strict)
    n_strict = max(strict, key=lambda n: strict[n][0])
    if chosen is None or chosen.values[0] < strict[n_strict][0]:
        return None, n_strict
    return chosen.params["knob"], chosen.params["n_draft"]


def trace(result: JobResult, study) -> list[tuple[int, tuple]]:
    """``(tokens so far, pick)`` after each finished trial of ``study`` (``result``: the
    finished job, ``Tuner.result``; in trial-number
    order, the order one worker runs them): each trial's tokens (``metrics["tokens"]``),
    plus strict's baseline tokens when its N first appears."""
    out, tokens, seen, done = [], 0, set(), []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if t.state.name not in ("COMPLETE", "PRUNED"):
            continue
        n = t.params["n_draft"]
        if n not in seen:
            seen.add(n)
            tokens += result.baselines[n].tokens
        tokens += int(t.user_attrs.get("metrics", {}).get("tokens", 0))
        done.append(t)
        strict = {k: v for k, v in result.strict_points().items() if k in seen}
        out.append((tokens, _pick(done, result.stats, strict)))
    return out


def _settings(task: SimTask, method: str, seed: int, folder: str, **over) -> TuneSettings:
    fields = (
        dict(
            task=task.name,
            methods=[method],
            n_drafts=list(PAPER_N),
            c_rel=task.c_rel,
            epsilon=task.family.epsilon,
            seed=seed,
            storage=f"sqlite:///{folder}/optuna.db",
            output_dir=folder,
            heartbeat=3600,
        )
        | over
    )
    return TuneSettings(**fields)


def run_strategy(task: SimTask, method: str, strategy: str, seed: int, folder: str) -> Run:
    """Tune ``method`` on ``task`` with ``strategy`` (module doc), the Optuna storage being
    ``<folder>/optuna.db`` (SQLite; the study is named after the task, method, strategy and seed).

    Raises:
        ValueError: an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    over = {}
    if strategy == "grid":
        over = dict(trials=len(get_method(method).grid) * len(PAPER_N), stage_size=task.family.problems)
    settings = _settings(task, method, seed, folder, **over)
    cls = {"search": Tuner, "grid": GridTuner, "random": RandomTuner}[strategy]
    tuner = cls(
        settings,
        task.spec(),
        task.problems(),
        SimPair(f"{strategy}-seed{seed}"),
        task.c_rel,
        evaluate_fn=task,
        progress=False,
    )
    outcome = tuner.tune([method])[0]
    result = tuner.result([outcome])
    steps = trace(result, outcome.study)
    tokens = outcome.tokens + sum(b.tokens for b in result.baselines.values())
    assert steps and steps[-1][0] == tokens, "the trace must account for every token the product counted"
    pick = steps[-1][1]
    truth = _truth(task, method, pick)
    return Run(strategy, task.name, method, seed, tokens, steps, pick, truth, len(steps))


def _truth(task: SimTask, method: str, pick: tuple) -> Truth:
    """The truth of a pick ``(knob, n_draft)`` (knob None: strict)."""
    return task.truth(method if pick[0] is not None else None, pick[0], pick[1])


def oracle(task: SimTask, method: str) -> Truth:
    """The fastest truly feasible point of the method's search range (``SCAN`` knob values
    per N, the strict point and the grid's knobs included) or strict at its fastest N."""
    spec = get_method(method)
    low, high, log = spec.search
    knobs = np.geomspace(low, high, SCAN) if log else np.linspace(low, high, SCAN)
    best = max((task.truth(None, None, n) for n in PAPER_N), key=lambda t: t.speedup)
    for n in PAPER_N:
        for k in [*knobs, *spec.grid]:
            t = task.truth(method, float(k), n)
            if t.drop <= task.family.epsilon and t.speedup > best.speedup:
                best = t
    return best


def reached(pick: Truth, target: Truth, epsilon: float) -> bool:
    """``pick`` is at least as good as ``target`` in truth: within ``TOLERANCE`` of its
    speed-up, and feasible when ``target`` is."""
    feasible = lambda t: t.drop <= epsilon  # noqa: E731
    return pick.speedup >= (1.0 - TOLERANCE) * target.speedup and (feasible(pick) or not feasible(target))


def _job(item: tuple[str, int, str, int, str]) -> dict:
    """All strategies on one (family, task seed, method, run seed) in the worker's storage."""
    family, task_seed, method, seed, folder = item
    task = SimTask.draw(family, task_seed, tuple(GAINS))
    folder = os.path.join(folder, f"worker-{os.getpid()}")
    os.makedirs(folder, exist_ok=True)
    runs = {s: run_strategy(task, method, s, seed, folder) for s in STRATEGIES}
    best, grid = oracle(task, method), runs["grid"]
    out = {
        "family": family,
        "task": task.name,
        "method": method,
        "seed": seed,
        "c_rel": task.c_rel,
        "epsilon": task.family.epsilon,
        "best": best.speedup,
    }
    for name, run in runs.items():
        to_reach = (
            grid.tokens
            if name == "grid"
            else next(
                (
                    tok
                    for tok, pick in run.steps
                    if reached(_truth(task, method, pick), grid.truth, task.family.epsilon)
                ),
                None,
            )
        )
        out[name] = {
            "tokens": run.tokens,
            "to_reach": to_reach,
            "regret": 1.0 - run.truth.speedup / best.speedup,
            "infeasible": run.truth.drop > task.family.epsilon,
            "pick": run.pick,
            "trials": run.trials,
            "speedup": run.truth.speedup,
        }
    return out


def _share(k: int, n: int) -> str:
    lo, hi = wilson_interval(k, n, 0.9)
    return f"{k / n:.0%} ({lo:.0%}-{hi:.0%})"


def _reach_ratio(result: dict, strategy: str) -> float:
    """Tokens the strategy spent until it reached the grid's pick, over the grid's tokens (inf: never)."""
    to_reach = result[strategy]["to_reach"]
    return math.inf if to_reach is None else to_reach / result["grid"]["tokens"]


def summary_table(results: list[dict]) -> tuple[list[str], list[list[str]], str]:
    """The table's columns and rows (one per strategy), and the target line."""
    n = len(results)
    grid_mean = statistics.mean(r["grid"]["tokens"] for r in results)
    columns = [
        "strategy",
        "model tokens, mean (M)",
        "vs grid",
        "tokens to reach the grid's pick / grid's, median",
        f"reached within {TARGET_TOKENS * 100:g} % (90 % CI)",
        "regret, median / p90",
        "infeasible picks (90 % CI)",
    ]
    rows = []
    for s in STRATEGIES:
        mean = statistics.mean(r[s]["tokens"] for r in results)
        ratios = [_reach_ratio(r, s) for r in results]
        med = statistics.median(ratios)
        regret = sorted(r[s]["regret"] for r in results)
        rows.append(
            [
                s,
                f"{mean / 1e6:.1f}",
                f"{mean / grid_mean:.2f}",
                "never" if math.isinf(med) else f"{med:.2f}",
                _share(sum(x <= TARGET_TOKENS for x in ratios), n),
                f"{statistics.median(regret):.1%} / {regret[min(n - 1, int(0.9 * n))]:.1%}",
                _share(sum(r[s]["infeasible"] for r in results), n),
            ]
        )
    within = sum(_reach_ratio(r, "search") <= TARGET_TOKENS for r in results)
    verdict = "met" if within / n >= TARGET_SHARE else "MISSED"
    target = (
        f"target: the search reaches the grid's pick with <= {TARGET_TOKENS:.0%} of the grid's tokens in "
        f"{within} of {n} runs ({_share(within, n)}); wanted >= {TARGET_SHARE:.0%}: {verdict}"
    )
    return columns, rows, target


def summarize(results: list[dict]) -> list[str]:
    """The table's lines and the target line (markdown)."""
    columns, rows, target = summary_table(results)
    return [*markdown(columns, rows).splitlines(), "", target]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tasks", type=int, default=5, help="simulated tasks per family (45 runs: a few minutes on 2 cores)"
    )
    ap.add_argument("--families", default=",".join(FAMILIES), help="task families, comma separated")
    ap.add_argument("--methods", default=",".join(GAINS), help="methods, comma separated")
    ap.add_argument("--seeds", type=int, default=1, help="search seeds per (task, method)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--quick", action="store_true", help="2 tasks per family")
    add_json_option(ap)
    args = ap.parse_args(argv)
    rec = Recorder("tuning", "Tuning efficiency on simulated tasks", argv)
    tasks = 2 if args.quick else args.tasks
    families, methods = args.families.split(","), args.methods.split(",")
    for f in families:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}; known: {', '.join(FAMILIES)}")
    for m in methods:
        if m not in GAINS:
            ap.error(f"no simulated surfaces for {m!r}; simulated methods: {', '.join(GAINS)}")
    folder = tempfile.mkdtemp(prefix="relaxtune-bench-tuning-")
    items = [
        (f, t, m, 1000 * t + s, folder)
        for f in families
        for t in range(tasks)
        for m in methods
        for s in range(args.seeds)
    ]
    print(
        f"tuning benchmark: {len(items)} runs ({tasks} task(s) per family x {len(families)} families x "
        f"{len(methods)} methods x {args.seeds} seed(s)), {args.jobs} process(es); work in {folder}",
        flush=True,
    )
    start, results = time.perf_counter(), []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, r in enumerate(pool.map(_job, items), 1):
            results.append(r)
            s, g = r["search"], r["grid"]
            reach = "never" if s["to_reach"] is None else f"{s['to_reach'] / g['tokens']:.2f}"
            print(
                f"  [{i}/{len(items)}] {r['task']} {r['method']} (c_rel {r['c_rel']:g}): grid pick {g['pick']} "
                f"S {g['speedup']:.2f}; search pick {s['pick']} S {s['speedup']:.2f}, reached at {reach} of the "
                f"grid's tokens; best S {r['best']:.2f}",
                flush=True,
            )
    print(f"\n{len(results)} runs in {time.perf_counter() - start:.0f} s\n")
    print("\n".join(summarize(results)))
    columns, rows, target = summary_table(results)
    rec.table(
        f"tuning efficiency: {len(items)} runs ({tasks} simulated task(s) per family x {len(families)} families x "
        f"{len(methods)} methods x {args.seeds} seed(s))",
        columns,
        rows,
        [target],
        show=False,
    )
    rec.write(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
