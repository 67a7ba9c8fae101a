"""What an export (``relaxtune export``: a finished job judged again, no new trials)
reads and where it writes, checked before any model loads: the tuning run's
settings, the file the export writes (never the tuning run's own), and what it
must find (the Optuna storage, each method's finished trials on as many
problems, the cost profile, strict's records). ``relaxtune.job`` runs it.

``relaxtune export --cost-profile FILE`` re-prices a finished job with a cost table
measured on the serving host (``read_cost_profile``, ``reprice``): strict's and every
confirmed point's modeled speed-ups are recomputed from their stored acceptance, lengths
and N, so the recommendation and the best point per batch size are chosen again for the
serving host. The search itself (which points were tried, chosen and confirmed) rests on
the tuning run's prices and cannot be re-priced without running it again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import yaml

from ..decoding.serving import ServingProfile
from ..decoding.speed import c_rel_of
from ..tune.batches import Prices, strict_speedup
from ..tune.job_identity import study_name
from ..tune.point_records import DecodeConfig, records_complete, records_path
from ..tune.records import trial_metrics
from ..tune.settings import TuneSettings

__all__ = [
    "JobError",
    "job_file",
    "tuning_settings",
    "export_path",
    "export_storage",
    "check_exportable",
    "same_problems",
    "check_outcomes",
    "save_job",
    "read_cost_profile",
    "check_cost_profile",
    "reprice",
]


class JobError(ValueError):
    """The job cannot go on as asked (the message says why and what to do)."""


def job_file(output_dir: str | Path, task: str) -> Path:
    """``<output_dir>/<task>.job.yaml``: the settings of the last tuning run,
    which ``relaxtune export`` starts from."""
    return Path(output_dir) / f"{task}.job.yaml"


def tuning_settings(output_dir: str | Path, task: str) -> TuneSettings | None:
    """The settings of the task's last tuning run (``job_file``), or None when there
    is none (or it no longer validates)."""
    import pydantic

    saved = job_file(output_dir, task)
    try:
        return TuneSettings(**yaml.safe_load(saved.read_text())) if saved.exists() else None
    except (pydantic.ValidationError, yaml.YAMLError, TypeError):
        return None


def export_path(settings: TuneSettings, spec, tuning: TuneSettings | None) -> Path:
    """Where an export writes its config: ``settings.export``, else
    ``<output_dir>/<task>.tuned.eps<epsilon>.yaml`` with ``.conf<c>``, ``.lr<r>``,
    ``.trunc<t>`` and ``.<methods>`` before ``.yaml`` for each judging setting that
    differs from the tuning run's ``tuning`` (defaults when unknown), so exports with
    different budgets never overwrite each other.

    Raises:
        JobError: the path is the tuning run's own config (an export never overwrites it).
    """
    base = tuning or TuneSettings(task=settings.task)
    parts = [f"eps{settings.epsilon:g}"]
    for key, short in (("confidence", "conf"), ("max_length_ratio", "lr"), ("max_truncated", "trunc")):
        if getattr(settings, key) != getattr(base, key):
            parts.append(f"{short}{getattr(settings, key)}")
    if sorted(settings.methods) != sorted(base.methods):
        parts.append("+".join(settings.methods))
    output = Path(settings.output_dir)
    path = Path(settings.export) if settings.export else output / f"{spec.name}.tuned.{'.'.join(parts)}.yaml"
    tuned = Path(base.export) if tuning is not None and tuning.export else output / f"{spec.name}.tuned.yaml"
    if path.resolve() == tuned.resolve():
        raise JobError(
            f"--export {path} is the tuning run's own config: an export never overwrites it; give "
            "another path, or leave --export out (default: <output-dir>/<task>.tuned.eps<epsilon>.yaml)"
        )
    return path


def export_storage(settings: TuneSettings, spec) -> str:
    """The Optuna storage URL an export reads, checked without loading the task's
    problems (an export in a folder no tuning run wrote to refuses at once), and
    the export's own file (``export_path``).

    Raises:
        JobError: no sqlite storage file there, or ``--export`` is the tuning run's config.
    """
    output = Path(settings.output_dir)
    export_path(settings, spec, tuning_settings(output, spec.name))
    url = settings.storage or f"sqlite:///{(output / 'optuna.db').resolve()}"
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise JobError(
            f"nothing to export: no Optuna storage at {url.removeprefix('sqlite:///')} (no tuning run "
            f"wrote to --output-dir {output}); run `relaxtune tune --task {spec.name}` first, or give the "
            "tuning run's --output-dir or --storage"
        )
    return url


def check_exportable(settings: TuneSettings, spec, problems, pair: str) -> None:
    """Refuse an export before any model loads when there is nothing to export,
    naming what is missing: the Optuna storage, each method's study and its
    finished trials (on as many problems as asked), the tuning run's cost profile
    (``--c-rel measured``), strict's records at every draft length the trials
    used; or an ``--export`` path that is the tuning run's own config.

    Raises:
        JobError: what is missing, and what to do.
    """
    import optuna

    output = Path(settings.output_dir)
    url = export_storage(settings, spec)
    names = optuna.study.get_all_study_names(storage=url)
    missing, used = [], set()
    for method in settings.methods:
        name = study_name(spec.name, method, pair, spec.version, settings.relaxation_scope)
        pinned = method == "sglang_threshold" and settings.native_url  # the study name holds the server's point
        studies = [
            optuna.load_study(study_name=n, storage=url)
            for n in names
            if n == name or (pinned and n.startswith(f"{name}@"))
        ]
        done = [
            t
            for study in studies
            for t in study.get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
            )
        ]
        for study in studies:
            same_problems(method, study, problems)
        used |= {t.params["n_draft"] for t in done}
        if not done:
            missing.append(f"{method} (study {name} {'holds no finished trial' if studies else 'does not exist'})")
    if missing:
        others = sorted(n for n in names if n.split("__")[0] in (spec.name, f"{spec.name}-v{spec.version}"))
        raise JobError(
            f"nothing to export for {'; '.join(missing)}: run `relaxtune tune` for them first (the same "
            "--drafter, --verifier and --dtype), or export only the tuned --methods"
            + (f"; studies of {spec.name} there: {', '.join(others)}" if others else "")
        )
    if settings.c_rel == "measured" and not settings.verifier_url:
        saved = records_path(output, spec, DecodeConfig(), pair).with_name("cost_profile.json")
        if not saved.exists():
            raise JobError(
                f"no saved cost profile at {saved}: an export prices with the tuning run's costs; give "
                "its --c-rel or run `relaxtune tune`"
            )
    for n in sorted(used):
        if not records_complete(output, spec, DecodeConfig("strict", None, n, settings.seed), pair, problems):
            raise JobError(
                f"export found no complete strict records at N={n} for these {len(problems)} problems "
                f"(seed {settings.seed}): export with the tuning run's --limit and --seed, or run "
                "`relaxtune tune`"
            )


def same_problems(method: str, study, problems) -> None:
    """Refuse an export over another number of problems than the study's trials saw."""
    used = study.user_attrs.get("problems")
    if used is not None and used != len(problems):
        raise JobError(
            f"{method}'s trials ran on {used} problems, this export asks for {len(problems)}: "
            "export with the tuning run's --limit"
        )


