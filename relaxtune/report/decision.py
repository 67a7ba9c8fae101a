"""What a tuned config decided, in the forms MLflow shows on a run's page: params
(what was decided, under which budget), metrics (the numbers behind it),
searchable tags, a name and a one-sentence description. Pure functions of a
``relaxtune.report.config_schema.TunedConfig``; ``relaxtune.report.tracking`` logs them on the task
run of a tuning job and on every export's own run."""

from __future__ import annotations

from dataclasses import dataclass

from ..tune.pareto import point_label
from ..tune.recommend import PLAIN

__all__ = ["PLAIN_LABEL", "Decision", "decide", "study_summary"]

PLAIN_LABEL = "plain decoding (the verifier alone)"  # a plain recommendation's label: no drafter, no N


@dataclass
class Decision:
    """A config's decision as MLflow fields.

    Attributes:
        params: ``recommended_method`` (``plain``: serve the verifier alone), ``recommended_knob_name``,
            ``recommended_knob`` (``-`` for strict and plain), ``recommended_n_draft`` (``-`` for plain),
            what ran (``runtime``, ``dtype``: ``-`` on llama.cpp, ``drafter_weights`` and
            ``verifier_weights``: each model's format, e.g. ``GGUF Q4_K_M``), ``recommended_drop_ucb`` (the
            exported bound: the confirmation run's; 0 for strict) and, for a
            confirmed point, ``recommended_search_drop_ucb`` (the search's) and
            ``confirm_confidence`` (each confirmation's share of the confidence),
            ``epsilon``, ``confidence``, ``n`` (paired samples the decision rests on),
            ``problems``, ``repeats``, ``task``, ``task_version``, ``drafter``,
            ``verifier``, ``c_rel``.
        metrics: ``recommended_speedup`` (modeled, over AR; 1 for plain), ``recommended_drop_ucb``
            (the exported upper bound of the accuracy drop vs strict; 0 for strict
            and plain), ``recommended_accuracy``, ``strict_accuracy`` and
            ``strict_speedup`` (strict at the recommended N; for plain, at the fastest
            speculative point's N, and ``fastest_speculative_speedup``), ``epsilon``,
            ``confidence``, ``n``; for a confirmed point also
            ``recommended_search_drop_ucb`` (the search's bound); per method
            ``<method>.feasible`` (1/0) and its point's (or the closest point's)
            ``<method>.speedup`` and ``<method>.drop_ucb``.
        tags: ``relaxtune.recommended`` (e.g. ``cactus delta=1 N=4``),
            ``relaxtune.recommended_method``, for plain ``relaxtune.fastest_speculative``
            (e.g. ``strict N=4``), ``relaxtune.feasible_methods``
            (comma-separated, or ``none``), ``relaxtune.task``, ``relaxtune.epsilon``; with more
            than one serving batch size priced, ``relaxtune.batch_size`` (the recommendation's)
            and ``relaxtune.stops_paying_at`` (a batch size, or ``none``), and the metrics
            ``best_speedup_batch_<B>`` (the best confirmed point's at each, ``by_batch_size``).
        label: the recommended point, e.g. ``cactus delta=1 N=4`` or ``strict N=4``, or ``PLAIN_LABEL``.
        description: one sentence: what was decided and why.
    """

    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    label: str
    description: str


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def decide(config) -> Decision:
    """The ``Decision`` of a tuned config (``relaxtune.report.config_schema.TunedConfig``)."""
    rec = config.recommendation
    plain = rec.method == PLAIN
    fast = rec.fastest_speculative
    chosen = config.methods.get(rec.method) if rec.method not in ("strict", PLAIN) else None
    # plain decoding samples the verifier's own distribution, as strict does at any N: strict's accuracy is its estimate
    strict = config.strict_by_n_draft.get(fast.n_draft if plain and fast is not None else rec.n_draft, {})
    knob_name = chosen.knob_name if chosen is not None else None
    label = PLAIN_LABEL if plain else point_label(rec.method, knob_name, rec.knob, rec.n_draft, rec.knobs, rec.scope)
    n = chosen.n if chosen is not None else strict.get("n")
    ws = config.weights or {}
    params = {
        "recommended_method": rec.method,
        "recommended_knob_name": knob_name or "-",
        "recommended_knob": _num(rec.knob),
        "recommended_n_draft": _num(rec.n_draft),
        "runtime": config.runtime or "-",
        "dtype": config.dtype or "-",
        **{f"{role}_weights": ws[role]["format"] for role in ("drafter", "verifier") if "format" in ws.get(role, {})},
        "epsilon": f"{config.epsilon:g}",
        "confidence": f"{config.confidence:g}",
        "n": _num(n),
        "problems": str(config.problems),
        "repeats": str(config.repeats),
        "task": config.task,
        "task_version": str(config.task_version),
        "drafter": config.drafter,
        "verifier": config.verifier,
        "c_rel": f"{config.c_rel:.4g}",
    }
    metrics = {
        "recommended_speedup": rec.modeled_speedup,
        "epsilon": config.epsilon,
        "confidence": config.confidence,
        "recommended_drop_ucb": chosen.drop_upper_bound if chosen is not None else 0.0,
        "recommended_accuracy": chosen.accuracy if chosen is not None else strict.get("accuracy"),
        "strict_accuracy": strict.get("accuracy"),
        "strict_speedup": strict.get("modeled_speedup"),
        "n": n,
    }
    bound = chosen.drop_upper_bound if chosen is not None else 0.0
    params["recommended_drop_ucb"] = f"{bound:.4g}"
    if chosen is not None and chosen.search_drop_upper_bound is not None:  # confirmed: both bounds
        metrics["recommended_search_drop_ucb"] = chosen.search_drop_upper_bound
        params["recommended_search_drop_ucb"] = f"{chosen.search_drop_upper_bound:.4g}"
    if config.confirmation.get("planned"):
        params["confirm_confidence"] = f"{config.confirmation['confidence_each']:.4g}"
    for method, r in config.methods.items():
        point = (
            {"modeled_speedup": r.modeled_speedup, "drop_upper_bound": r.drop_upper_bound}
            if r.feasible
            else (r.closest or {})
        )
        metrics[f"{method}.feasible"] = float(r.feasible)
        metrics[f"{method}.speedup"] = point.get("modeled_speedup")
        metrics[f"{method}.drop_ucb"] = point.get("drop_upper_bound")
    feasible = [m for m, r in config.methods.items() if r.feasible]
    tags = {
        "relaxtune.recommended": label,
        "relaxtune.recommended_method": rec.method,
        "relaxtune.task": config.task,
        "relaxtune.feasible_methods": ",".join(feasible) or "none",
        "relaxtune.epsilon": f"{config.epsilon:g}",
    }
    if plain and fast is not None:  # the point plain decoding beats, for information
        knob_name = config.methods[fast.method].knob_name if fast.method in config.methods else None
        tags["relaxtune.fastest_speculative"] = point_label(
            fast.method, knob_name, fast.knob, fast.n_draft, fast.knobs, fast.scope
        )
        metrics["fastest_speculative_speedup"] = fast.modeled_speedup
    batches = config.by_batch_size
    if batches is not None and len(batches.best) > 1:  # the speed a deployment sees at each batch size
        metrics |= {f"best_speedup_batch_{b}": v.modeled_speedup for b, v in batches.best.items()}
        tags["relaxtune.batch_size"] = str(rec.batch_size)
        tags["relaxtune.stops_paying_at"] = str(batches.stops_paying_at or "none")
    if config.confirmation.get("promise"):  # what the exported bound promises, in words (weaker with --confirm seeds)
        tags["relaxtune.promise"] = config.confirmation["promise"][:5000]
        tags["relaxtune.confirm"] = config.confirmation.get("samples", "?")
    return Decision(
        params, {k: float(v) for k, v in metrics.items() if v is not None}, tags, label, _sentence(config, label)
    )


