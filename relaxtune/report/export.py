"""The tuned per-task config a serving team deploys: built from a finished job
(``build_config``), saved and loaded as YAML (``save_config``, ``load_config``), and
what its reader must not miss (``cautions``); its schema is
``relaxtune.report.config_schema``.

One file per task: for each method the confirmed knob and draft length (or
"none feasible"), the capability-loss budget, strict and relaxed accuracy with
n and intervals, the drop bound of the confirmation run (``drop_upper_bound``,
from fresh samples alone, ``relaxtune.tune.confirm``) beside the search's
(``search_drop_upper_bound``), acceptance length, length ratio, modeled
speed-ups, the serving arguments, and provenance (models, task and grader
versions, seed, study name, MLflow run); how the confidence was split over
the confirmations; what the sample can certify (``sample``,
``relaxtune.certify.planning``); then one recommendation across methods
(``relaxtune.tune.recommend``). When no point is confirmed, or none beats strict
by more than the speed margin, the recommendation is strict at its best N; when no
speculative point pays on the measured costs, it is plain decoding of the verifier
(``method: plain``, the fastest speculative point beside it as ``fastest_speculative``).
``relaxtune transfer`` later adds a ``transfer`` section: how the task's
point holds on other tasks, and theirs on it (``relaxtune.transfer``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import yaml

from ..decoding.methods import get_method
from ..decoding.serving import ServingProfile
from ..decoding.speed import CostProfile, c_rel_of, modeled_speedup
from ..tune.judge import feasible as within_budget
from ..tune.point_records import SCOPE_PARAM, DecodeConfig
from ..tune.recommend import PLAIN
from ..tune.records import knobs_of, load_metrics, trial_metrics
from ..tune.result import JobResult
from ..tune.setting_groups import PairSettings, StatsSettings
from .config_schema import ByBatchSize, MethodResult, Recommendation, TunedConfig, upgrade_config
from .deploy import deploy_blocks, plain_blocks, weights

__all__ = [
    "cautions",
    "what_ran",
    "cost_profile_section",
    "build_config",
    "save_config",
    "load_config",
    "serving_args",
]


def serving_args(method: str, knob: float | None, n_draft: int, drafter: str, verifier: str, sampling: dict) -> dict:
    """How to serve a point. Strict maps onto SGLang's own speculative decoding;
    relaxed rules run in relaxtune's client-side verify loop over two plain
    servers (SGLang's server-side verify cannot express them)."""
    from ..backends.embedded import EMBEDDED
    from ..backends.sglang_native import chain_flags

    rt = {
        "method": method,
        "alpha": knob,
        "n_draft": n_draft,
        "drafter": drafter,
        "verifier": verifier,
        "sampling": sampling,
    }
    # SGLang loads the upstream weights, not relaxtune's embedded CPU copies
    drafter, verifier = (EMBEDDED[m].hf_id if m in EMBEDDED else m for m in (drafter, verifier))
    if method == "strict":
        return {
            "relaxtune": rt,
            "sglang_launch_args": [
                "--model-path",
                verifier,
                "--speculative-draft-model-path",
                drafter,
                *chain_flags(n_draft),
            ],
        }
    return {"relaxtune": rt, "note": "client-side verify loop over a drafter and a verifier server"}


def _grader_versions(kind: str) -> dict:
    out = {"kind": kind}
    pkg = {"math": "math-verify", "code": None, "choice": None}[kind]
    if pkg:
        out[pkg] = metadata.version(pkg)
    return out


def _priced(profile, m, n_draft: int) -> float:
    """A point's modeled speed-up with ``profile`` from its stored acceptance and mean
    lengths (``m``: ``PointMetrics``): the computation ``relaxtune.tune.judge.point_metrics``
    made, so the same costs give the stored value exactly and others re-price it."""
    return modeled_speedup(profile, m.l_accept, n_draft, m.strict_length, m.length)


def _closest(trials: list, ucb, method: str, profile) -> dict | None:
    """The tried point with the smallest drop bound (then the fastest), priced with ``profile``."""
    tried = [(x, m) for x in trials if (m := trial_metrics(x, method)) is not None]
    best, m = min(tried, key=lambda xm: (ucb(xm[1]), -xm[1].speedup), default=(None, None))
    if best is None:
        return None
    return {
        "trial": best.number,
        "knob": best.params.get("knob"),
        **({"extra_knobs": dict(extra)} if (extra := _extra(method, best.params)) else {}),
        "n_draft": best.params["n_draft"],
        **({"scope": scope} if (scope := best.params.get(SCOPE_PARAM, "all")) != "all" else {}),
        "state": best.state.name,
        "accuracy": m.accuracy,
        "strict_accuracy": m.strict_accuracy,
        "n": m.n,
        "drop_upper_bound": ucb(m),
        "discordance": (m.strict_only + m.relaxed_only) / m.n,
        "l_accept": m.l_accept,
        "length_ratio": m.length_ratio,
        "modeled_speedup": _priced(profile, m, best.params["n_draft"]),
    }


def _extra(method: str, params: dict) -> tuple:
    """A trial's further knobs that differ from its alpha view (``DecodeConfig.extra``)."""
    return () if params.get("knob") is None else DecodeConfig.of_point(method, params, 0).extra


def _within_budget(o, stats: StatsSettings) -> int:
    """How many of the method's trials pass the capability-loss constraint under ``stats``."""
    return sum(within_budget(t, stats) for t in o.study.get_trials(deepcopy=False))


def _method_result(
    o, confirmation, pair: PairSettings, stats: StatsSettings, ucb, sampling: dict, profile, ran: tuple
) -> MethodResult:
    """One method's entry: the confirmed point's confirmation numbers, or why there is none;
    speed-ups priced with ``profile`` (the job's costs, or a serving host's: ``_priced``);
    ``ran``: ``what_ran(pair)``, asked once per export (a served pair asks its server)."""
    import optuna

    states = optuna.trial.TrialState
    trials = o.study.get_trials(deepcopy=False)
    base = dict(
        method=o.method,
        knob_name=get_method(o.method).knob,
        trials=sum(t.state in (states.COMPLETE, states.PRUNED) for t in trials),
        pruned=sum(t.state == states.PRUNED for t in trials),
        failed=sum(t.state == states.FAIL for t in trials),
        tokens_spent=o.tokens,
        study_name=o.study.study_name,
        mlflow_run_id=o.mlflow_run_id,
        confirmation=None
        if confirmation is None
        else {
            "confidence": confirmation.confidence,
            "attempts": [a.summary() for a in confirmation.attempts],
            "missing": confirmation.missing,
        },
    )
    done = None if confirmation is None else confirmation.confirmed
    if done is None:
        within = _within_budget(o, stats)
        note = (
            "no trial met the capability-loss constraint in the search"
            if o.chosen is None and not within
            else f"{within} trial(s) met the capability-loss constraint, but strict at some N is as fast (its modeled "
            "speed-up, response lengths counted) and as accurate as each: relaxing does not pay here"
            if o.chosen is None
            else "the search's choice was not confirmed (no confirmation run)"
            if confirmation is None
            else confirmation.missing
            or f"the search's best {len(confirmation.attempts)} point(s) failed confirmation on fresh samples"
        )
        search = None if o.chosen is None else ucb(trial_metrics(o.chosen, o.method))
        return MethodResult(
            feasible=False,
            closest=_closest(trials, ucb, o.method, profile),
            search_drop_upper_bound=search,
            note=note,
            **base,
        )
    point = DecodeConfig(o.method, done.knob, done.n_draft, done.seed, extra=getattr(done, "extra", ()))
    knobs = knobs_of(o.method, point.point_knob)  # every named knob, as searched
    m = load_metrics(done.metrics, knobs, where=f"{o.method}'s confirmation")
    return MethodResult(
        feasible=True,
        knob=done.knob,
        knobs=knobs,
        scope=m.scope,
        n_draft=done.n_draft,
        trial=done.trial,
        strict_accuracy=m.strict_accuracy,
        accuracy=m.accuracy,
        accuracy_ci=(m.accuracy_ci_low, m.accuracy_ci_high),
        n=m.n,
        drop=m.drop,
        drop_upper_bound=m.drop_ucb,
        drop_bound_method=m.bound_method,
        search_drop_upper_bound=done.search_drop_upper_bound,
        l_accept=m.l_accept,
        length_ratio=m.length_ratio,
        modeled_speedup=_priced(profile, m, done.n_draft),
        truncated=m.truncated,
        loop_rate=m.loop_rate,
        modeled_speedup_by_c_rel=m.speedup_by_c_rel,
        serving=serving_args(o.method, done.knob, done.n_draft, pair.drafter, pair.verifier, sampling),
        **base,
        deploy=deploy_blocks(
            o.method,
            point.point_knob,
            done.n_draft,
            sampling,
            pair.drafter,
            pair.verifier,
            *reversed(ran),
            m.scope,
        ),
    )


def what_ran(pair: PairSettings) -> tuple[str | None, str | None]:
    """``(runtime, dtype)`` the tuned config records for a job's model pair and runtime (``pair``): ``sglang`` and
    the server's dtype (``relaxtune.backends.sglang_costs.served_dtype``) when the verifier ran
    on an SGLang server; ``llamacpp`` and no dtype (the GGUF files run as quantised: the
    format is in ``weights``); else the in-process runtime (``auto`` resolved) and its ``dtype``."""
    resolve = getattr(pair, "resolved_runtime", None)  # "auto" as this machine resolves it (a job records it so)
    runtime = resolve() if resolve is not None else getattr(pair, "runtime", None)
    if getattr(pair, "verifier_url", None):
        from ..backends.sglang_costs import served_dtype

        return "sglang", served_dtype(pair.verifier_url)
    return runtime, None if runtime == "llamacpp" else pair.dtype


def build_config(result: JobResult, mlflow_info: dict | None = None, costs: dict | None = None) -> TunedConfig:
    """Assemble the tuned config from a finished job (``Tuner.result``): its
    ``MethodOutcome``s and their confirmations (``relaxtune.tune.confirm.confirm``: a
    method without one exports no point), strict's baselines and the cost profile
    (``result.profile``: every exported speed-up, the recommendation and ``by_batch_size``
    are priced with it).

    Args:
        mlflow_info: where the job's MLflow runs are (the config's ``mlflow``), or None.
        costs: for a re-priced export (``relaxtune.report.reexport.reprice``), what the
            config's ``cost_profile`` says beside the profile: ``source`` (where the costs
            came from), ``repriced`` (what was and was not re-priced), ``where`` (the host,
            for ``by_batch_size.line``); None: the job's own costs, "on this host".
    """
    from ..certify.planning import plan, planning_discordance
    from ..tune.batches import Prices, by_batch
    from ..tune.confirm import RULE, planned_confirmations, promise, split_confidence
    from ..tune.judge import drop_ucb_at
    from ..tune.recommend import recommend

    pair, stats, search = result.pair, result.stats, result.search
    spec, confirmations, outcomes = result.spec, result.confirmations, result.outcomes
    ucb = lambda m: drop_ucb_at(m.dump(), stats.confidence)  # noqa: E731 - PointMetrics, at this export's confidence
    sampling = spec.sampling.model_dump()
    profile = result.profile
    runtime, dtype = ran = what_ran(pair)
    methods = {
        o.method: _method_result(o, confirmations.get(o.method), pair, stats, ucb, sampling, profile, ran)
        for o in outcomes
    }
    strict = {
        n: {
            "accuracy": b.accuracy,
            "accuracy_ci": [b.ci_low, b.ci_high],
            "n": b.n,
            "l_accept": b.l_accept,
            "mean_length": b.mean_length,
            "modeled_speedup": result.strict_speedup(n),
        }
        for n, b in result.baselines.items()
    }
    dominated = [o.method for o in outcomes if o.chosen is None and _within_budget(o, stats)]  # strict beats each
    rec = recommend(result, methods, confirmations, strict, dominated)
    if rec["method"] == PLAIN:  # serve the verifier alone; the fastest speculative point beside it
        fast = rec["fastest_speculative"]
        fast |= {k: getattr(methods[fast["method"]], k) for k in ("knobs", "scope") if fast["method"] in methods}
        rec["deploy"] = plain_blocks(pair.verifier, sampling, dtype, runtime)
        rec["serving"] = {
            "decoding": PLAIN,
            "note": "serve the verifier alone",
            "sglang_launch_args": rec["deploy"]["sglang"]["launch_args"],
        }
    else:
        rec.setdefault("knobs", methods[rec["method"]].knobs if rec["method"] in methods else {})
        rec.setdefault("scope", (methods[rec["method"]].scope if rec["method"] in methods else None) or "all")
        rec["serving"] = (
            serving_args("strict", None, rec["n_draft"], pair.drafter, pair.verifier, sampling)
            if rec["method"] == "strict"
            else methods[rec["method"]].serving
        )
        rec["deploy"] = deploy_blocks(
            rec["method"],
            rec.get("knobs") or rec["knob"],
            rec["n_draft"],
            sampling,
            pair.drafter,
            pair.verifier,
            dtype,
            runtime,
            rec["scope"],
        )
    pinned = set(result.pinned)
    planned = (
        next(iter(confirmations.values())).planned
        if confirmations
        else planned_confirmations([o.method for o in outcomes], stats.confirmations, search.trials, pinned)
    )
    tried = [
        m
        for o in outcomes
        for t in o.study.get_trials(deepcopy=False)
        if t.state.name == "COMPLETE" and (m := trial_metrics(t, o.method)) is not None
    ]
    pairs = sum(m.n for m in tried)  # pooled over every completed trial (its upper bound), else the default
    discordance = planning_discordance(sum(m.strict_only + m.relaxed_only for m in tried), pairs, stats.confidence)
    holdout = stats.confirm == "holdout"
    held = result.confirm_problems
    total = result.problems + held if holdout else result.problems  # the job's problems (--limit)
    sample = plan(
        total,
        spec.repeats,
        stats.epsilon,
        stats.confidence,
        discordance=discordance,
        planned=max(planned, 1),
        holdout=holdout,
    )
    prices = Prices.of(profile)
    points = strict or any(r.feasible for r in methods.values())  # nothing to price: no section
    batches = by_batch(strict, methods, prices, (costs or {}).get("where", "on this host")) if points else None
    return TunedConfig(
        task=spec.name,
        task_version=spec.version,
        grader=_grader_versions(spec.grader.kind),
        drafter=pair.drafter,
        verifier=pair.verifier,
        dtype=dtype,
        runtime=runtime,
        sampling=sampling,
        weights={"drafter": weights(pair.drafter, dtype, runtime), "verifier": weights(pair.verifier, dtype, runtime)},
        seed=search.seed,
        problems=result.problems,
        repeats=spec.repeats,
        epsilon=stats.epsilon,
        confidence=stats.confidence,
        c_rel=c_rel_of(profile),
        cost_profile=cost_profile_section(profile, costs),
        serving_batch_sizes=prices.batch_sizes,
        by_batch_size=None if batches is None else ByBatchSize(**batches),
        strict_by_n_draft=strict,
        methods=methods,
        confirmation={
            "samples": stats.confirm,
            "problems": held,
            "per_method": stats.confirmations,
            "planned": planned,
            "confidence_each": split_confidence(stats.confidence, planned),
            "rule": RULE,
            "promise": promise(stats.confirm, stats.confidence, stats.epsilon, held),
        },
        sample=asdict(sample) | {"line": sample.line()},
        recommendation=Recommendation(**rec),
        relaxtune_version=metadata.version("relaxtune"),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        mlflow=mlflow_info,
    )


def cost_profile_section(profile, costs: dict | None = None) -> dict | None:
    """The config's ``cost_profile``: a serving profile's ``to_dict`` (batch sizes and
    weights) after ``source`` (where the costs came from: ``costs["source"]``, else the
    tuning run's own measurement), the flags of every batch size (``ServingProfile.flags``)
    and, re-priced, ``repriced`` (what was re-priced and what keeps the tuning run's
    prices; batch sizes as string keys, as in the YAML); a single ``CostProfile``'s ``to_dict``
    (its own ``source``); None for a fixed c_rel."""
    costs = costs or {}
    if isinstance(profile, ServingProfile):
        head = {"source": costs.get("source", "measured by the tuning run (each batch size's own source below)")}
        extra = {k: costs[k] for k in ("repriced", "tuning_c_rel") if k in costs}
        # as the YAML holds it (batch sizes as string keys): a loaded config equals the built one
        return json.loads(json.dumps(head | extra | {"flags": profile.flags} | profile.to_dict()))
    if isinstance(profile, CostProfile):
        return profile.to_dict()
    return None


def save_config(config: TunedConfig, path: str | Path) -> Path:
    """Write the config as YAML (atomically) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # workers may share the folder
    tmp.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, width=120))
    tmp.replace(path)
    return path


def load_config(path: str | Path) -> TunedConfig:
    """Read and validate a tuned config, schema v3 or v2 (``upgrade_config``).

    Raises:
        ValueError: the file is not YAML, not a mapping, or does not match the schema.
        OSError: the file cannot be read.
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path} is not YAML: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {type(data).__name__ if data is not None else 'nothing'}, not a tuned config")
    return TunedConfig.model_validate(upgrade_config(data))


