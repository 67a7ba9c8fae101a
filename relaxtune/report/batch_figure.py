"""The figure of modeled speed-up against serving batch size (matplotlib, Agg), drawn
from a tuned config's ``by_batch_size`` to be read at MLflow's preview size: one line per
method's confirmed point and per strict draft length, the best point per batch size
ringed, batched AR (speed-up 1: plain decoding) as the reference line, the batch sizes
from which speculative decoding stops paying shaded, and the declared batch size marked.
"""

from __future__ import annotations

from .figure_parts import STRICT, STYLE, pyplot

__all__ = ["batch_figure"]

STRICT_STYLES = ["--", ":", "-.", (0, (5, 1, 1, 1))]


def batch_figure(config, title: str):
    """Modeled speed-up over batched AR against serving batch size, per point (module doc).

    Args:
        config: a ``relaxtune.report.config_schema.TunedConfig`` with ``by_batch_size``.
        title: the figure's title.

    Returns:
        A matplotlib figure (close it after logging), or None when the config has no
        ``by_batch_size``.
    """
    batches = config.by_batch_size
    if batches is None:
        return None
    plt = pyplot()
    sizes = sorted(batches.best)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(8.8, 5.6), dpi=100)
        ax.set_title(title)
        ax.set_xlabel("serving batch size")
        ax.set_ylabel("modeled speed-up over batched AR\n(at the same batch size)")
        ax.grid(alpha=0.3)
        if len(sizes) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
        strict_i = method_i = 0
        for label, speeds in batches.speedups.items():
            xs = sorted(speeds)
            ys = [speeds[b] for b in xs]
            if label.startswith("strict"):
                style = dict(color=STRICT, ls=STRICT_STYLES[strict_i % len(STRICT_STYLES)], marker="D", ms=5)
                strict_i += 1
            else:
                point = config.methods[label]
                knob = "".join(f" {k}={v:.3g}" for k, v in (point.knobs or {}).items())
                label = f"{label}{knob} N={point.n_draft}"
                style = dict(color=f"C{method_i % 10}", ls="-", marker="o", ms=6)
                method_i += 1
            ax.plot(xs, ys, lw=1.6, label=label, **style)
        best = [(b, v.modeled_speedup) for b, v in sorted(batches.best.items())]
        ax.scatter(
            [b for b, _ in best],
            [s for _, s in best],
            s=170,
            facecolors="none",
            edgecolors="gold",
            linewidths=2.2,
            zorder=5,
            label="best confirmed point at that batch size",
        )
        ax.axhline(1.0, color="black", lw=1.2, label="batched AR (plain decoding)")
        if batches.stops_paying_at is not None:
            low = batches.stops_paying_at
            ax.axvspan(low / 1.2, max(sizes) * 1.4, color="tab:red", alpha=0.08, label=f"stops paying from batch {low}")
        declared = config.recommendation.batch_size
        if declared in batches.best:
            ax.axvline(declared, color="tab:green", ls=":", lw=1.4, label=f"declared batch size {declared}")
        values = [s for speeds in batches.speedups.values() for s in speeds.values()] + [1.0]
        pad = 0.08 * (max(values) - min(values) or 1.0)
        ax.set_ylim(min(values) - pad, max(values) + pad)
        if len(sizes) > 1:
            ax.set_xlim(min(sizes) / 1.4, max(sizes) * 1.4)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
        fig.subplots_adjust(left=0.13, right=0.97, top=0.9, bottom=0.36)
    return fig
