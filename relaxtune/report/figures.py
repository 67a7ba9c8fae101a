"""The figures of a tuning job (matplotlib, Agg), drawn to be read at the size
MLflow previews an artifact (about 900 px wide).

- ``method_figure``: one method's trials on two panels sharing the x axis
  (modeled speed-up over AR): accuracy with its 95 % interval, strict at every N
  and AR, the budget ``strict - epsilon`` shaded under strict's accuracy; below,
  the paired accuracy drop vs strict with its one-sided bounds and the line
  ``drop = epsilon`` (a point is feasible when its upper bound stays under it).
- ``combined_figure``: every method on the same panels, each in its colour.
- ``knob_figure``: one method's modeled speed-up and drop against its knob, one
  colour per draft length, strict's speed-up at each N as a reference line (the
  paper's way of reading the trade-off: Xia, Ribar and Balanca, arXiv
  2607.08690, the speed-up and accuracy curves over alpha).

On the drop panel a confirmed point also shows its confirmation run's bound on
fresh samples (a green bar; red when the confirmation failed) beside the
search's bound. Strict, AR, the chosen point (a gold star), the closest point
of a method that exports none (a red ring) and every point that failed
confirmation keep distinct markers and get labels with leader lines, placed
where they overlap neither each other nor the panel's edge, so coinciding
points stay legible.
"""

from __future__ import annotations

from ..tune.pareto import Point, pareto_front
from .figure_parts import (
    AR,
    BUDGET,
    CHOSEN,
    CLOSEST,
    STYLE,
    acc_limits,
    budget_reference,
    confirm_handles,
    draw_baselines,
    draw_budget,
    draw_trials,
    drop_limits,
    legend_below,
    legend_handles,
    panels,
    place_labels,
    point_labels,
    pyplot,
    set_limits,
)

__all__ = ["method_figure", "combined_figure", "knob_figure"]


def method_figure(points: list[Point], baselines: list[Point], epsilon: float, title: str):
    """One method's trials vs strict per N and AR (see the module doc).

    Args:
        points: the method's trial points (``relaxtune.tune.pareto.study_points``).
        baselines: strict per N and AR (``relaxtune.tune.pareto.baseline_points``).
        epsilon: the capability-loss budget (accuracy, absolute).
        title: the figure's title.

    Returns:
        A matplotlib figure (close it after logging).
    """
    plt = pyplot()
    with plt.rc_context(STYLE):
        fig, top, bottom = panels(title, "modeled speed-up over AR (S_relax)")
        top.set_ylabel("accuracy (95 % interval)")
        ref = budget_reference(baselines, points)
        draw_budget(top, bottom, ref, epsilon)
        draw_trials(top, bottom, points, "tab:blue", lambda p: p.speedup, lambda p: (p.accuracy, p.ci_low, p.ci_high))
        front = pareto_front(points)
        if len(front) > 1:
            top.plot([p.speedup for p in front], [p.accuracy for p in front], color="tab:blue", lw=1.2, zorder=2)
        draw_baselines(top, bottom, baselines)
        acc_limits(top, points + baselines, ref, epsilon)
        drop_limits(bottom, points, epsilon)
        handles = legend_handles(epsilon, ref)
        if len(front) > 1:
            from matplotlib.lines import Line2D

            handles.insert(3, Line2D([], [], color="tab:blue", lw=1.2, label="Pareto front (feasible)"))
        legend_below(fig, handles + confirm_handles(points))
        place_labels(top, point_labels(points, baselines, epsilon), [(p.speedup, p.accuracy) for p in points])
    return fig


