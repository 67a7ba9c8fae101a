"""One-sided coverage of the drop bound: the product's bound beside the old Student-t bound.

    python -m relaxtune.bench.coverage [--datasets 2000] [--confidence 0.9,0.95,0.975] [--quick] [--json PATH]

Simulated paired data with shared problem difficulty and common random
numbers: problem j has its own discordance ``delta_j ~ Beta(nu delta, nu (1 - delta))``
(``--concentration nu``, default 1: most problems never flip and a few flip
often, in every repeat) and direction ``theta_j ~ Beta(4 theta, 4 (1 - theta))``;
each of its samples is strict-only with probability ``delta_j theta_j``,
relaxed-only with ``delta_j (1 - theta_j)``, else concordant (common random
numbers keep relaxed on strict's trajectory). The true drop over problems like
these is ``delta (2 theta - 1)``, set to epsilon = ``min(0.05, delta / 2)``: the
boundary where a certification is wrong. Grid: problems 8, 30, 100, 400;
discordance 1 % to 40 %; repeats 1 and 48.

Coverage is the share of datasets whose upper bound is at or above the true
drop; its Monte Carlo standard error ``sqrt(c (1 - c) / datasets)`` at the
nominal c is printed; a cell below nominal minus 3 standard errors is marked
``!``. With one sample per problem the product's bound covers D exactly when
its exact p-value at D exceeds 1 - c (the bound inverts that monotone test), so
the cell is read from ``exact_pvalue_table`` (each value at most the bound's own;
``--check`` datasets per cell are also bounded directly and must agree). With
repeats the product's bound is the same exact bound on each problem's first
repeat (drawn from the problem's counts: repeats are exchangeable), read from the
same table; "betting" is the cluster betting bound it replaced (valid, but with a
higher floor).
"old t" is the bound this replaced (Student t over samples taken as
independent); "cluster t" (repeats only) is a t bound over per-problem means,
shown as the rejected alternative.
``--json PATH`` (every benchmark takes it) also writes the tables, the command and the
machine as JSON (``relaxtune.bench.results``), which the documentation's benchmarks page renders.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from relaxtune.bench.results import Recorder, add_json_option
from relaxtune.certify.cluster_bound import betting_upper
from relaxtune.certify.paired_bound import exact_pvalue_table, exact_upper

PROBLEMS = (8, 30, 100, 400)
DISCORDANCE = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4)
REPEATS = (1, 48)


def true_drop(delta: float) -> float:
    """The cell's true drop, which is also its epsilon."""
    return min(0.05, delta / 2)


