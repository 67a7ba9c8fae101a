"""The pieces the tuning job's figures (``relaxtune.report.figures``) and the batch-size
figure (``relaxtune.report.batch_figure``) are drawn from (matplotlib, Agg): the style and
colours, the two panels, trials with their intervals and marks, strict and AR, the budget,
the axis limits, labels placed with leader lines where they overlap nothing, and the legend
under the panels with its margins.
"""

from __future__ import annotations

import math

from ..tune.pareto import Point

__all__ = [
    "STYLE",
    "STRICT",
    "AR",
    "CHOSEN",
    "CLOSEST",
    "BUDGET",
    "CONFIRMED",
    "pyplot",
    "panels",
    "draw_trials",
    "draw_baselines",
    "budget_reference",
    "draw_budget",
    "set_limits",
    "drop_limits",
    "acc_limits",
    "place_labels",
    "point_labels",
    "legend_below",
    "legend_handles",
    "confirm_handles",
]

STYLE = {
    "font.size": 10,
    "axes.titlesize": 12,
    "axes.labelsize": 10.5,
    "legend.fontsize": 9.5,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
}
STRICT, AR, CHOSEN, CLOSEST, BUDGET, CONFIRMED = "dimgray", "black", "gold", "crimson", "tab:red", "tab:green"
# label offsets tried in order (points), until one overlaps neither another label nor the panel's edge
OFFSETS = [
    (16, 16),
    (16, -24),
    (-16, 16),
    (-16, -24),
    (36, 40),
    (36, -46),
    (-36, 40),
    (-36, -46),
    (60, 4),
    (-60, 4),
    (0, 60),
    (0, -64),
    (-36, -90),
    (36, -90),
    (-36, -134),
    (36, -134),
]


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panels(title: str, xlabel: str):
    """A figure with the accuracy (or speed-up) panel over the drop panel."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8.8, 8.4), dpi=100, sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    top.set_title(title)
    bottom.set_xlabel(xlabel)
    bottom.set_ylabel("accuracy drop vs strict\n(paired, with its bounds)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig, top, bottom


def _bars(ax, rows: list[tuple[float, float, float | None, float | None]], color, alpha: float = 0.6) -> None:
    """Vertical intervals ``[low, high]`` around ``y``, one per ``(x, y, low, high)`` row
    (none where a bound is unknown), drawn as one collection."""
    rows = [r for r in rows if r[2] is not None and r[3] is not None]
    if not rows:
        return
    x, y, low, high = zip(*rows)
    yerr = [[max(v - lo, 0.0) for v, lo in zip(y, low)], [max(hi - v, 0.0) for v, hi in zip(y, high)]]
    ax.errorbar(x, y, yerr=yerr, fmt="none", ecolor=color, elinewidth=1.2, capsize=3, alpha=alpha, zorder=2)


def _trial_markers(ax, rows: list[tuple[float, float, Point]], color, alpha: float = 1.0) -> None:
    """The trials' markers, one collection per kind: pruned (x), feasible (filled) and
    infeasible (hollow) circles."""
    pruned = [(x, y) for x, y, p in rows if p.state == "PRUNED"]
    ended = [(x, y, p.feasible) for x, y, p in rows if p.state != "PRUNED"]
    if pruned:
        xs, ys = zip(*pruned)
        ax.scatter(xs, ys, marker="x", s=40, color=color, alpha=0.7 * alpha, zorder=3)
    if ended:
        xs, ys, feasible = zip(*ended)
        ax.scatter(
            xs,
            ys,
            marker="o",
            s=44,
            facecolors=[color if f else "white" for f in feasible],
            edgecolors=color,
            linewidths=1.5,
            alpha=alpha,
            zorder=4,
        )


def _marks(ax, x: float, y: float, p: Point, star_color=CHOSEN) -> None:
    """The chosen star and the closest ring, drawn under the point's own marker."""
    if p.chosen:
        ax.scatter([x], [y], marker="*", s=420, color=star_color, edgecolors="black", linewidths=1.0, zorder=3.5)
    if p.closest:
        ax.scatter([x], [y], marker="o", s=300, facecolors="none", edgecolors=CLOSEST, linewidths=2.2, zorder=3.5)


def draw_trials(top, bottom, points: list[Point], color, x_of, y_of, alpha: float = 1.0, star_color=CHOSEN) -> None:
    """Each trial on both panels: ``y_of(p)`` (value, low, high) on the top panel, its drop below.
    Marks of one kind go in one collection per panel (matplotlib's cost is per call)."""
    above, below, confirmed = [], [], {}
    for p in points:
        x = x_of(p)
        y, low, high = y_of(p)
        above.append((x, y, low, high, p))
        _marks(top, x, y, p, star_color)
        if p.drop is not None:
            below.append((x, p.drop, p.drop_lcb, p.drop_ucb, p))
            _marks(bottom, x, p.drop, p, star_color)
        if p.confirm_drop_ucb is not None:
            confirmed.setdefault(CONFIRMED if p.confirm_passed is not False else CLOSEST, []).append(
                (x, p.confirm_drop_ucb)
            )
    for ax, rows in ((top, above), (bottom, below)):
        _bars(ax, [r[:4] for r in rows], color, 0.5 * alpha)
        _trial_markers(ax, [(x, y, p) for x, y, _, _, p in rows], color, alpha)
    for mark_color, marks in confirmed.items():
        xs, ys = zip(*marks)
        bottom.scatter(xs, ys, marker="_", s=420, linewidths=2.5, zorder=5, color=mark_color)


