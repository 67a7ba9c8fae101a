"""The main job, end to end: load task and models, measure costs, run every
method's study, log to MLflow, export the tuned config. The CLI (``relaxtune
tune``) and the Prefect flow (``flows/tune.py``) both call ``run_tune_job``."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

import yaml

from .confirm import confirm, holdout_split
from .evaluation import DecodeConfig, check_spec_unchanged, records_path
from .export import TunedConfig, build_config, save_config
from .methods import get_method
from .reexport import JobError, check_exportable, export_path, export_storage, job_file, same_problems, tuning_settings
from .speed import COST_MARGIN, CostProfile, c_rel_of
from .tasks import build_prompt_ids, load_problems, load_task
from .settings import TuneSettings, job_id, study_name
from .tuning import Tuner, choose

__all__ = ["run_tune_job", "prepare", "load_backend", "backend_name", "job_file", "tuning_settings", "export_path",
           "check_exportable", "JobError", "cost_profile", "cautions"]


def prepare(settings: TuneSettings, backend=None, new_trials: bool = True):
    """Validate and load everything before any generation: the task, for an
    export its Optuna storage (``export_storage``, before the problems load), its
    problems, method/temperature compatibility, a held-out half big enough to
    certify epsilon (``--confirm holdout``), the task's records (same spec
    under the same version), for an export (``new_trials=False``) what it reads
    (``check_exportable``), then the backend.

    Raises:
        FileNotFoundError / ValueError / RuntimeError: unknown task, invalid spec,
            missing data, a method that collapses at the task's temperature, a
            held-out half too small, a task edited under the same version.
        JobError: an export with nothing to export, before any model (or, for a
            missing storage, any problem) loads.
    """
    spec = load_task(settings.task)
    for method in settings.methods:
        get_method(method).check_temperature(spec.sampling.temperature)
    if not new_trials:
        export_storage(settings, spec)  # before the problems load (the hub, for a task not cached yet)
    problems = load_problems(spec, settings.limit)
    if not problems:
        raise ValueError(f"task {spec.name} has no problems")
    if settings.confirm == "holdout":
        _check_holdout(settings, spec, problems)
    check_spec_unchanged(Path(settings.output_dir) / f"{spec.name}-v{spec.version}", spec)
    if not new_trials:  # the trials searched the first half with --confirm holdout
        search = holdout_split(problems, settings.seed)[0] if settings.confirm == "holdout" else problems
        check_exportable(settings, spec, search, getattr(backend, "name", None) or backend_name(settings))
    if backend is None:
        backend = load_backend(settings)
    return spec, problems, backend


def backend_name(settings: TuneSettings) -> str:
    """The name ``load_backend(settings)`` gives its backend (records and study names
    carry it), without loading anything."""
    if settings.drafter_url and settings.verifier_url:
        return f"sglang-{settings.drafter}->{settings.verifier}"
    from .backends.hf import pair_name

    return pair_name(settings.drafter, settings.verifier, settings.dtype)


def _check_holdout(settings: TuneSettings, spec, problems) -> None:
    """Refuse ``--confirm holdout`` when the held-out half cannot certify epsilon even with no discordance."""
    from .planning import fewest_problems
    from .stats import smallest_certifiable_drop

    held = holdout_split(problems, settings.seed)[1]
    floor = smallest_certifiable_drop(len(held), spec.repeats, settings.confidence) if held else 1.0
    if floor > settings.epsilon:
        need = 2 * fewest_problems(settings.epsilon, settings.confidence, spec.repeats)
        raise ValueError(f"--confirm holdout keeps {len(held)} of the {len(problems)} problems for confirmation, whose "
                         f"smallest certifiable drop is {floor:.3f} > epsilon {settings.epsilon:g}: use --confirm "
                         f"seeds, at least {need} problems (--limit), or a larger --epsilon")


def _check_search_problems(settings: TuneSettings, spec, pair: str, problems) -> str:
    """With ``--confirm holdout``, refuse studies holding trials searched on other
    problems (another ``--limit``, ``--seed`` or ``--confirm``): they may have
    seen the held-out half. Fresh seeds are independent of every search sample,
    so ``--confirm seeds`` resumes any study. Returns the search problems' digest.

    Raises:
        JobError: such a study, naming the fix.
    """
    import optuna

    digest = hashlib.sha256("\n".join(p.id for p in problems).encode()).hexdigest()[:16]
    if settings.confirm != "holdout":
        return digest
    names = set(optuna.study.get_all_study_names(storage=settings.storage_url))
    for method in settings.methods:
        name = study_name(spec.name, method, pair, spec.version)
        study = optuna.load_study(study_name=name, storage=settings.storage_url) if name in names else None
        if study is not None and study.get_trials(deepcopy=False) and study.user_attrs.get("search_problems") != digest:
            raise JobError(f"study {name} holds trials searched on other problems (another --limit, --seed or "
                           "--confirm), which may include the held-out half: --confirm holdout needs a fresh study "
                           "(another --output-dir / --storage), or use --confirm seeds")
    return digest


def load_backend(settings: TuneSettings):
    """The SGLang backend when both server URLs are set, else the in-process pair.

    Raises:
        ValueError: only one of the two URLs is set.
        relaxtune.backends.sglang.SGLangError: a server is unreachable.
    """
    if bool(settings.drafter_url) != bool(settings.verifier_url):
        raise ValueError("the SGLang backend needs both --drafter-url and --verifier-url")
    if settings.native_url and not settings.verifier_url:
        raise ValueError("--native-url needs --drafter-url and --verifier-url too (strict, the baseline, runs on them)")
    if settings.verifier_url:
        from .backends.sglang import SGLangBackend

        return SGLangBackend(settings.drafter_url, settings.verifier_url, settings.tokenizer or settings.verifier,
                             max_concurrency=settings.concurrency, native_url=settings.native_url,
                             name=backend_name(settings))
    from .backends.hf import load_pair

    return load_pair(settings.drafter, settings.verifier, dtype=settings.dtype, batch_size=settings.batch_size)


def cost_profile(settings: TuneSettings, spec, problems, backend, log: Callable[[str], None],
                 new_trials: bool = True) -> CostProfile | float:
    """The job's costs.

    - ``settings.c_rel`` when given (a fixed value overrides any measurement);
    - else the profile saved beside the task's records (measured once per
      output folder, so every trial is priced alike). A tuning run measures
      the costs again and compares: when a cost ratio the model reads differs
      from the saved one by more than ``COST_MARGIN``, the saved profile is still
      used but carries a flag saying so (``--remeasure-costs`` adopts the new
      measurement, ``--c-rel`` fixes a value). A new draft length extends the
      saved profile, its verify cost scaled by the two measurements' t_AR; a
      noisy new measurement flags the saved profile as unconfirmed;
    - ``settings.remeasure_costs`` (or no saved profile): the new measurement,
      saved;
    - c_rel = 0.2 for backends that cannot measure (SGLang).

    A measurement whose spread stays above ``SPREAD_TOLERANCE`` is flagged too.
    An export (``new_trials=False``) never measures: it prices with the saved profile.

    Raises:
        JobError: an export without a saved profile (and without --c-rel).
    """
    if settings.c_rel != "measured":
        return float(settings.c_rel)
    pair = getattr(backend, "name", "backend")
    saved = records_path(Path(settings.output_dir), spec, DecodeConfig(), pair).with_name("cost_profile.json")
    earlier = CostProfile.from_dict(json.loads(saved.read_text())) if saved.exists() else None
    if not new_trials:
        if earlier is None and hasattr(backend, "cost_profile"):
            raise JobError(f"no saved cost profile at {saved}: an export prices with the tuning run's costs; give "
                           "its --c-rel or run `relaxtune tune`")
        return earlier if earlier is not None else 0.2
    if not hasattr(backend, "cost_profile"):
        log("this backend cannot measure its costs: using c_rel = 0.2 (give the measured value with --c-rel)")
        return 0.2
    log("measuring forward costs (interleaved passes until their spread is small)")
    fresh = backend.cost_profile(build_prompt_ids(backend.tokenizer, spec, problems[0]), sorted(settings.n_drafts))
    for flag in fresh.flags:
        log(f"warning: cost profile: {flag}")
    if earlier is not None and settings.remeasure_costs:
        log(f"--remeasure-costs: replacing the saved profile ({earlier.summary()}); trials already in the studies "
            "keep the speed-ups they were priced with")
    if earlier is None or settings.remeasure_costs:
        _save(saved, fresh)
        log(f"measured cost profile: {fresh.summary()} (saved to {saved})")
        return fresh
    return _against_saved(earlier, fresh, settings.n_drafts, saved, log)


def _against_saved(earlier: CostProfile, fresh: CostProfile, n_drafts: list[int], saved: Path,
                   log: Callable[[str], None]) -> CostProfile:
    """The saved profile (extended to new draft lengths), flagged when this
    run's measurement ``fresh`` differs from it by more than ``COST_MARGIN``."""
    new_k = {n + 1 for n in n_drafts} - set(earlier.t_verify)
    if new_k:  # price new draft lengths on the saved scale: the ratio to t_AR is what was measured now
        added = {k: max(fresh.t_verify[k] * earlier.t_ar / fresh.t_ar, earlier.t_ar) for k in new_k}
        earlier = replace(earlier, t_verify={**earlier.t_verify, **added},
                          spread=earlier.spread | {f"t_verify[{k}]": fresh.spread[f"t_verify[{k}]"] for k in new_k
                                                   if f"t_verify[{k}]" in fresh.spread})
        _save(saved, earlier)
        log(f"cost profile extended to verify(N+1) for N = {', '.join(str(k - 1) for k in sorted(new_k))} "
            f"(saved to {saved})")
    if fresh.flags:  # a disturbed check cannot tell whether the saved profile still holds
        flag = (f"this run's check of the saved profile was disturbed ({fresh.summary()}): the speed-ups are priced "
                "with the saved one, unconfirmed; run again on an idle machine, or give --c-rel")
        log(f"warning: cost profile: {flag}")
        return replace(earlier, flags=[*earlier.flags, flag])
    gap, ratio = fresh.difference(earlier)
    if gap > COST_MARGIN:
        flag = (f"this run measured {ratio} {gap:.0%} off the saved profile (margin {COST_MARGIN:.0%}; now "
                f"{fresh.summary()}): the speed-ups are priced with the saved one; --remeasure-costs adopts the new "
                "measurement (a new --output-dir keeps studies apart), --c-rel fixes a value")
        log(f"warning: cost profile: {flag}")
        return replace(earlier, flags=[*earlier.flags, flag])
    log(f"cost profile: the saved one ({earlier.summary()}), within {gap:.0%} of this run's measurement ({saved})")
    return earlier


