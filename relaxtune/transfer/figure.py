"""The transfer matrix as a heatmap: one panel per method, rows the source task
(where the point was tuned), columns the target task (where it is judged)."""

from __future__ import annotations

__all__ = ["matrix_figure", "cell_text", "WITHIN", "OVER"]

WITHIN, OVER = "\u2713", "\u2717"  # check and cross marks (DejaVu Sans has both)


def cell_text(cell) -> str:
    """A cell's label: its mark, drop bound vs the target's epsilon, modeled speed-up and n."""
    if cell.error:
        return f"{OVER} failed"
    m = cell.metrics
    return (
        f"{WITHIN if cell.within else OVER} \u2264{m['drop_ucb']:.3f}\n\u03b5 {cell.epsilon:g} \u00b7 "
        f"{m['speedup']:.2f}x\nn={m['n']}"
    )


def _row_label(matrix, method: str, source: str) -> str:
    """The source task and its tuned point, e.g. ``humaneval\ndelta=1 N=4``."""
    from ..decoding.methods import get_method

    c = next((c for c in matrix.cells if (c.method, c.source) == (method, source)), None)
    if c is None:
        return source
    knob = "" if c.knob is None else f"{get_method(method).knob}={c.knob:.3g} "
    return f"{source}\n{knob}N={c.n_draft}"


def matrix_figure(matrix):
    """Heatmaps of a ``relaxtune.transfer.run.TransferMatrix``, one panel per method.

    A cell's colour is its drop upper bound minus the target's epsilon (accuracy
    units; green within the budget, red over it); its text gives the mark
    (check: within epsilon, cross: over it or failed), the bound, epsilon, the
    modeled speed-up on the target and n. Cells over the budget are also
    hatched; the diagonal (each task's own point, on its confirmation samples)
    is outlined; grey cells are sources without a confirmed point.

    Returns:
        A matplotlib ``Figure`` (close it after use).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    tasks, methods = matrix.tasks, matrix.methods
    k = len(tasks)
    margins = [c.metrics["drop_ucb"] - c.epsilon for c in matrix.cells if c.metrics]
    lim = 1.5 * max([abs(v) for v in margins] + [0.05])  # the darkest shades unused: the text stays legible
    norm = TwoSlopeNorm(vmin=-lim, vcenter=0.0, vmax=lim)
    size = (0.8 + len(methods) * (1.4 + 2.0 * k), 1.6 + 1.3 * k)
    fig, axes = plt.subplots(1, len(methods), figsize=size, squeeze=False, layout="constrained")
    image = None
    for ax, method in zip(axes[0], methods):
        grid = np.full((k, k), np.nan)
        for i, source in enumerate(tasks):
            for j, target in enumerate(tasks):
                c = matrix.cell(method, source, target)
                if c is not None and c.metrics:
                    grid[i, j] = c.metrics["drop_ucb"] - c.epsilon
        ax.set_facecolor("0.88")  # no confirmed point (and failed cells)
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn_r", norm=norm)
        for i, source in enumerate(tasks):
            for j, target in enumerate(tasks):
                c = matrix.cell(method, source, target)
                text = "no tuned\npoint" if c is None else cell_text(c)
                ax.text(
                    j,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="0.3" if c is None else "black",
                    bbox=None if c is None else dict(boxstyle="round,pad=0.25", fc="white", ec="none", alpha=0.75),
                )
                if c is not None and not c.within:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.35", lw=0))
                if source == target:
                    ax.add_patch(Rectangle((j - 0.47, i - 0.47), 0.94, 0.94, fill=False, edgecolor="black", lw=1.8))
        ax.set_xticks(range(k), tasks, rotation=20, ha="right")
        ax.set_yticks(range(k), [_row_label(matrix, method, source) for source in tasks])
        ax.set_xlabel("target task (judged on)")
        ax.set_title(method)
    axes[0][0].set_ylabel("source task (tuned on)")
    fig.suptitle(
        f"Transfer: drop upper bound vs the target's \u03b5 ({matrix.confidence_each:.2%} one-sided each; "
        f"{len(matrix.cells)} cells, {matrix.confidence:.0%} together)",
        fontsize=9,
    )
    bar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85)
    bar.set_label("drop bound \u2212 \u03b5 (accuracy)", fontsize=8)
    return fig