def draw_baselines(top, bottom, baselines: list[Point]) -> None:
    """Strict at each N (diamonds) and AR (a square): accuracy with its interval above, drop 0 below."""
    for p in baselines:
        marker, color = ("s", AR) if p.kind == "ar" else ("D", STRICT)
        _bars(top, [(p.speedup, p.accuracy, p.ci_low, p.ci_high)], color)
        top.scatter([p.speedup], [p.accuracy], marker=marker, s=50, color=color, zorder=5)
        bottom.scatter([p.speedup], [0.0], marker=marker, s=50, color=color, zorder=5)


def budget_reference(baselines: list[Point], points: list[Point]) -> Point | None:
    """The strict point whose accuracy the budget is drawn under: at the N of the
    chosen (else the closest) point, else the first strict N."""
    strict = {p.n_draft: p for p in baselines if p.kind == "strict"}
    for flag in ("chosen", "closest"):
        for p in points:
            if getattr(p, flag) and p.n_draft in strict:
                return strict[p.n_draft]
    return next(iter(strict.values()), None)


def draw_budget(top, bottom, ref: Point | None, epsilon: float) -> None:
    """``strict - epsilon`` shaded under strict's accuracy, and ``drop = epsilon`` with
    the infeasible side shaded."""
    if ref is not None:
        top.axhspan(ref.accuracy - epsilon, ref.accuracy, color="tab:green", alpha=0.10, zorder=0)
        top.axhline(ref.accuracy - epsilon, color="tab:green", ls="--", lw=1.2, zorder=1)
    bottom.axhline(0.0, color=STRICT, lw=0.8, zorder=1)
    bottom.axhline(epsilon, color=BUDGET, ls="--", lw=1.4, zorder=1)
    bottom.axhspan(epsilon, max(1.0, epsilon + 1.0), color=BUDGET, alpha=0.06, zorder=0)


def set_limits(ax, values: list[float], pad: float = 0.08) -> None:
    """The y limits around ``values`` (None and non-finite ones left out), padded by ``pad`` of their span."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return
    lo, hi = min(values), max(values)
    span = max(hi - lo, 0.05)
    ax.set_ylim(lo - pad * span - 0.02, hi + pad * span + 0.02)


def drop_limits(bottom, points: list[Point], epsilon: float) -> None:
    """The drop panel's y limits: 0, ``epsilon`` and every point's drop bounds."""
    set_limits(bottom, [0.0, epsilon] + [v for p in points for v in (p.drop_lcb, p.drop_ucb, p.confirm_drop_ucb)])


def acc_limits(top, points: list[Point], ref: Point | None, epsilon: float) -> None:
    """The accuracy panel's y limits: every point's interval and the budget line under ``ref``."""
    values = [v for p in points for v in (p.ci_low, p.ci_high, p.accuracy)]
    set_limits(top, values + ([ref.accuracy - epsilon] if ref is not None else []))


def place_labels(ax, items: list[tuple[float, float, str, str]], avoid: list[tuple[float, float]] = ()) -> None:
    """Label points ``(x, y, text, colour)`` with leader lines, each where its text
    overlaps neither an earlier label, nor a labelled point, nor the panel's edge,
    and, where one such place exists, no point of ``avoid`` either; where no
    offset is clear, at the one inside the panel that overlaps the fewest labels."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)

    def boxes(points):
        return [Bbox.from_bounds(px - 7, py - 7, 14, 14) for px, py in (ax.transData.transform(p) for p in points)]

    def place(x, y, text, color, dx, dy):
        ann = ax.annotate(
            text,
            (x, y),
            xytext=(dx, dy),
            textcoords="offset points",
            fontsize=9,
            ha="left" if dx > 0 else "right" if dx < 0 else "center",
            va="bottom" if dy > 0 else "top",
            bbox=dict(boxstyle="round,pad=0.25", fc="white", ec=color, lw=1.0, alpha=0.92),
            arrowprops=dict(arrowstyle="-", color=color, lw=1.0),
            zorder=6,
        )
        ann.update_positions(renderer)
        return ann, Text.get_window_extent(ann, renderer).padded(4)  # the text alone, not its leader line

    taken, others = boxes([(x, y) for x, y, _, _ in items]), boxes(avoid)
    for x, y, text, color in items:
        placed, scores = None, []
        for strict, (dx, dy) in ((strict, offset) for strict in (True, False) for offset in OFFSETS):
            ann, box = place(x, y, text, color, dx, dy)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            crossed = sum(box.overlaps(b) for b in taken + (others if strict else []))
            if inside and not crossed:
                placed = box
                break
            ann.remove()
            scores.append((not inside, crossed, dx, dy))
        if placed is None:  # no clear place: the least crowded one, inside the panel where possible
            _, _, dx, dy = min(scores)
            _, placed = place(x, y, text, color, dx, dy)
        taken.append(placed)


