"""Pareto fronts of speed-up vs accuracy: points, the front, figures and tables."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Point", "pareto_front", "study_points", "front_figure", "combined_figure", "points_table"]


@dataclass
class Point:
    """One point on the speed/accuracy plane.

    Attributes:
        label: e.g. "cactus delta=1 N=5", "strict N=5", "AR".
        kind: "trial", "strict" or "ar".
        speedup: modeled speed-up over AR at the chosen cost profile.
        accuracy: accuracy on the paired samples.
        feasible: satisfies the capability-loss constraint (strict and AR always do).
        chosen: the tuned point of its method.
        method, knob, n_draft, trial: where it comes from.
        drop_ucb: upper bound of the accuracy drop vs strict.
        state: the trial state.
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


def pareto_front(points: list[Point]) -> list[Point]:
    """Feasible points not dominated in (speed-up, accuracy), sorted by speed-up."""
    cands = [p for p in points if p.feasible and p.state == "COMPLETE"]
    front = [
        p for p in cands
        if not any(q.speedup >= p.speedup and q.accuracy >= p.accuracy and (q.speedup, q.accuracy) != (p.speedup, p.accuracy)
                   for q in cands)
    ]
    return sorted(front, key=lambda p: p.speedup)


def study_points(method: str, knob_name: str | None, study, chosen_number: int | None, settings=None) -> list[Point]:
    """Points of a study's completed and pruned trials (failed ones have no metrics)."""
    from .judge import feasible

    out = []
    for t in study.get_trials(deepcopy=False):
        m = t.user_attrs.get("metrics") or {}
        if "speedup" not in m:
            continue
        knob = t.params.get("knob")
        label = f"{method} {knob_name}={knob:.3g} N={t.params['n_draft']}" if knob is not None else f"{method} N={t.params['n_draft']}"
        out.append(Point(label, "trial", m["speedup"], m["accuracy"], feasible(t, settings), t.number == chosen_number, method,
                         knob, t.params["n_draft"], t.number, m.get("drop_ucb"), t.state.name))
    return out


def _axes(title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.set_xlabel("modeled speed-up over AR (S_relax)")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax


def front_figure(points: list[Point], title: str):
    """Figure of one study: trials (feasible filled, infeasible hollow, pruned
    crossed), strict per N, AR, the Pareto front line and the chosen point."""
    fig, ax = _axes(title)
    for p in points:
        if p.kind == "ar":
            ax.scatter(p.speedup, p.accuracy, marker="s", color="black", zorder=3, label="AR (same distribution as strict)")
        elif p.kind == "strict":
            ax.scatter(p.speedup, p.accuracy, marker="D", color="tab:gray", zorder=3)
            ax.annotate(f"strict N={p.n_draft}", (p.speedup, p.accuracy), fontsize=7, xytext=(3, -9), textcoords="offset points")
        elif p.state == "PRUNED":
            ax.scatter(p.speedup, p.accuracy, marker="x", color="tab:red", alpha=0.6)
        else:
            ax.scatter(p.speedup, p.accuracy, marker="o", s=36, color="tab:blue" if p.feasible else "white",
                       edgecolors="tab:blue", zorder=2)
        if p.chosen:
            ax.scatter(p.speedup, p.accuracy, marker="*", s=260, color="gold", edgecolors="black", zorder=4, label=f"chosen: {p.label}")
    front = pareto_front([p for p in points if p.kind == "trial"])
    if front:
        ax.plot([p.speedup for p in front], [p.accuracy for p in front], color="tab:blue", lw=1.2, label="Pareto front (feasible)")
    # legend entries for the unlabeled markers
    ax.scatter([], [], marker="o", color="tab:blue", label="feasible trial")
    ax.scatter([], [], marker="o", color="white", edgecolors="tab:blue", label="infeasible trial")
    ax.scatter([], [], marker="x", color="tab:red", label="pruned trial")
    ax.scatter([], [], marker="D", color="tab:gray", label="strict")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def combined_figure(per_method: dict[str, list[Point]], baselines: list[Point], title: str):
    """Every method's feasible Pareto front (and all its trials, faint) on one set of axes."""
    fig, ax = _axes(title)
    for i, (method, points) in enumerate(per_method.items()):
        color = f"C{i % 10}"
        trials = [p for p in points if p.kind == "trial"]
        ax.scatter([p.speedup for p in trials], [p.accuracy for p in trials], color=color, alpha=0.25, s=18)
        front = pareto_front(trials)
        if front:
            ax.plot([p.speedup for p in front], [p.accuracy for p in front], "-o", color=color, label=method)
        else:
            ax.scatter([], [], color=color, label=f"{method} (no feasible point)")
        for p in trials:
            if p.chosen:
                ax.scatter(p.speedup, p.accuracy, marker="*", s=220, color=color, edgecolors="black", zorder=4)
    for p in baselines:
        ax.scatter(p.speedup, p.accuracy, marker="s" if p.kind == "ar" else "D", color="black" if p.kind == "ar" else "gray")
        ax.annotate(p.label, (p.speedup, p.accuracy), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def points_table(points: list[Point]) -> list[dict]:
    """Rows for a table artifact (one per point, with an ``on_front`` flag)."""
    front = {id(p) for p in pareto_front(points)}
    return [asdict(p) | {"on_front": id(p) in front} for p in points]