def combined_figure(per_method: dict[str, list[Point]], baselines: list[Point], epsilon: float, title: str):
    """Every method's trials (faint), its feasible front, chosen point (a star in the
    method's colour) and closest point on the panels of ``method_figure``.

    Returns:
        A matplotlib figure (close it after logging).
    """
    from matplotlib.lines import Line2D

    plt = pyplot()
    every = [p for points in per_method.values() for p in points]
    with plt.rc_context(STYLE):
        fig, top, bottom = panels(title, "modeled speed-up over AR (S_relax)")
        top.set_ylabel("accuracy (95 % interval)")
        ref = budget_reference(baselines, [p for p in every if p.chosen] or every)
        draw_budget(top, bottom, ref, epsilon)
        handles = []
        for i, (method, points) in enumerate(per_method.items()):
            color = f"C{i % 10}"
            draw_trials(
                top,
                bottom,
                points,
                color,
                lambda p: p.speedup,
                lambda p: (p.accuracy, p.ci_low, p.ci_high),
                alpha=0.45,
                star_color=color,
            )
            front = pareto_front(points)
            if len(front) > 1:
                top.plot([p.speedup for p in front], [p.accuracy for p in front], "-", color=color, lw=1.6, zorder=3)
            handles.append(
                Line2D(
                    [],
                    [],
                    color=color,
                    marker="o",
                    lw=1.6,
                    label=f"{method} (front)" if front else f"{method} (no feasible point)",
                )
            )
        draw_baselines(top, bottom, baselines)
        acc_limits(top, every + baselines, ref, epsilon)
        drop_limits(bottom, every, epsilon)
        legend_below(
            fig,
            handles
            + legend_handles(epsilon, ref, with_trials=False, chosen="chosen point (its method's colour)")
            + confirm_handles(every),
        )
        place_labels(
            top, point_labels(every, baselines, epsilon, failed_too=False), [(p.speedup, p.accuracy) for p in every]
        )
    return fig


def knob_figure(points: list[Point], baselines: list[Point], epsilon: float, knob_name: str, log: bool, title: str):
    """One method's modeled speed-up (top) and paired drop (bottom) against its knob,
    one colour per draft length N, strict's speed-up at each N as a dashed line.

    Args:
        points: the method's trial points; those without a knob are left out.
        baselines: strict per N and AR.
        epsilon: the budget; knob_name: the knob's name (x label).
        log: a logarithmic knob axis (the method's search range is log-scaled;
            symmetric-log when a knob is 0 or negative).

    Returns:
        A matplotlib figure, or None when no point has a knob.
    """
    from matplotlib.lines import Line2D

    points = [p for p in points if p.knob is not None]
    if not points:
        return None
    plt = pyplot()
    strict = {p.n_draft: p for p in baselines if p.kind == "strict"}
    with plt.rc_context(STYLE):
        fig, top, bottom = panels(title, f"{knob_name} (the method's knob)")
        top.set_ylabel("modeled speed-up over AR")
        draw_budget(top, bottom, None, epsilon)
        handles = []
        for i, n in enumerate(sorted({p.n_draft for p in points})):
            color = f"C{i % 10}"
            mine = sorted((p for p in points if p.n_draft == n), key=lambda p: p.knob)
            draw_trials(top, bottom, mine, color, lambda p: p.knob, lambda p: (p.speedup, None, None))
            top.plot([p.knob for p in mine], [p.speedup for p in mine], color=color, lw=0.8, alpha=0.5, zorder=2)
            if n in strict:
                top.axhline(strict[n].speedup, color=color, ls=":", lw=1.4, zorder=1)
            handles.append(Line2D([], [], color=color, marker="o", lw=0.8, label=f"N={n} (dotted: strict N={n})"))
        knobs = [p.knob for p in points]
        if log and min(knobs) > 0:
            top.set_xscale("log")
        elif log:
            top.set_xscale("symlog", linthresh=min([k for k in knobs if k > 0] or [0.01]))
        if log:  # plain numbers (0.01, 0.1, 1, 10): read at a glance, and no TeX parser to start for 10^k
            from matplotlib.ticker import FuncFormatter, NullFormatter

            top.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            top.xaxis.set_minor_formatter(NullFormatter())
        set_limits(top, [p.speedup for p in points] + [s.speedup for s in strict.values()] + [1.0])
        drop_limits(bottom, points, epsilon)
        top.axhline(1.0, color=AR, lw=0.8, zorder=1)
        marks = [
            Line2D(
                [],
                [],
                ls="none",
                marker="o",
                markersize=8,
                markerfacecolor="gray",
                markeredgecolor="gray",
                label="feasible (hollow: infeasible, x: pruned)",
            ),
            Line2D(
                [],
                [],
                ls="none",
                marker="*",
                markersize=15,
                markerfacecolor=CHOSEN,
                markeredgecolor="black",
                label="chosen point",
            ),
            Line2D(
                [],
                [],
                ls="none",
                marker="o",
                markersize=14,
                markerfacecolor="none",
                markeredgecolor=CLOSEST,
                label="closest point (none exported)",
            ),
            Line2D([], [], color=BUDGET, ls="--", lw=1.4, label=f"drop = eps ({epsilon:g})"),
        ]
        legend_below(fig, handles + marks + confirm_handles(points))
        place_labels(
            top,
            point_labels(points, [], epsilon, lambda p: p.knob, lambda p: p.speedup),
            [(p.knob, p.speedup) for p in points],
        )
    return fig