def cautions(config: TunedConfig) -> list[str]:
    """What a reader of the tuned config must not miss: cost-profile flags, and that the
    fastest speculative point is slower than plain decoding (modeled speed-up below 1; the
    recommendation is then plain decoding, and the point is named as the fastest, never as
    what to deploy)."""
    from ..decoding.serving import ServingProfile

    flags = ServingProfile.from_dict(config.cost_profile).flags if config.cost_profile else []
    if config.cost_profile and "batch_sizes" not in config.cost_profile:  # a single profile: its flags as they read
        flags = [f.split(": ", 1)[1] for f in flags]
    out = [f"cost profile: {flag}" for flag in flags]
    rec = config.recommendation
    fast = rec.fastest_speculative if rec.method == PLAIN else rec
    if fast is not None and fast.modeled_speedup < 1:
        at = "" if rec.batch_size == 1 else f" at serving batch size {rec.batch_size}"
        out.append(
            f"the fastest speculative point ({fast.method} at N={fast.n_draft}) models {fast.modeled_speedup:.2f}x: "
            f"slower than plain decoding on these costs{at} (c_rel {config.c_rel:.3f}); "
            + (
                "the recommendation is plain decoding (serve the verifier alone)"
                if rec.method == PLAIN
                else "speculative decoding does not pay here: serve the verifier alone"
            )
            + "; if the costs look wrong, check them (--remeasure-costs, --c-rel)"
        )
    return out
