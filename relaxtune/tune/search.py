"""Where a study looks after the paper's grid: a sampler that uses how relaxation behaves.

Every method's knob runs from its strict point (no relaxation) to its strongest
relaxation; ``strength`` places a knob on [0, 1] along the method's search range
(log-scaled where the range is), 0 at the end nearest the strict point. Two
regularities of relaxed speculative decoding steer the search:

- acceptance: with per-token acceptance ``beta``, a round of N drafts accepts
  ``beta (1 - beta^N) / (1 - beta)`` drafts on average (Leviathan, Kalman and
  Matias 2023, eq. 1, tokens accepted independently), so one evaluated point
  predicts its knob's speed-up at every draft length (``predicted_speedup``);
- loss: a stronger relaxation loses no less accuracy.

``RelaxationSampler`` wraps another sampler (the study's TPE) and proposes, in order:

1. transfer: the fastest feasible point's knob at the draft length its measured
   acceptance predicts fastest, when the prediction gains more than ``GAIN``;
2. bisection: the middle (in strength) of the widest gap between the strongest
   knob known within the budget and the weakest known outside it (at any draft
   length: the loss depends on N far less than the speed-up does), not tried yet
   at that N; at the draft length with the highest predicted speed-up, if it beats
   the fastest feasible point;
3. otherwise whatever the wrapped sampler draws.

Rules with several named knobs (``MethodSpec.further_knobs``: SGLang's single
threshold beside the acc one, FLy's window W and top-k beside its threshold,
TensorRT-LLM's top-k beside its delta) search each further knob as a study
parameter of its own, under its engine name. The primary knob (alpha, the
parameter ``knob``) keeps driving the model above; a further knob has no
acceptance model of its own, so it is searched by coordinates around the fastest
feasible point, with the loss regularity alone:

- steps 1 and 2 run along a *line*: the further knobs held at the fastest feasible
  point's values (before there is one: at the alpha view, ``MethodSpec.alpha_view``,
  where the grid lies), and only the trials on that line enter the model, the
  edges and "tried" (a point off the line is another rule);
- 2b. coordinates: when the primary knob is resolved, each further knob in turn
  (declared order) is bisected in ITS strength (its own search range at that N,
  0 at its weaker end: ``Knob.weaker_up``) between the fastest feasible point's
  value and the weakest infeasible one known with every other coordinate the
  same, stronger side only (the weaker side cannot be faster); integer knobs are
  rounded, and a rounded value tried already is not proposed again;
- a further knob whose range depends on N (FLy's W < N: ``Knob.below_n``) is
  clipped into that N's range when a point moves to another N, and a draft length
  where a further knob has no valid value is not proposed at all, nor drawn (a study
  made before FLy's N = 1 was left out keeps that choice, ``n_draft_choices``; a draw
  of it is replaced by a valid one);
- points that are the same rule are one point (``MethodSpec.canonical``: SGLang's
  single threshold at or above the acc one is the tied rule), on the tied line.

Why coordinates and not a joint model: the engines' knobs interact (SGLang's
single threshold only matters below the acc one; FLy's W and k both gate the
same flip), so a joint acceptance model would be a guess, while "stronger
relaxation loses no less accuracy" holds along every single knob; the wrapped
TPE still draws every knob jointly whenever no structured proposal applies.
For the paper's one-knob rules nothing of this applies: their proposals are
exactly the single-knob ones.

Trials running on other workers count as tried, so workers draw different
points. The regularities only choose where to look: every point is judged by its
own evaluation, and a method where they fail (e.g. ``spec_cont_dec``, slower as
its knob grows) loses only sampler efficiency.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from ..decoding.methods import MethodSpec, get_method
from .judge import feasible

__all__ = [
    "strength",
    "knob_at",
    "per_token_acceptance",
    "accepted_per_round",
    "RelaxationSampler",
    "GAIN",
    "RESOLUTION",
    "PRUNED_BY",
    "valid_n",
    "n_draft_choices",
]

GAIN = 0.02  # a transfer must predict a speed-up this much (relative) above the point's own N
RESOLUTION = 0.02  # gaps narrower than this (in strength) are not bisected further
PRUNED_BY = "pruned_by"  # trial user attribute: "drop" or "speed"


def _unit(spec: MethodSpec, knob: float) -> float:
    low, high, log = spec.search
    u = (math.log(knob) - math.log(low)) / (math.log(high) - math.log(low)) if log else (knob - low) / (high - low)
    return min(max(u, 0.0), 1.0)


def _reversed(spec: MethodSpec) -> bool:
    """The weakest relaxation lies at the top of the search range: the strict point is there
    (``sglang_threshold``: t = 1), or the knob relaxes less as it grows (``weaker_up``:
    ``typical``'s epsilon, which has no strict point)."""
    sp = spec.strict_point
    return spec.weaker_up or (sp is not None and math.isfinite(sp) and sp >= spec.search[1])


def strength(spec: MethodSpec | str, knob: float) -> float:
    """``knob``'s place in ``[0, 1]`` along the method's search range (log-scaled when the range
    is), 0 at the end nearest the strict point; knobs outside the range are clipped."""
    spec = get_method(spec)
    u = _unit(spec, float(knob))
    return 1.0 - u if _reversed(spec) else u


def knob_at(spec: MethodSpec | str, s: float) -> float:
    """The knob at strength ``s`` (the inverse of ``strength`` on the search range), to 6
    significant digits (a value a user can type into a config)."""
    spec = get_method(spec)
    low, high, log = spec.search
    u = min(max(1.0 - s if _reversed(spec) else s, 0.0), 1.0)
    knob = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if log else low + u * (high - low)
    return min(max(float(f"{knob:.6g}"), low), high)


def accepted_per_round(beta: float, n_draft: int) -> float:
    """Mean accepted drafts per round (tokens) at per-token acceptance ``beta`` and draft length
    ``n_draft``: ``beta (1 - beta^N) / (1 - beta)`` (Leviathan et al. 2023, eq. 1, less the bonus)."""
    return float(n_draft) if beta >= 1.0 else beta * (1.0 - beta**n_draft) / (1.0 - beta)


def per_token_acceptance(l_accept: float, n_draft: int) -> float:
    """The per-token acceptance ``beta`` in [0, 1] whose ``accepted_per_round`` at ``n_draft`` is
    ``l_accept`` (bisection; the map is increasing), 1 at ``l_accept >= N``."""
    if l_accept >= n_draft:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if accepted_per_round(mid, n_draft) < l_accept else (lo, mid)
    return (lo + hi) / 2


def valid_n(spec: MethodSpec, n_draft: int) -> bool:
    """Every further knob of ``spec`` has a value in its range at ``n_draft`` (FLy's W < N
    needs N >= 2: ``MethodSpec.check_n_draft``)."""
    try:
        spec.check_n_draft(n_draft)
    except ValueError:
        return False
    return True


def n_draft_choices(study, valid: list[int]) -> list[int]:
    """The choices a study's ``n_draft`` parameter is drawn from: ``valid`` (the draft lengths
    the rule can run), or, for a study whose trials drew from other choices that hold every
    valid one, those (Optuna refuses to change a categorical parameter's choices: a study made
    before the rule's range narrowed, e.g. FLy's N = 1, resumes on its own; ``RelaxationSampler``
    never proposes the invalid ones)."""
    for t in study.get_trials(deepcopy=False):
        old = t.distributions.get("n_draft")
        if isinstance(old, CategoricalDistribution):
            return list(old.choices) if set(valid) <= set(old.choices) else valid
    return valid


def _fits(distribution: BaseDistribution, value) -> bool:
    """``value`` is one the distribution can take (a pinned point's study draws nothing else)."""
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    if isinstance(distribution, (FloatDistribution, IntDistribution)):
        return value is not None and distribution.low <= value <= distribution.high
    return False


class RelaxationSampler(BaseSampler):
    """An Optuna sampler for one method's study (module doc): structured proposals, else
    ``fallback``'s draws.

    Args:
        method: the study's method; n_drafts: the draft lengths to choose from.
        speed: ``speed(l_accept, n_draft, length_ratio)``, the modeled speed-up
            (``relaxtune.decoding.speed.modeled_speedup`` at the job's costs, ``L_AR`` = 1).
        fallback: the sampler that draws when no structured proposal applies.
    """

    def __init__(
        self, method: str, n_drafts: list[int], speed: Callable[[float, int, float], float], fallback: BaseSampler
    ) -> None:
        self.spec, self.speed, self.fallback = get_method(method), speed, fallback
        self.further = self.spec.further_knobs
        self.n_drafts = [n for n in sorted(n_drafts) if valid_n(self.spec, n)]
        self._proposals: dict[int, dict | None] = {}

    # ------------------------------------------------------------------ Optuna

    def infer_relative_search_space(self, study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.fallback.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict:
        point = self.proposal(study, trial)
        if point is None or not all(_fits(d, point.get(k)) for k, d in search_space.items()):
            drawn = self.fallback.sample_relative(study, trial, search_space)
            if "n_draft" in drawn and drawn["n_draft"] not in self.n_drafts:
                del drawn["n_draft"]  # a draft length the rule cannot run: drawn again alone, below
            return drawn
        return {k: point[k] for k in search_space}

    def sample_independent(self, study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution):
        point = self.proposal(study, trial)
        if point is None or not _fits(param_distribution, point.get(param_name)):
            value = self.fallback.sample_independent(study, trial, param_name, param_distribution)
            if param_name == "n_draft" and value not in self.n_drafts:
                value = self._valid_n(study, trial, param_distribution, value)
            return value
        return point[param_name]

    def _valid_n(self, study, trial: FrozenTrial, distribution: BaseDistribution, value):
        """A draft length the rule can run, drawn uniformly (seeded by the trial's number) from
        ``distribution``'s valid choices, for a draw outside them: a study made before the rule's
        range narrowed keeps its old choices (``n_draft_choices``: FLy's N = 1), never proposed."""
        valid = [c for c in getattr(distribution, "choices", ()) if c in self.n_drafts]
        if not valid:
            return value
        return RandomSampler(seed=trial.number).sample_independent(
            study, trial, "n_draft", CategoricalDistribution(valid)
        )

    def before_trial(self, study, trial: FrozenTrial) -> None:
        self.fallback.before_trial(study, trial)

    def after_trial(self, study, trial: FrozenTrial, state: TrialState, values) -> None:
        self.fallback.after_trial(study, trial, state, values)

    # ---------------------------------------------------------------- proposal

    def proposal(self, study, trial: FrozenTrial) -> dict | None:
        """``{"n_draft", "knob"}`` for ``trial`` (computed once per trial), or None: the fallback draws."""
        if trial.number not in self._proposals:
            others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
            self._proposals[trial.number] = self.propose(others)
        return self._proposals[trial.number]

    def propose(self, trials: list[FrozenTrial]) -> dict | None:
        """The next point given a study's other trials (module doc), or None."""
        knob = self.spec.has_knob
        counted = [
            t
            for t in trials
            if "n_draft" in t.params and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        ]
        done_all = [
            t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.user_attrs.get("metrics")
        ]
        good_all = [t for t in done_all if feasible(t)]
        best = max(good_all, key=lambda t: t.values[0], default=None)
        line = self._extra(best) if best is not None else {}  # the further knobs held (module doc)
        on = lambda t: self._on_line(t, line)  # noqa: E731
        tried = [(self._s(t), t.params["n_draft"]) for t in counted if on(t)]
        done = [t for t in done_all if on(t)]
        good = [t for t in good_all if on(t)]
        bad = [t for t in done if not feasible(t) and t.user_attrs.get(PRUNED_BY) != "speed"]
        model = self._model(done)

        def new(s: float, n: int) -> bool:
            return not any(n == tn and abs(s - ts) < RESOLUTION / 2 for ts, tn in tried)

        def point(s: float, n: int) -> dict:
            k = knob_at(self.spec, s)
            return {"n_draft": n} | ({"knob": k} if knob else {}) | self._line_at(line, k, n)

        if best is not None:  # 1. transfer the fastest feasible point to the draft length predicted fastest
            s_best, n_best = self._s(best), best.params["n_draft"]
            predicted = {n: self.predicted_speedup(model, s_best, n) for n in self.n_drafts}
            ahead = [n for n in self.n_drafts if predicted[n] > (1.0 + GAIN) * predicted[n_best] and new(s_best, n)]
            if ahead:
                n = max(ahead, key=predicted.get)
                return (
                    {"n_draft": n}
                    | {k: v for k, v in best.params.items() if k == "knob"}
                    | self._line_at(line, best.params.get("knob"), n)
                )
        if not knob:
            return None
        lo = max((self._s(t) for t in good), default=0.0)  # 2. bisect between known-feasible and -infeasible
        hi = min((s for t in bad if (s := self._s(t)) > lo), default=1.0)
        options = []
        for n in self.n_drafts:
            edges = sorted({lo, hi} | {s for s, tn in tried if tn == n and lo < s < hi})
            if len(edges) < 2:  # the strongest relaxation is feasible: nothing left between
                continue
            gap, left = max((b - a, a) for a, b in zip(edges, edges[1:]))
            if gap > RESOLUTION:
                s = left + gap / 2
                options.append(
                    (self.predicted_speedup(model, s, n), -abs(n - (best.params["n_draft"] if best else n)), s, n)
                )
        floor = best.values[0] if best is not None else -math.inf
        options = [o for o in options if o[0] > floor and new(o[2], o[3])]
        if options:
            return point(*max(options)[2:])
        return self._coordinate(best, counted, done_all) if best is not None else None

    # ---------------------------------------------------------- further knobs

    def _further(self, trial: FrozenTrial) -> dict:
        """The trial's further knobs (``MethodSpec.further_knobs``), resolved: a parameter
        the trial lacks (a grid point, a run from before they were searched) at the alpha view, in
        their one form (``MethodSpec.canonical``: SGLang's single threshold at or above acc is tied)."""
        if not self.further:
            return {}
        view = self.spec.alpha_view(trial.params["knob"], trial.params["n_draft"])
        return view | dict(self._extra(trial))

    def _extra(self, trial: FrozenTrial) -> dict:
        """The trial's further knobs that differ from its alpha view (``MethodSpec.extra_of``)."""
        if not self.further:
            return {}
        return dict(self.spec.extra_of(trial.params["knob"], trial.params, trial.params["n_draft"]))

    def _on_line(self, trial: FrozenTrial, line: dict) -> bool:
        """The trial's further knobs are those of ``line`` at its own alpha and N."""
        if not self.further or "knob" not in trial.params:
            return True
        want = self._line_at(line, trial.params["knob"], trial.params["n_draft"])
        return self._further(trial) == want

    def _line_at(self, line: dict, knob: float | None, n: int) -> dict:
        """The further knobs' parameters of a point at ``knob`` and ``n`` on ``line`` (a point's
        ``_extra``): the alpha view at ``knob`` and ``n`` with ``line``'s values in place,
        clipped into the range at ``n`` (``Knob.search_at``)."""
        if not self.further or knob is None:
            return {}
        view = self.spec.alpha_view(knob, n)
        out = {}
        for k in self.further:
            low, high = k.search_at(n)
            v = line.get(k.name, view[k.name])
            out[k.name] = type(v)(min(max(v, low), high))
        return out

    def _f_strength(self, k, value: float, n: int) -> float:
        low, high = k.search_at(n)
        u = 0.0 if high == low else min(max((value - low) / (high - low), 0.0), 1.0)
        return 1.0 - u if k.weaker_up else u

    def _f_at(self, k, s: float, n: int) -> float:
        low, high = k.search_at(n)
        u = 1.0 - s if k.weaker_up else s
        v = low + min(max(u, 0.0), 1.0) * (high - low)
        return int(round(v)) if k.kind == "int" else min(max(float(f"{v:.6g}"), low), high)

    def _coordinate(self, best: FrozenTrial, counted: list[FrozenTrial], done: list[FrozenTrial]) -> dict | None:
        """2b. (module doc): the first further knob with a gap wider than ``RESOLUTION`` on the
        stronger side of ``best``, its middle; None when every one is resolved."""
        n, at = best.params["n_draft"], self._further(best)
        for k in self.further:
            others = {name: v for name, v in at.items() if name != k.name}

            def same(t: FrozenTrial) -> bool:
                if t.params.get("n_draft") != n or "knob" not in t.params:
                    return False
                f = self._further(t)
                return t.params["knob"] == best.params["knob"] and all(f[m] == v for m, v in others.items())

            row = [t for t in counted if same(t)]
            values = {self._further(t)[k.name] for t in row}
            lo = self._f_strength(k, at[k.name], n)
            bad = [t for t in done if same(t) and not feasible(t) and t.user_attrs.get(PRUNED_BY) != "speed"]
            hi = min((s for t in bad if (s := self._f_strength(k, self._further(t)[k.name], n)) > lo), default=1.0)
            edges = sorted({lo, hi} | {s for v in values if lo < (s := self._f_strength(k, v, n)) < hi})
            if len(edges) < 2:
                continue
            gap, left = max((b - a, a) for a, b in zip(edges, edges[1:]))
            value = self._f_at(k, left + gap / 2, n)
            if gap > RESOLUTION and value not in values:
                return {"n_draft": n, "knob": best.params["knob"]} | at | {k.name: value}
        return None

    def _s(self, trial: FrozenTrial) -> float:
        return strength(self.spec, trial.params["knob"]) if "knob" in trial.params else 0.0

    def _model(self, done: list[FrozenTrial]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per measured strength (sorted): per-token acceptance and length ratio, averaged over draft lengths."""
        rows: dict[float, list[tuple[float, float]]] = {}
        for t in done:
            m = t.user_attrs["metrics"]
            rows.setdefault(self._s(t), []).append(
                (per_token_acceptance(m["l_accept"], t.params["n_draft"]), m["length_ratio"])
            )
        xs = np.array(sorted(rows))
        beta = np.array([np.mean([b for b, _ in rows[x]]) for x in xs])
        ratio = np.array([np.mean([r for _, r in rows[x]]) for x in xs])
        return xs, beta, ratio

    def predicted_speedup(self, model: tuple[np.ndarray, np.ndarray, np.ndarray], s: float, n_draft: int) -> float:
        """Modeled speed-up at strength ``s`` and ``n_draft``, from the per-token acceptance and length
        ratio interpolated between measured strengths (flat beyond them); 0 before any measurement."""
        xs, beta, ratio = model
        if not len(xs):
            return 0.0
        b, r = float(np.interp(s, xs, beta)), float(np.interp(s, xs, ratio))
        return self.speed(accepted_per_round(b, n_draft), n_draft, r)