def check_outcomes(outcomes, problems, profile, n_drafts: list[int], pinned: set[str]) -> None:
    """An export re-judges what the studies hold (``outcomes``, priced with
    ``profile``); refuse what would mix runs. Methods in ``pinned`` (a native
    server's, whose N comes from its launch flags) may have any N.

    Raises:
        JobError: a method without finished trials, trials run on another number
            of problems or at draft lengths ``n_drafts`` leaves out, or a c_rel
            other than the one the trials were priced with.
    """
    for o in outcomes:
        done = [t for t in o.study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
        other = sorted({t.params["n_draft"] for t in done} - set(n_drafts))
        if other and o.method not in pinned:  # a native server's N comes from its launch flags
            raise JobError(
                f"{o.method}'s trials ran at N={', '.join(map(str, other))}, which --n-drafts "
                f"{','.join(map(str, n_drafts))} leaves out: export with the tuning run's --n-drafts"
            )
        if not done:
            raise JobError(
                f"study {o.study.study_name} holds no finished trial: run `relaxtune tune` for {o.method} "
                "first, or export only the tuned --methods"
            )
        same_problems(o.method, o.study, problems)
        priced = {round(m.c_rel, 9) for t in done if (m := trial_metrics(t, o.method)) is not None}
        if priced and priced != {round(c_rel_of(profile), 9)}:
            raise JobError(
                f"{o.method}'s trials were priced at c_rel {', '.join(f'{c:.3f}' for c in sorted(priced))}, "
                f"this export at {c_rel_of(profile):.3f}: an export cannot re-price the search's trials (which "
                "points were chosen and confirmed rests on their prices); tune again with the new --c-rel, or "
                "re-price the confirmed points with `relaxtune export --cost-profile FILE` and the tuning run's --c-rel"
            )


def save_job(output_dir: str | Path, task: str, settings: dict) -> Path:
    """Write ``settings`` (the tuning run's, less one-off actions) to ``job_file``, atomically:
    workers may share the folder. Returns the path."""
    saved = job_file(output_dir, task)
    saved.parent.mkdir(parents=True, exist_ok=True)
    tmp = saved.with_name(f"{saved.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(yaml.safe_dump({k: v for k, v in settings.items() if k != "remeasure_costs"}, sort_keys=False))
    os.replace(tmp, saved)
    return saved


def read_cost_profile(path: str | Path) -> ServingProfile:
    """The cost table in ``path`` (JSON): a ``ServingProfile.to_dict`` (``relaxtune costs``
    on the serving host), or a single ``CostProfile.to_dict`` (a profile saved before batch
    sizes: ``cost_profile.json`` of a job's output folder), read as batch size 1.

    Raises:
        JobError: the file is missing or unreadable, not JSON, or not a cost profile (the
            message names the file and what is wrong).
    """
    import json

    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise JobError(f"--cost-profile {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise JobError(f"--cost-profile {path}: cannot read it ({err})") from None
    except json.JSONDecodeError as err:
        raise JobError(f"--cost-profile {path}: not JSON ({err})") from None
    give = "give the JSON that `relaxtune costs` writes, or a job's cost_profile.json"
    try:
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
        if (lacking := _lacking_field(raw)) is not None:
            raise JobError(f"--cost-profile {path}: not a cost profile: it lacks the field {lacking}; {give}")
        return ServingProfile.from_dict(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        said = err.args[0] if isinstance(err, KeyError) and err.args else err
        raise JobError(f"--cost-profile {path}: not a cost profile ({said}); {give}") from None


PROFILE_FIELDS = ("t_ar", "t_draft")  # what every batch size's cost profile holds (t_verify may be empty)


def _lacking_field(raw: dict) -> str | None:
    """The first of ``PROFILE_FIELDS`` a cost table lacks, in words (``'t_draft' at batch
    size 16``, or ``'t_draft'`` for a single profile); None when none is lacking."""
    tables = raw.get("batch_sizes")
    if tables is None:
        return next((repr(f) for f in PROFILE_FIELDS if f not in raw), None)
    if not isinstance(tables, dict) or not tables:
        return "'batch_sizes' (batch size -> cost profile; it is empty or not an object)"
    for b, table in tables.items():
        missing = [f for f in PROFILE_FIELDS if not isinstance(table, dict) or f not in table]
        if missing:
            return f"{missing[0]!r} at batch size {b}"
    return None


def check_cost_profile(profile: ServingProfile, n_drafts, weights, source: str | Path) -> None:
    """Refuse a serving host's cost table that cannot price a job: no profile at a batch
    size the job declares or weighs (``weights``: batch size -> weight), or, at some batch
    size, verify times that leave out N + 1 for a draft length N in ``n_drafts`` (the
    model would price that round as one AR step). Needs only the job's settings, so the
    export checks it before anything loads.

    Raises:
        JobError: naming the file, the batch size and what to measure.
    """
    missing = sorted(set(weights) - set(profile.batch_sizes))
    if missing:
        raise JobError(
            f"--cost-profile {source}: no cost profile at serving batch size {', '.join(map(str, missing))}, "
            f"which the job declares (measured there: {', '.join(map(str, profile.batch_sizes))}); measure it "
            "with `relaxtune costs --serving-batch-sizes ...` including that batch size"
        )
    for b, p in profile.profiles.items():
        lacking = [n for n in sorted(n_drafts) if p.t_verify and n + 1 not in p.t_verify]
        if lacking:
            raise JobError(
                f"--cost-profile {source}: at batch size {b} it times verify(k) for k = "
                f"{', '.join(map(str, sorted(p.t_verify)))} but not k = N + 1 for N = {', '.join(map(str, lacking))}, "
                "where the job's points run: measure it with the job's --n-drafts"
            )


def reprice(result, profile: ServingProfile, source: str | Path) -> tuple[object, dict]:
    """``result`` (a finished ``relaxtune.tune.result.JobResult``) priced with ``profile``,
    the costs of a serving host, weighted as the job declared (its batch size, or its
    weighting: ``relaxtune.tune.batches.Prices``): strict's speed-ups recomputed at every
    evaluated N; the export (``relaxtune.report.export.build_config``) then prices each
    confirmed (and closest) point from its stored acceptance and lengths, and chooses the
    recommendation and ``by_batch_size`` again.

    Returns:
        ``(result, costs)``: the re-priced result, and what the config's ``cost_profile``
        says about it (``source``, ``repriced``, ``tuning_c_rel``, ``where``).

    Raises:
        JobError: ``profile`` has no cost profile at a batch size the job declares or
            weighs, or, at some batch size, verify times that leave out N + 1 for an
            evaluated draft length N (the model would price that round as one AR step).
    """
    import dataclasses
    import hashlib

    weights = dict(Prices.of(result.profile).weights)
    check_cost_profile(profile, result.baselines, weights, source)
    profile = profile.reweighted(weights)
    old = c_rel_of(result.profile)
    repriced = dataclasses.replace(
        result,
        profile=profile,
        strict_speedups={n: strict_speedup(profile, b.l_accept, n) for n, b in result.baselines.items()},
    )
    try:
        digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16]
        named = f"{source} (sha256 {digest}), re-priced by `relaxtune export --cost-profile`"
    except OSError:
        named = f"{source}, re-priced by `relaxtune export --cost-profile`"
    costs = {
        "source": named,
        "repriced": (
            "strict's and each confirmed (and closest) point's modeled speed-ups, from their stored acceptance, "
            "lengths and N; the speed margin, the recommendation and by_batch_size. The search's trials, which "
            "points it chose and confirmed, and each confirmation attempt keep the tuning run's prices "
            f"(c_rel {old:.4g})"
        ),
        "tuning_c_rel": old,
        "where": f"on the serving host that measured {Path(source).name}",
    }
    return repriced, costs