def simulate(
    rng: np.random.Generator,
    datasets: int,
    problems: int,
    repeats: int,
    delta: float,
    drop: float,
    concentration: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Strict-only and relaxed-only counts per problem, ``[datasets, problems]`` each (module doc)."""
    theta = (1.0 + drop / delta) / 2.0
    d_j = rng.beta(concentration * delta, concentration * (1.0 - delta), size=(datasets, problems))
    t_j = rng.beta(4 * theta, 4 * (1 - theta), size=d_j.shape) if 0 < theta < 1 else np.full(d_j.shape, theta)
    p10, p01 = d_j * t_j, d_j * (1 - t_j)
    b = rng.binomial(repeats, p10)
    c = rng.binomial(repeats - b, np.where(p10 < 1, p01 / np.maximum(1 - p10, 1e-300), 0.0))
    return b, c


def old_t_upper(b: np.ndarray, c: np.ndarray, n: int, confidence: float) -> np.ndarray:
    """The replaced bound: Student t on the mean of per-sample differences (taken as
    independent), the Wilson bound of the discordant share when they are all equal."""
    from scipy import stats

    mean = (b - c) / n
    var = (b + c - n * mean**2) / (n - 1) if n > 1 else np.zeros_like(mean)
    z = stats.norm.ppf(confidence)
    t = mean + stats.t.ppf(confidence, max(n - 1, 1)) * np.sqrt(np.maximum(var, 0) / n)
    # Wilson bounds of the discordant share k / n at k = 0 (upper) and k = n (lower)
    degenerate = np.where(b + c == 0, z * z / (n + z * z), np.where(b == n, 1.0, -n / (n + z * z)))
    return np.where(var > 0, t, degenerate)


def cluster_t_upper(d: np.ndarray, confidence: float) -> np.ndarray:
    """Student t on the per-problem mean differences ``d`` ``[S, K]``."""
    from scipy import stats

    k = d.shape[1]
    return d.mean(1) + stats.t.ppf(confidence, k - 1) * d.std(1, ddof=1) / math.sqrt(k)


def cell(
    rng, datasets: int, problems: int, repeats: int, delta: float, confidence: float, concentration: float, check: int
) -> dict:
    """Coverage of the three bounds in one cell, and how many direct checks disagreed."""
    drop = true_drop(delta)
    b, c = simulate(rng, datasets, problems, repeats, delta, drop, concentration)
    n = problems * repeats
    bt, ct = b.sum(1), c.sum(1)
    out = {
        "old_t": float(np.mean(old_t_upper(bt, ct, n, confidence) >= drop)),
        "cluster_t": None,
        "mismatch": 0,
        "betting": None,
    }
    tb, tc, p = exact_pvalue_table(problems, drop, confidence)
    lookup = np.zeros((problems + 1, problems + 1))
    lookup[tb, tc] = p
    if repeats == 1:
        covered = lookup[bt, ct] > 1 - confidence
        for i in rng.choice(datasets, size=min(check, datasets), replace=False):
            out["mismatch"] += (exact_upper(n, int(bt[i]), int(ct[i]), confidence) >= drop) != covered[i]
    else:
        d = (b - c) / repeats
        x = (1 + d) / 2
        upper = np.concatenate([betting_upper(part, confidence) for part in np.array_split(x, -(-datasets // 250))])
        out["betting"] = float(np.mean(2 * upper - 1 >= drop))
        u = rng.random(b.shape) * repeats  # the first repeat: strict-only with chance b / r, relaxed-only c / r
        fb, fc = (u < b).sum(1), ((u >= b) & (u < b + c)).sum(1)
        covered = lookup[fb, fc] > 1 - confidence
        out["cluster_t"] = float(np.mean(cluster_t_upper(d, confidence) >= drop))
    out["product"] = float(np.mean(covered))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=2000, help="simulated datasets per cell")
    ap.add_argument("--confidence", default="0.9,0.95,0.975", help="one-sided confidences, comma separated")
    ap.add_argument("--concentration", type=float, default=1.0, help="nu: smaller concentrates flips in fewer problems")
    ap.add_argument("--check", type=int, default=3, help="datasets per cell bounded directly (one sample per problem)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="problems 8 and 30 only, 500 datasets")
    add_json_option(ap)
    args = ap.parse_args(argv)
    rec = Recorder("coverage", "Coverage of the drop bound", argv)
    datasets = 500 if args.quick else args.datasets
    grid = [(k, r) for r in REPEATS for k in (PROBLEMS[:2] if args.quick else PROBLEMS)]
    rng = np.random.default_rng(args.seed)
    mark = lambda v, c, se: "-" if v is None else f"{v:.3f}" + (" !" if v < c - 3 * se else "")  # noqa: E731
    for confidence in (float(x) for x in args.confidence.split(",")):
        se = math.sqrt(confidence * (1 - confidence) / datasets)
        start, low, mismatches = time.perf_counter(), {"product": 0, "old_t": 0, "cluster_t": 0, "betting": 0}, 0
        print(
            f"\none-sided coverage at nominal {confidence:g} ({datasets} datasets per cell, Monte Carlo SE "
            f"{se:.4f}; ! = below nominal - 3 SE)\n"
        )
        print(
            "| problems | repeats | discordance | true drop = epsilon | product bound | old t bound | cluster t "
            "| betting |"
        )
        print("|---|---|---|---|---|---|---|---|")
        rows = []
        for problems, repeats in grid:
            for delta in DISCORDANCE:
                res = cell(rng, datasets, problems, repeats, delta, confidence, args.concentration, args.check)
                mismatches += res["mismatch"]
                for key in low:
                    low[key] += res[key] is not None and res[key] < confidence - 3 * se
                rows.append(
                    [
                        problems,
                        repeats,
                        f"{delta:.2f}",
                        f"{true_drop(delta):.3f}",
                        *(mark(res[k], confidence, se) for k in ("product", "old_t", "cluster_t", "betting")),
                    ]
                )
                print("| " + " | ".join(str(v) for v in rows[-1]) + " |")
        summary = (
            f"cells below nominal - 3 SE: product {low['product']}, old t {low['old_t']}, cluster t "
            f"{low['cluster_t']}, betting {low['betting']}; direct checks disagreeing with the table: "
            f"{mismatches} ({time.perf_counter() - start:.0f} s)"
        )
        print(f"\n{summary}")
        rec.table(
            f"one-sided coverage at nominal {confidence:g} ({datasets} datasets per cell, "
            f"Monte Carlo SE {se:.4f}; ! = below nominal - 3 SE)",
            [
                "problems",
                "repeats",
                "discordance",
                "true drop = epsilon",
                "product bound",
                "old t bound",
                "cluster t",
                "betting",
            ],
            rows,
            [summary],
            show=False,
        )
    rec.write(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