def _short(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def point_labels(
    points: list[Point],
    baselines: list[Point],
    epsilon: float,
    x_of=lambda p: p.speedup,
    y_of=lambda p: p.accuracy,
    failed_too: bool = True,
) -> list[tuple]:
    """Labels for strict at each N, AR, the chosen point (its search and
    confirmation bounds), the closest point and, with ``failed_too``, every
    point that failed confirmation (both bounds: the search passed it, fresh
    samples did not)."""

    def over(bound: float | None) -> str:
        return f" > eps {epsilon:g}" if bound is not None and bound > epsilon else ""

    items = []
    for p in points:
        failed = failed_too and p.confirm_drop_ucb is not None and p.confirm_passed is False
        if p.chosen:
            bound = f"drop <= {_short(p.drop_ucb)}" + (
                f", confirmed <= {_short(p.confirm_drop_ucb)}" if p.confirm_drop_ucb is not None else ""
            )
            items.append((x_of(p), y_of(p), f"chosen: {p.label}\n{bound}", "darkgoldenrod"))
        elif p.closest or failed:
            why = "infeasible" if not p.feasible else "failed confirmation" if failed else "not exported"
            head = f"closest ({why})" if p.closest else why
            bound = f"drop <= {_short(p.drop_ucb)}{over(p.drop_ucb)}" + (
                f", fresh <= {_short(p.confirm_drop_ucb)}{over(p.confirm_drop_ucb)}" if failed else ""
            )
            items.append((x_of(p), y_of(p), f"{head}: {p.label}\n{bound}", CLOSEST))
    for p in baselines:
        if x_of(p) is not None:
            items.append((x_of(p), y_of(p), p.label, AR if p.kind == "ar" else STRICT))
    return items


def legend_below(fig, handles: list) -> None:
    """The legend under the panels (it never hides a point), and the margins around them:
    fixed in inches for the figures' one size and font (what ``tight_layout`` found for
    them, by title lines and legend rows), since measuring every tick label for a layout
    engine took 40 % of the drawing."""
    rows = math.ceil(len(handles) / 3)
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False)
    width, height = fig.get_size_inches()
    lines = max(ax.get_title().count("\n") + 1 for ax in fig.axes)
    fig.subplots_adjust(
        left=1.0 / width,
        right=1 - 0.18 / width,
        bottom=(0.65 + 0.3 * rows) / height,
        top=1 - (0.14 + 0.22 * lines) / height,
        hspace=0.065,
    )


def legend_handles(
    epsilon: float, ref: Point | None, color="tab:blue", with_trials: bool = True, chosen: str = "chosen point"
) -> list:
    """Legend entries for the trials (``with_trials``), strict, AR, the chosen and closest points,
    the intervals, the budget under ``ref`` and the line ``drop = epsilon``."""
    from matplotlib.lines import Line2D

    def mark(marker, label, face, edge=None, size=8, **kw):
        return Line2D(
            [],
            [],
            ls="none",
            marker=marker,
            markersize=size,
            markerfacecolor=face,
            markeredgecolor=edge or face,
            label=label,
            **kw,
        )

    out = []
    if with_trials:
        out += [
            mark("o", "feasible trial", color),
            mark("o", "infeasible trial", "white", color),
            mark("x", "pruned trial (part of the problems)", color, color),
        ]
    out += [
        mark("D", "strict (per N)", STRICT),
        mark("s", "AR (strict's distribution)", AR),
        mark("*", chosen, CHOSEN, "black", 15),
        mark("o", "closest point (none exported)", "none", CLOSEST, 14),
        Line2D([], [], color="gray", lw=1.2, label="95 % interval / drop bounds"),
    ]
    if ref is not None:
        out.append(
            Line2D(
                [], [], color="tab:green", ls="--", lw=1.2, label=f"budget: strict N={ref.n_draft} - eps ({epsilon:g})"
            )
        )
    out.append(Line2D([], [], color=BUDGET, ls="--", lw=1.4, label=f"drop = eps ({epsilon:g})"))
    return out


def confirm_handles(points: list[Point]) -> list:
    """Legend entries for the confirmation bounds the figure draws."""
    from matplotlib.lines import Line2D

    kinds = {p.confirm_passed is not False for p in points if p.confirm_drop_ucb is not None}
    return [
        Line2D([], [], ls="none", marker="_", markersize=16, markeredgewidth=2.5, color=color, label=label)
        for passed, color, label in (
            (True, CONFIRMED, "confirmation bound (fresh samples)"),
            (False, CLOSEST, "failed confirmation (fresh bound)"),
        )
        if passed in kinds
    ]