def _sentence(config, label: str) -> str:
    """``Use <point> on <task> (modeled <S>x over AR): <why>.`` (one sentence)."""
    rec = config.recommendation
    why = rec.reason.removeprefix("use strict: ").removeprefix("serve the verifier alone (plain decoding): ")
    why = why.rstrip(".")
    closest = [(m, r.closest) for m, r in config.methods.items() if not r.feasible and r.closest]
    if rec.method in ("strict", PLAIN) and closest:
        method, c = min(closest, key=lambda mc: mc[1]["drop_upper_bound"])
        point = point_label(
            method,
            config.methods[method].knob_name,
            c.get("knob"),
            c.get("n_draft"),
            c.get("extra_knobs") or {},
            c.get("scope"),
        )
        why += f"; the closest tried point, {point}, has a drop of at most {c['drop_upper_bound']:.3f}"
    samples = f"{config.problems} problems x {config.repeats}"
    return (
        f"Use {label} on {config.task} v{config.task_version} (modeled {rec.modeled_speedup:.2f}x over AR, "
        f"epsilon {config.epsilon:g}, {samples}): {why}."
    )


def study_summary(result, epsilon: float) -> tuple[str, str]:
    """A study run's name and one-sentence description from its method's
    ``relaxtune.report.config_schema.MethodResult``: e.g. ``cactus study: delta=1 N=4 chosen (1.92x)``
    or ``cactus study: none within eps 0.05``."""
    tried = f"{result.trials} trials ({result.pruned} pruned, {result.failed} failed)"
    if result.feasible:
        point = point_label(
            result.method, result.knob_name, result.knob, result.n_draft, result.knobs or {}, result.scope
        )
        knob = point.removeprefix(result.method).strip()
        name = f"{result.method} study: {knob} chosen ({result.modeled_speedup:.2f}x)"
        search = (
            ""
            if result.search_drop_upper_bound is None
            else f" on fresh samples (search: {result.search_drop_upper_bound:.3f})"
        )
        return name, (
            f"{tried}; chosen {point}: modeled {result.modeled_speedup:.2f}x over AR, accuracy drop vs "
            f"strict at most {result.drop_upper_bound:.3f}{search}, epsilon {epsilon:g}."
        )
    name = f"{result.method} study: none within eps {epsilon:g}"
    why = f" ({result.note})" if result.note else ""
    c = result.closest
    if not c:
        return name, f"{tried}; no point exported{why}, and no trial finished to compare."
    point = point_label(
        result.method, result.knob_name, c.get("knob"), c.get("n_draft"), c.get("extra_knobs") or {}, c.get("scope")
    )
    return name, (
        f"{tried}; no point exported{why}: the closest tried, {point}, has an accuracy drop vs strict of "
        f"at most {c['drop_upper_bound']:.3f} (modeled {c['modeled_speedup']:.2f}x)."
    )
