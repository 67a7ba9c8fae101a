"""Transfer matrix: does a relaxation tuned on one task hold on another?

For tasks with tuned configs (``relaxtune tune``), each method's confirmed point
(method, knob, N) of every source task S is judged on every target task T,
against T's strict at the same N, paired on the same problems and seeds
(common random numbers), with the metrics and constraint of a tuning trial
(``relaxtune.tune.judge.point_metrics`` and ``constraint_values``: the drop bound
``relaxtune.certify.stats.drop_bound`` against T's epsilon, plus T's rambling guards)
at a confirmation's confidence (below). The diagonal is each task's own point.

Samples (``relaxtune.tune.confirm.fresh_point``; ``evaluate`` skips finished
samples, so every record that exists is reused and none is generated twice):

- off the diagonal, T's search samples (T's search problems and base seed). S's
  point was chosen on S's samples alone, so T's are fresh for it; T's strict at
  N is the search's baseline (read back when T's search ran that N), and a
  point T's search also tried is read back whole;
- on the diagonal, the samples of T's passed confirmation (fresh seeds, or the
  held-out half): T's search samples chose T's point and would flatter it; the
  confirmation's records exist, so the diagonal generates nothing.

Confidence split (Bonferroni, as for confirmations): the cells are fixed before
any is evaluated, K = sum over methods of (sources with a confirmed point) x
(targets), and each is judged at one-sided ``1 - (1 - c) / K``, so with
confidence c every cell marked within epsilon holds at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..decoding.methods import get_method
from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile
from ..report.config_schema import TunedConfig
from ..report.export import load_config
from ..tasks.spec import Problem, TaskSpec, load_problems, load_task
from ..tune.confirm import fresh_point, holdout_split, split_confidence
from ..tune.judge import constraint_values
from ..tune.pareto import point_label
from ..tune.point_records import DecodeConfig
from ..tune.settings import TuneSettings
from .matrix import RULE, Cell, TransferMatrix, sections, write_sections

__all__ = [
    "TransferError",
    "TunedTask",
    "Cell",
    "TransferMatrix",
    "load_tuned",
    "tuned_point",
    "plan_cells",
    "evaluate_cells",
    "run_transfer",
    "RULE",
]


class TransferError(ValueError):
    """The transfer cannot run as asked (the message says why and what to do)."""


@dataclass(frozen=True)
class TunedTask:
    """A task with a tuned config, as the transfer reads it.

    Attributes:
        spec: the task; config: its tuned config; path: the config's file.
        settings: the tuning run's settings that judge a point on this task (epsilon,
            rambling guards) and locate its samples (seed, problems, output folder).
        search: the problems its search ran on (off-diagonal cells);
        confirm: those its confirmations ran on (the diagonal).
        profile: the costs its trials were priced with (``ServingProfile``, weighted as
            they were priced, or c_rel).
    """

    spec: TaskSpec
    config: TunedConfig
    path: Path
    settings: TuneSettings
    search: list[Problem] = field(repr=False)
    confirm: list[Problem] = field(repr=False)
    profile: ServingProfile | float


def load_tuned(task: str, output_dir: str | Path) -> TunedTask:
    """Read a task's tuned config and the settings of its tuning run from
    ``output_dir`` (``<task>.tuned.yaml``, or the ``export`` path its
    ``<task>.job.yaml`` names); the config decides the samples (seed, problems,
    confirmation), the job file adds the rambling guards and SGLang servers.

    Raises:
        TransferError: no tuned config, one that does not validate, one tuned for
            another version of the task, or a task whose problems changed since.
        FileNotFoundError / ValueError: an unknown or invalid task.
    """
    from ..report.reexport import job_file

    spec = load_task(task)
    saved = job_file(output_dir, spec.name)
    try:
        job = yaml.safe_load(saved.read_text()) if saved.exists() else None
    except yaml.YAMLError:  # a damaged job file: the config alone decides, without guards
        job = None
    job = job if isinstance(job, dict) else {}
    path = Path(job.get("export") or Path(output_dir) / f"{spec.name}.tuned.yaml")
    if not path.exists():
        raise TransferError(
            f"no tuned config for {spec.name} at {path}: run `relaxtune tune --task {task} "
            f"--output-dir {output_dir}` first"
        )
    try:
        config = load_config(path)
    except ValueError as err:
        raise TransferError(
            f"{path} is not a tuned config of this relaxtune ({err}); re-export it with `relaxtune export`"
        ) from None
    if config.task_version != spec.version:
        raise TransferError(
            f"{path} was tuned for {spec.name} v{config.task_version}, the task is now "
            f"v{spec.version}: run `relaxtune tune --task {task}` again"
        )
    holdout = config.confirmation.get("samples") == "holdout"
    limit = config.problems + (config.confirmation["problems"] if holdout else 0)
    everything = load_problems(spec, limit)
    search, held = holdout_split(everything, config.seed) if holdout else (everything, everything)
    if len(search) != config.problems:
        raise TransferError(
            f"{spec.name} has {len(everything)} problems now, its tuned config ran on "
            f"{config.problems}{' (search half)' if holdout else ''}: its data changed; re-tune it"
        )
    keep = {
        k: job[k]
        for k in (
            "max_length_ratio",
            "max_truncated",
            "drafter_url",
            "verifier_url",
            "tokenizer",
            "native_url",
            "concurrency",
        )
        if job.get(k) is not None
    }
    settings = TuneSettings(
        task=task,
        epsilon=config.epsilon,
        confidence=config.confidence,
        seed=config.seed,
        limit=limit,
        confirm="holdout" if holdout else "seeds",
        drafter=config.drafter,
        verifier=config.verifier,
        dtype=config.dtype or "bfloat16",  # None: a llama.cpp run (its GGUF files, no dtype); the default
        output_dir=str(output_dir),
        **keep,
    )
    profile = ServingProfile.from_dict(config.cost_profile) if config.cost_profile else config.c_rel
    return TunedTask(spec, config, path, settings, search, held, profile)


def tuned_point(config: TunedConfig, method: str) -> DecodeConfig | None:
    """The method's confirmed point, whole (alpha, N, the further named knobs that differ
    from alpha's view and the relaxation scope: ``DecodeConfig``), with the base seed of the
    confirmation it passed as its seed; None when the config confirmed none."""
    result = config.methods.get(method)
    if result is None or not result.feasible:
        return None
    passed = [a for a in (result.confirmation or {}).get("attempts", []) if a.get("passed")]
    if not passed:
        return None
    extra = () if result.knob is None else get_method(method).extra_of(result.knob, result.knobs or {}, result.n_draft)
    return DecodeConfig(method, result.knob, result.n_draft, passed[-1]["seed"], result.scope or "all", extra)


def plan_cells(tuned: dict[str, TunedTask], methods: list[str]) -> list[tuple[str, str, str]]:
    """``(method, source, target)`` of every cell to judge: every source with a
    confirmed point of the method, on every task (its own included)."""
    return [(m, s, t) for m in methods for s in tuned if tuned_point(tuned[s].config, m) is not None for t in tuned]


def _profile(target: TunedTask, source: TunedTask, n_draft: int) -> ServingProfile | float:
    """The target's costs; a round cost at a draft length the target never measured
    comes from the source's profile (same pair and machine) at the same batch size,
    when it has it."""
    mine, theirs = target.profile, source.profile
    if not (isinstance(mine, ServingProfile) and isinstance(theirs, ServingProfile)):
        return mine
    k = n_draft + 1
    profiles = dict(mine.profiles)
    for b, p in mine.profiles.items():
        other = theirs.profiles.get(b)
        if k not in p.t_verify and other is not None and k in other.t_verify:
            profiles[b] = CostProfile(
                p.t_ar, p.t_draft, {**p.t_verify, k: other.t_verify[k]}, p.source, batch_size=p.batch_size
            )
    return ServingProfile(profiles, mine.weights)


def evaluate_cells(
    tuned: dict[str, TunedTask],
    methods: list[str],
    confidence: float,
    backend,
    *,
    evaluate_fn: Callable | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda message: None,
) -> TransferMatrix:
    """Judge every cell of ``plan_cells`` (module doc: samples and confidence split).

    Args:
        tuned: task name -> ``TunedTask`` (rows and columns in this order).
        methods: one matrix each; confidence: the family's, in (0, 1).
        backend: the model pair every config was tuned with.
        evaluate_fn: evaluation override with ``relaxtune.tune.evaluation.evaluate``'s signature.
        log: one line per cell.

    Returns:
        ``TransferMatrix``. A cell whose evaluation raises keeps the error and is
        not within epsilon; the others still run.
    """
    planned = plan_cells(tuned, methods)
    level = split_confidence(confidence, len(planned))
    cells = []
    for i, (method, source, target) in enumerate(planned, 1):
        src, tgt = tuned[source], tuned[target]
        point = tuned_point(src.config, method)
        knob, n_draft, confirm_seed = point.knob, point.n_draft, point.seed
        diagonal = source == target
        problems, seed = (tgt.confirm, confirm_seed) if diagonal else (tgt.search, tgt.config.seed)
        cell = Cell(
            method,
            source,
            target,
            knob,
            n_draft,
            "confirmation" if diagonal else "search",
            seed,
            len(problems),
            tgt.config.epsilon,
            level,
        )
        try:
            cell.metrics, _, _ = fresh_point(
                tgt.spec,
                backend,
                method,
                knob,
                n_draft,
                problems,
                seed,
                profile=_profile(tgt, src, n_draft),
                confidence=level,
                output_dir=tgt.settings.output_dir,
                evaluate_fn=evaluate_fn,
                progress=progress,
                extra=point.extra,
                scope=point.scope,
            )
            judge = tgt.settings.stats.model_copy(update={"confidence": level})  # the statistics group alone
            cell.within = all(v <= 0 for v in constraint_values(cell.metrics, judge).values())
        except Exception as err:
            cell.error = f"{type(err).__name__}: {err}"
        label = point_label(method, src.config.methods[method].knob_name, knob, n_draft, dict(point.extra))
        head = f"[{i}/{len(planned)}] {label}: {source} -> {target} ({cell.samples} samples)"
        if cell.error:
            log(f"{head}: FAILED ({cell.error})")
        else:
            m = cell.metrics
            log(
                f"{head}: accuracy {m['accuracy']:.3f} vs strict {m['strict_accuracy']:.3f} (n={m['n']}), drop <= "
                f"{m['drop_ucb']:.3f} at {level:.1%}, epsilon {cell.epsilon:g}: "
                + ("within" if cell.within else "OVER")
                + f", speed-up {m['speedup']:.2f}"
            )
        cells.append(cell)
    configs = [(name, t.config.task_version, t.config.created) for name, t in tuned.items()]
    pair = getattr(backend, "name", "backend")
    ident = json.dumps({"tasks": configs, "methods": methods, "confidence": confidence, "pair": pair})
    key = f"transfer-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"
    return TransferMatrix(list(tuned), list(methods), confidence, level, cells, pair, key)


def _methods(tuned: dict[str, TunedTask], methods: list[str] | None) -> list[str]:
    """The methods to judge: those given, else every method some config confirmed.

    Raises:
        TransferError: a method no config confirmed a point for, or none at all.
    """
    from ..decoding.methods import get_method

    confirmed = list(
        dict.fromkeys(m for t in tuned.values() for m in t.config.methods if tuned_point(t.config, m) is not None)
    )
    for m in methods or []:
        get_method(m)
        if m not in confirmed:
            raise TransferError(
                f"no task has a confirmed point for {m} (confirmed: {', '.join(confirmed) or 'none'}): "
                "tune it, or leave it out of --methods"
            )
    if not confirmed:
        raise TransferError(
            "no task has a confirmed point for any method, so no setting can transfer: tune with more "
            "problems (--limit) or a larger --epsilon (see `relaxtune plan`)"
        )
    return list(methods or confirmed)


def run_transfer(
    tasks: list[str],
    methods: list[str] | None = None,
    confidence: float | None = None,
    *,
    output_dir: str | Path = "relaxtune-runs",
    mlflow_uri: str | None = None,
    backend=None,
    evaluate_fn: Callable | None = None,
    progress: bool = True,
    track: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[TransferMatrix, list[Path]]:
    """The transfer matrix of ``tasks`` end to end: read their tuned configs, judge
    every cell, log the table and figure to MLflow (``relaxtune.transfer.tracking``),
    write each config's ``transfer`` section.

    Args:
        tasks: at least two task names or YAML paths, each tuned in ``output_dir``.
        methods: default every method some config confirmed a point for.
        confidence: the family's one-sided confidence; default the highest of the configs'.
        backend: the model pair (default: loaded from the first task's tuning settings).
        evaluate_fn: evaluation override (the Prefect flow's task); track: log to MLflow.

    Returns:
        ``(matrix, configs written)``.

    Raises:
        TransferError: fewer than two tasks, a task given twice, configs tuned with
            different model pairs, every cell failed, or as ``load_tuned`` and the
            method check.
    """
    from ..backends.load import load_backend

    tuned: dict[str, TunedTask] = {}
    for task in tasks:
        t = load_tuned(task, output_dir)
        if t.spec.name in tuned:
            raise TransferError(f"task {t.spec.name} is given twice")
        tuned[t.spec.name] = t
    if len(tuned) < 2:
        raise TransferError("a transfer needs at least two tasks (--tasks A,B)")
    pairs = {(t.config.drafter, t.config.verifier, t.config.dtype) for t in tuned.values()}
    if len(pairs) > 1:
        raise TransferError(
            "the tuned configs come from different model pairs ("
            + "; ".join(f"{n}: {t.config.drafter} -> {t.config.verifier} ({t.config.dtype})" for n, t in tuned.items())
            + "): a transfer compares tasks on one pair; tune them all with the same --drafter, --verifier, --dtype"
        )
    methods = _methods(tuned, methods)
    if confidence is None:
        confidence = max(t.config.confidence for t in tuned.values())
    if not 0 < confidence < 1:
        raise TransferError(f"confidence must be in (0, 1), got {confidence}")
    cells = plan_cells(tuned, methods)
    log(
        f"{len(cells)} cells ({', '.join(methods)}: each source's confirmed point on every task), each judged at "
        f"{split_confidence(confidence, len(cells)):.2%} one-sided"
    )
    if backend is None:
        first = next(iter(tuned.values())).settings
        log(f"loading {first.drafter} -> {first.verifier} (generates only samples not recorded yet)")
        backend = load_backend(**first.backend)
    matrix = evaluate_cells(tuned, methods, confidence, backend, evaluate_fn=evaluate_fn, progress=progress, log=log)
    if all(c.error for c in matrix.cells):  # e.g. servers down: keep the sections and runs of the last transfer
        raise TransferError(f"every cell failed (the first: {matrix.cells[0].error}): nothing logged or written")
    runs = None
    if track:
        from .tracking import log_transfer

        runs = log_transfer(matrix, mlflow_uri)
    return matrix, write_sections(tuned, sections(matrix, runs), log)
