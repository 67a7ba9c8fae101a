"""Pareto fronts of speed-up vs accuracy: the points (trials, strict per N, AR),
the front and its table. The figures drawn from them are ``relaxtune.report.figures``."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = [
    "Point",
    "pareto_front",
    "study_points",
    "baseline_points",
    "points_table",
    "point_label",
    "knob_text",
]


@dataclass
class Point:
    """One point on the speed/accuracy plane.

    Attributes:
        label: e.g. "cactus delta=1 N=5", "strict N=5", "AR".
        kind: "trial", "strict" or "ar".
        speedup: modeled speed-up over AR at the job's cost profile.
        accuracy: accuracy on the paired samples; ``ci_low``/``ci_high`` its 95 %
            Wilson interval (``relaxtune.certify.stats.wilson_interval``).
        feasible: satisfies the capability-loss constraint (strict and AR always do).
        chosen: the exported point of its method.
        closest: when its method has no feasible point, the tried point with the
            smallest drop bound (the export's ``closest``).
        method, knob, n_draft, trial: where it comes from.
        drop: the observed paired accuracy drop vs strict at the same N; ``drop_lcb``
            / ``drop_ucb`` its one-sided bounds at the job's confidence (the
            constraint is ``drop_ucb <= epsilon``); strict and AR have drop 0.
        confirm_drop_ucb: the drop bound of this point's confirmation run on fresh
            samples, when the export carries one (the chosen point's is the exported
            bound); ``confirm_passed`` whether that confirmation passed.
        state: the trial state (COMPLETE, PRUNED; pruned points saw only part of the problems).
    """

    label: str
    kind: str
    speedup: float
    accuracy: float
    feasible: bool = True
    chosen: bool = False
    method: str = ""
    knob: float | None = None
    n_draft: int | None = None
    trial: int | None = None
    drop_ucb: float | None = None
    state: str = "COMPLETE"
    ci_low: float | None = None
    ci_high: float | None = None
    drop: float | None = None
    drop_lcb: float | None = None
    closest: bool = False
    confirm_drop_ucb: float | None = None
    confirm_passed: bool | None = None


def _short(name: str, primary: str) -> str:
    """``name`` less the words it shares with ``primary`` (``speculative_accept_threshold_single``
    after ``speculative_accept_threshold_acc``: ``_single``); the whole name when none."""
    shared = 0
    for i, (a, b) in enumerate(zip(name, primary)):
        if a != b:
            break
        if a == "_":
            shared = i
    return name[shared:] if shared else name


def _value(v: float) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def knob_text(
    method: str, knob_name: str | None, knob: float | None, n_draft: int | None, extra=(), compact: bool = False
) -> str:
    """A point's knobs as a label shows them: ``"delta=0.25"`` for a one-knob rule; for a rule
    with further knobs (``MethodSpec.further_knobs``) every named knob, alpha first under its
    engine name and each further one shortened by the words it shares with it:
    ``"speculative_accept_threshold_acc=0.5, _single=0.275"``,
    ``"fly_entropy_threshold=0.3, _window_size=3, _top_k=3"`` (a derived knob at its value at
    N, the alpha view where ``extra`` does not set one); ``""`` without a knob.

    Args:
        method: method id; knob_name: alpha's name (default: the registry's); knob: alpha;
        n_draft: N; extra: the further knobs, as a mapping that may hold other keys (a trial's
            params, a record's ``knobs``) or ``((name, value), ...)``; put in their one form
            (``MethodSpec.extra_of``: SGLang's single threshold at or above acc is tied);
        compact: for narrow tables, every name less the words all of the rule's knobs share
            (``"acc=0.5, single=0.275"``, ``"delta=0.1, topk=4"``).
    """
    from ..decoding.methods import ALL_METHODS

    if knob is None:
        return ""
    spec = ALL_METHODS.get(method)
    if spec is None or not spec.further_knobs or n_draft is None:
        return f"{knob_name or (spec.knob if spec else 'knob')}={knob:.3g}"
    extra = spec.extra_of(knob, dict(extra), n_draft)
    named = spec.point_knobs(knob, extra)
    primary = spec.primary or spec.knobs[0].name
    if compact:
        cut = max(len(_short(primary, k.name)) for k in spec.further_knobs)  # less the words all names share
        name = lambda n: n[len(primary) - cut :].lstrip("_")  # noqa: E731
    else:
        name = lambda n: n if n == primary else _short(n, primary)  # noqa: E731
    parts = [f"{name(primary)}={_value(named[primary])}"]
    for k in spec.further_knobs:
        parts.append(f"{name(k.name)}={_value(k.resolve(named[k.name], n_draft))}")
    return ", ".join(parts)


def point_label(
    method: str, knob_name: str | None, knob: float | None, n_draft: int | None, extra=(), scope: str | None = None
) -> str:
    """``"cactus delta=0.25 N=4"`` (knob-less methods: ``"always_accept N=4"``; strict: ``"strict N=4"``;
    a rule with further knobs: ``"sglang_threshold speculative_accept_threshold_acc=0.5, _single=0.275
    N=4"``, ``knob_text``): the one label of a point in logs, MLflow run names, figures and decisions.
    A point relaxed only while the model thinks says so: ``"cactus delta=0.25 N=4 thinking"``
    (``scope``, default: ``extra``'s ``SCOPE_PARAM`` when it is a trial's params or a record's knobs;
    ``"all"`` is not shown)."""
    from .point_records import SCOPE_PARAM

    if scope is None and isinstance(extra, dict):
        scope = extra.get(SCOPE_PARAM)
    text = knob_text(method, knob_name, knob, n_draft, extra)
    return (
        f"{method}{' ' + text if text else ''}"
        + (f" N={n_draft}" if n_draft is not None else "")
        + (f" {scope}" if scope not in (None, "all") else "")
    )


def pareto_front(points: list[Point]) -> list[Point]:
    """Feasible points not dominated in (speed-up, accuracy), sorted by speed-up."""
    cands = [p for p in points if p.feasible and p.state == "COMPLETE"]
    front = [
        p
        for p in cands
        if not any(
            q.speedup >= p.speedup and q.accuracy >= p.accuracy and (q.speedup, q.accuracy) != (p.speedup, p.accuracy)
            for q in cands
        )
    ]
    return sorted(front, key=lambda p: p.speedup)


def _is(result, attr: str, trial) -> bool:
    """Whether ``trial`` is the point ``result`` (a ``MethodResult``) exports as ``attr``
    ("chosen": its knob and N; "closest": its ``closest`` entry), by trial number when known."""
    if result is None:
        return False
    if attr == "chosen":
        if not result.feasible:
            return False
        number, knob, n_draft = getattr(result, "trial", None), result.knob, result.n_draft
    else:
        if result.feasible or not result.closest:
            return False
        number, knob, n_draft = (result.closest.get(k) for k in ("trial", "knob", "n_draft"))
    if number is not None:
        return trial.number == number
    same_knob = knob is None or (trial.params.get("knob") is not None and abs(trial.params["knob"] - knob) <= 1e-12)
    return same_knob and trial.params.get("n_draft") == n_draft and trial.state.name == "COMPLETE"


def study_points(method: str, knob_name: str | None, study, result=None, stats=None) -> list[Point]:
    """Points of a study's completed and pruned trials (failed ones have no metrics),
    judged under ``stats`` (``StatsSettings``: an export's epsilon and confidence); ``result``, the
    method's ``relaxtune.report.config_schema.MethodResult``, marks the chosen and the closest point
    and gives every confirmed trial its confirmation's bound (passed or failed)."""
    from .judge import drop_ucb_at, feasible
    from .records import trial_metrics

    attempts = {a["trial"]: a for a in ((getattr(result, "confirmation", None) or {}).get("attempts") or [])}
    out = []
    for t in study.get_trials(deepcopy=False):
        m = trial_metrics(t, method)  # typed, v2 or v3 (relaxtune.tune.records)
        if m is None:
            continue
        knob, n_draft = t.params.get("knob"), t.params["n_draft"]
        ucb = drop_ucb_at(t.user_attrs["metrics"], stats.confidence) if stats is not None else m.drop_ucb
        chosen, attempt = _is(result, "chosen", t), attempts.get(t.number)
        if attempt is None and chosen and result.search_drop_upper_bound is not None:
            attempt = {"drop_upper_bound": result.drop_upper_bound, "passed": True}
        out.append(
            Point(
                point_label(method, knob_name, knob, n_draft, t.params),
                "trial",
                m.speedup,
                m.accuracy,
                feasible(t, stats),
                chosen,
                method,
                knob,
                n_draft,
                t.number,
                ucb,
                t.state.name,
                m.accuracy_ci_low,
                m.accuracy_ci_high,
                m.drop,
                m.drop_lcb,
                _is(result, "closest", t),
                *((attempt["drop_upper_bound"], attempt["passed"]) if attempt else (None, None)),
            )
        )
    return out


def baseline_points(result) -> list[Point]:
    """Strict at every evaluated N (its accuracy interval, drop 0) and AR at speed-up 1
    (AR samples strict's distribution: its accuracy is strict's at the first N), from a
    finished job (``relaxtune.tune.result.JobResult``)."""
    out = []
    for n, b in sorted(result.baselines.items()):
        out.append(
            Point(
                f"strict N={n}",
                "strict",
                result.strict_speedup(n),
                b.accuracy,
                n_draft=n,
                method="strict",
                ci_low=b.ci_low,
                ci_high=b.ci_high,
                drop=0.0,
                drop_lcb=0.0,
                drop_ucb=0.0,
            )
        )
    if result.baselines:
        b = result.baselines[min(result.baselines)]
        out.append(
            Point(
                "AR",
                "ar",
                1.0,
                b.accuracy,
                method="ar",
                ci_low=b.ci_low,
                ci_high=b.ci_high,
                drop=0.0,
                drop_lcb=0.0,
                drop_ucb=0.0,
            )
        )
    return out


def points_table(points: list[Point]) -> list[dict]:
    """Rows for a table artifact (one per point, with an ``on_front`` flag)."""
    front = {id(p) for p in pareto_front(points)}
    return [asdict(p) | {"on_front": id(p) in front} for p in points]