def _save(path: Path, profile: CostProfile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=2))


def cautions(config: TunedConfig) -> list[str]:
    """What a reader of the tuned config must not miss: cost-profile flags, and a
    recommendation slower than plain decoding (modeled speed-up below 1)."""
    out = [f"cost profile: {flag}" for flag in (config.cost_profile or {}).get("flags", [])]
    rec = config.recommendation
    if rec.modeled_speedup < 1:
        out.append(f"the recommendation ({rec.method} at N={rec.n_draft}) models {rec.modeled_speedup:.2f}x: slower "
                   f"than plain decoding on these costs (c_rel {config.c_rel:.3f}); speculative decoding does not pay "
                   "here: serve the verifier alone, or check the costs (--remeasure-costs, --c-rel)")
    return out


def _log_costs(tracker, profile: CostProfile | float) -> None:
    """The cost profile on the MLflow task run: an artifact, c_rel and the worst spread, a flag tag."""
    client, run = tracker.client, tracker.task_run_id
    client.log_metric(run, "c_rel", c_rel_of(profile))
    if isinstance(profile, CostProfile):
        client.log_dict(run, profile.to_dict(), "cost_profile.json")
        if profile.spread:
            client.log_metric(run, "cost_spread_max", max(profile.spread.values()))
        client.set_tag(run, "relaxtune.cost_flags", " | ".join(profile.flags)[:5000] or "none")


