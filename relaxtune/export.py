"""The tuned per-task config a serving team deploys (YAML, with a schema).

One file per task: for each method the chosen knob and draft length (or "none
feasible"), the capability-loss budget, strict and relaxed accuracy with n and
intervals, acceptance length, length ratio, modeled speed-ups, the serving
arguments, and provenance (models, task and grader versions, seed, study name,
MLflow run); then one recommendation across methods. When no trial is
feasible the recommendation is strict at its best draft length.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from importlib import metadata
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from .methods import get_method

__all__ = ["MethodResult", "Recommendation", "TunedConfig", "build_config", "save_config", "load_config", "serving_args"]

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MethodResult(_Model):
    """One method's outcome. ``knob``/``n_draft`` (and ``trial``, the chosen trial's
    number in its study) are None when no trial was feasible."""

    method: str
    knob_name: str | None
    feasible: bool
    knob: float | None = None
    n_draft: int | None = None
    trial: int | None = None
    strict_accuracy: float | None = None
    accuracy: float | None = None
    accuracy_ci: tuple[float, float] | None = None
    n: int | None = None
    drop: float | None = None
    drop_upper_bound: float | None = None
    l_accept: float | None = None
    length_ratio: float | None = None
    modeled_speedup: float | None = None
    modeled_speedup_by_c_rel: dict[str, float] = {}
    truncated: float | None = None
    loop_rate: float | None = None
    trials: int = 0  # completed or pruned
    pruned: int = 0
    failed: int = 0
    tokens_spent: int = 0
    study_name: str
    mlflow_run_id: str | None = None
    serving: dict | None = None
    closest: dict | None = None  # when infeasible: the tried point with the smallest drop bound


class Recommendation(_Model):
    """What to deploy for this task."""

    method: str
    knob: float | None
    n_draft: int
    modeled_speedup: float
    reason: str
    serving: dict


class TunedConfig(_Model):
    """The exported file."""

    schema_version: int = SCHEMA_VERSION
    task: str
    task_version: int
    grader: dict
    drafter: str
    verifier: str
    dtype: str
    sampling: dict
    seed: int
    problems: int
    repeats: int
    epsilon: float
    confidence: float
    c_rel: float
    cost_profile: dict | None = None
    strict_by_n_draft: dict[int, dict]
    methods: dict[str, MethodResult]
    recommendation: Recommendation
    relaxtune_version: str
    created: str
    mlflow: dict | None = None


def serving_args(method: str, knob: float | None, n_draft: int, drafter: str, verifier: str, sampling: dict) -> dict:
    """How to serve a point. Strict maps onto SGLang's own speculative decoding;
    relaxed rules run in relaxtune's client-side verify loop over two plain
    servers (SGLang's server-side verify cannot express them)."""
    from .backends.sglang_native import chain_flags
    from .embedded import EMBEDDED

    rt = {"method": method, "alpha": knob, "n_draft": n_draft, "drafter": drafter, "verifier": verifier, "sampling": sampling}
    # SGLang loads the upstream weights, not relaxtune's embedded CPU copies
    drafter, verifier = (EMBEDDED[m].hf_id if m in EMBEDDED else m for m in (drafter, verifier))
    if method == "strict":
        return {
            "relaxtune": rt,
            "sglang_launch_args": ["--model-path", verifier, "--speculative-draft-model-path", drafter,
                                   *chain_flags(n_draft)],
        }
    return {"relaxtune": rt, "note": "client-side verify loop over a drafter and a verifier server"}


def _grader_versions(kind: str) -> dict:
    out = {"kind": kind}
    pkg = {"math": "math-verify", "code": None, "choice": None}[kind]
    if pkg:
        out[pkg] = metadata.version(pkg)
    return out


def build_config(tuner, outcomes: list, mlflow_info: dict | None = None) -> TunedConfig:
    """Assemble the tuned config from a finished ``Tuner`` and its ``MethodOutcome``s."""
    import optuna

    from .speed import CostProfile, c_rel_of

    from .judge import drop_ucb_at

    s, spec = tuner.settings, tuner.spec
    ucb = lambda m: drop_ucb_at(m, s.confidence)  # noqa: E731 - at this export's confidence
    sampling = spec.sampling.model_dump()
    states = optuna.trial.TrialState
    methods: dict[str, MethodResult] = {}
    for o in outcomes:
        trials = o.study.get_trials(deepcopy=False)
        base = dict(
            method=o.method, knob_name=get_method(o.method).knob,
            trials=sum(t.state in (states.COMPLETE, states.PRUNED) for t in trials),
            pruned=sum(t.state == states.PRUNED for t in trials), failed=sum(t.state == states.FAIL for t in trials),
            tokens_spent=o.tokens, study_name=o.study.study_name, mlflow_run_id=o.mlflow_run_id,
        )
        t = o.chosen
        if t is None:
            tried = [x for x in trials if "drop_ucb" in x.user_attrs.get("metrics", {})]
            best = min(tried, key=lambda x: (ucb(x.user_attrs["metrics"]), -x.user_attrs["metrics"]["speedup"]),
                       default=None)
            closest = None
            if best is not None:
                m = best.user_attrs["metrics"]
                closest = {"trial": best.number, "knob": best.params.get("knob"), "n_draft": best.params["n_draft"], "state": best.state.name,
                           "accuracy": m["accuracy"], "strict_accuracy": m["strict_accuracy"], "n": m["n"],
                           "drop_upper_bound": ucb(m), "l_accept": m.get("l_accept"),
                           "length_ratio": m.get("length_ratio"), "modeled_speedup": m["speedup"]}
            methods[o.method] = MethodResult(feasible=False, closest=closest, **base)
            continue
        m = t.user_attrs["metrics"]
        knob, n = t.params.get("knob"), t.params["n_draft"]
        methods[o.method] = MethodResult(
            feasible=True, knob=knob, n_draft=n, trial=t.number, strict_accuracy=m["strict_accuracy"], accuracy=m["accuracy"],
            accuracy_ci=(m["accuracy_ci_low"], m["accuracy_ci_high"]), n=m["n"], drop=m["drop"],
            drop_upper_bound=ucb(m), l_accept=m["l_accept"], length_ratio=m["length_ratio"],
            modeled_speedup=m["speedup"], truncated=m["truncated"], loop_rate=m["loop_rate"],
            modeled_speedup_by_c_rel={k.removeprefix("speedup_c"): v for k, v in m.items() if k.startswith("speedup_c")},
            serving=serving_args(o.method, knob, n, s.drafter, s.verifier, sampling), **base,
        )
    strict = {n: {"accuracy": b.accuracy, "accuracy_ci": [b.ci_low, b.ci_high], "n": b.n, "l_accept": b.l_accept,
                  "mean_length": b.mean_length, "modeled_speedup": tuner.strict_speedup(n)}
              for n, b in sorted(tuner.baselines.items())}
    best_n = max(strict, key=lambda n: strict[n]["modeled_speedup"]) if strict else s.n_drafts[0]
    feasible = [r for r in methods.values() if r.feasible]
    best = max(feasible, key=lambda r: (r.modeled_speedup, r.accuracy), default=None)
    strict_speed = strict.get(best_n, {}).get("modeled_speedup", 1.0)
    if best is not None and best.modeled_speedup > strict_speed:
        rec = Recommendation(
            method=best.method, knob=best.knob, n_draft=best.n_draft, modeled_speedup=best.modeled_speedup,
            reason=(f"fastest point whose accuracy drop vs strict is below {s.epsilon:g} with {s.confidence:.0%} "
                    f"confidence (upper bound {best.drop_upper_bound:.3f}); strict at N={best_n} models "
                    f"{strict_speed:.2f}x"),
            serving=best.serving,
        )
    else:
        why = ("no relaxed trial met the capability-loss constraint" if best is None else
               f"no feasible relaxed point beats strict at N={best_n} ({strict_speed:.2f}x)")
        rec = Recommendation(method="strict", knob=None, n_draft=best_n, modeled_speedup=strict_speed,
                             reason=f"use strict: {why} (epsilon {s.epsilon:g}, {len(tuner.problems)} problems)",
                             serving=serving_args("strict", None, best_n, s.drafter, s.verifier, sampling))
    profile = tuner.profile
    return TunedConfig(
        task=spec.name, task_version=spec.version, grader=_grader_versions(spec.grader.kind), drafter=s.drafter,
        verifier=s.verifier, dtype=s.dtype, sampling=sampling, seed=s.seed, problems=len(tuner.problems),
        repeats=spec.repeats, epsilon=s.epsilon, confidence=s.confidence,
        c_rel=c_rel_of(profile),
        cost_profile=profile.to_dict() if isinstance(profile, CostProfile) else None,
        strict_by_n_draft=strict, methods=methods, recommendation=rec, relaxtune_version=metadata.version("relaxtune"),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), mlflow=mlflow_info,
    )


def save_config(config: TunedConfig, path: str | Path) -> Path:
    """Write the config as YAML (atomically) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # workers may share the folder
    tmp.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, width=120))
    tmp.replace(path)
    return path


def load_config(path: str | Path) -> TunedConfig:
    """Read and validate a tuned config.

    Raises:
        ValueError: the file does not match the schema.
    """
    return TunedConfig.model_validate(yaml.safe_load(Path(path).read_text()))