def _check_export(outcomes, problems, profile, n_drafts: list[int], pinned: set[str]) -> None:
    """An export re-judges what the studies hold; refuse what would mix runs.

    Raises:
        JobError: a method without finished trials, trials run on another number
            of problems or at draft lengths ``n_drafts`` leaves out, or a c_rel
            other than the one the trials were priced with.
    """
    for o in outcomes:
        done = [t for t in o.study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")]
        other = sorted({t.params["n_draft"] for t in done} - set(n_drafts))
        if other and o.method not in pinned:  # a native server's N comes from its launch flags
            raise JobError(f"{o.method}'s trials ran at N={', '.join(map(str, other))}, which --n-drafts "
                           f"{','.join(map(str, n_drafts))} leaves out: export with the tuning run's --n-drafts")
        if not done:
            raise JobError(f"study {o.study.study_name} holds no finished trial: run `relaxtune tune` for {o.method} "
                           "first, or export only the tuned --methods")
        same_problems(o.method, o.study, problems)
        priced = {round(t.user_attrs["metrics"]["c_rel"], 9) for t in done if "c_rel" in t.user_attrs.get("metrics", {})}
        if priced and priced != {round(c_rel_of(profile), 9)}:
            raise JobError(f"{o.method}'s trials were priced at c_rel {', '.join(f'{c:.3f}' for c in sorted(priced))}, "
                           f"this export at {c_rel_of(profile):.3f}: an export cannot re-price trials; tune again "
                           "with the new --c-rel")


def run_tune_job(
    settings: TuneSettings,
    backend=None,
    *,
    progress: bool = True,
    evaluate_fn: Callable | None = None,
    track: bool = True,
    new_trials: bool = True,
    log: Callable[[str], None] = print,
    submit_trial: Callable | None = None,
    run_ranges: Callable | None = None,
    worker: str | None = None,
) -> tuple[TunedConfig, Path]:
    """Tune every method of ``settings`` on its task and export the tuned config.
    Any number of workers (processes, hosts, Prefect flow runs) may run the same
    job against one storage: they share the studies' trials and each exports the
    same config.

    Args:
        settings: the job.
        backend: a loaded backend (default: ``load_pair`` of the settings' models).
        progress: progress bars.
        evaluate_fn: evaluation override (the Prefect flow's task).
        track: log to MLflow.
        new_trials: False re-exports from what the studies already hold.
        log: where one-line progress messages go.
        submit_trial, run_ranges, worker: how trials and problem ranges run
            (``Tuner.tune``'s ``submit``, ``Tuner.run_ranges``), and this worker's label.

    Returns:
        ``(config, path)`` of the exported YAML.

    After the studies, each method's chosen point is confirmed on samples the
    search never saw (``relaxtune.confirm``: fresh seeds, or the held-out half
    of the problems with ``--confirm holdout``); only confirmed points are
    exported as feasible. A tuning job logs to its MLflow runs
    (``relaxtune.tracking.Tracker``) and writes ``settings.export`` or
    ``<output_dir>/<task>.tuned.yaml``; an export logs to a run of its own
    (``relaxtune.tracking.ExportRun``) and writes ``export_path``: it never
    modifies the tuning run's files, MLflow artifacts, tables or status.

    Raises:
        JobError: an export with nothing to export (``check_exportable``: before the
            backend loads), or one that would mix runs (it never generates), or a
            study searched other problems.
    """
    spec, everything, backend = prepare(settings, backend, new_trials)
    pair = getattr(backend, "name", "backend")
    holdout = settings.confirm == "holdout"
    problems, held_out = holdout_split(everything, settings.seed) if holdout else (everything, everything)
    digest = _check_search_problems(settings, spec, pair, problems)
    tuning = None if new_trials else tuning_settings(settings.output_dir, spec.name)  # what an export reads
    path = (Path(settings.export or Path(settings.output_dir) / f"{spec.name}.tuned.yaml") if new_trials
            else export_path(settings, spec, tuning))
    profile = cost_profile(settings, spec, problems, backend, log, new_trials)
    tracker = exporter = None
    if track and new_trials:
        from .studies import storage_lock
        from .tracking import Tracker

        tracker = Tracker(settings.mlflow_uri, spec, pair, settings.model_dump(), everything,
                          job_id(settings, spec, pair), storage_lock(settings.storage_url))
        _log_costs(tracker, profile)
    elif track:
        from .tracking import ExportRun

        exporter = ExportRun(settings.mlflow_uri, spec, pair, settings.model_dump(), everything,
                             job_id(tuning, spec, pair) if tuning is not None else None)
    tuner = Tuner(settings, spec, problems, backend, profile, tracker, evaluate_fn, progress, new_trials, log,
                  run_ranges=run_ranges, **({"worker": worker} if worker else {}))
    if new_trials:
        Path(settings.output_dir).mkdir(parents=True, exist_ok=True)
        saved = job_file(settings.output_dir, spec.name)
        tmp = saved.with_name(f"{saved.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # workers may share the folder
        job = settings.model_dump(exclude={"remeasure_costs"})  # a one-off action, not a setting to start from
        tmp.write_text(yaml.safe_dump(job, sort_keys=False))
        os.replace(tmp, saved)
    verb = "tuning" if new_trials else "reading the study of"
    for method in settings.methods:
        log(f"{verb} {method} on {spec.name} ({len(problems)} problems x {spec.repeats}, epsilon {settings.epsilon:g})")
    outcomes = tuner.tune(settings.methods, submit_trial)
    if new_trials:
        for outcome in outcomes:
            outcome.study.set_user_attr("search_problems", digest)
    if not new_trials:
        pinned = {o.method for o in outcomes if tuner.pinned(o.method) is not None}
        _check_export(outcomes, problems, profile, settings.n_drafts, pinned)
    # strict at every N a trial used (read back from its records when resuming or exporting)
    used = sorted({t.params["n_draft"] for o in outcomes for t in o.study.get_trials(deepcopy=False)
                   if t.state.name in ("COMPLETE", "PRUNED")})
    for n in used or ([settings.mid_n_draft] if new_trials else []):
        tuner.baseline(n)
    for outcome in outcomes:  # strict at every N known now: no chosen point is one strict dominates
        outcome.chosen = choose(outcome.study, settings, tuner.strict_points())
    confirmations = confirm(tuner, outcomes, held_out, new_trials=new_trials, log=log)
    mlflow_info = None
    if tracker is not None:
        for method, confirmation in confirmations.items():
            tracker.log_confirmation(method, confirmation)
        mlflow_info = {"tracking_uri": tracker.uri, "experiment": f"relaxtune-{spec.name}",
                       "experiment_id": tracker.experiment_id, "run_id": tracker.task_run_id}
    elif exporter is not None:
        for outcome in outcomes:  # the tuning job's study runs, read only
            outcome.mlflow_run_id = exporter.study_run(outcome.study.study_name)
        mlflow_info = {"tracking_uri": exporter.uri, "experiment": f"relaxtune-{spec.name}",
                       "experiment_id": exporter.experiment_id, "run_id": exporter.start(),
                       "tuning_run_id": exporter.tuning_run_id}
    try:
        config = build_config(tuner, outcomes, mlflow_info, confirmations, len(held_out))
        path = save_config(config, path)
        if tracker is not None:  # figures once strict is known at every N the trials used
            tracker.finish(outcomes, tuner, config, path)
        if exporter is not None:
            exporter.finish(outcomes, tuner, config, path)
    except Exception as err:
        if exporter is not None:
            exporter.fail(f"{type(err).__name__}: {err}")
        raise
    return config, path
