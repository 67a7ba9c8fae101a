"""Cost of one verification round, as a ratio to one softmax over the same logits.

    python -m relaxtune.bench.round [--quick] [--vocab 151936] [--threads 2] [--json PATH]

For each method, draft length N and batch size B, times ``verify_rounds`` on
random rows ``[B, N+1, V]`` (hot path: ``validate=False``, rows built by the
caller) and one ``torch.softmax`` over logits of the same shape, and prints the
best times and their ratio. Targets (issue 2): under 2x for methods whose
accept test needs only p(x), q(x); under 5x for methods that need full rows at
every drafted position.
"""

from __future__ import annotations

import argparse
import time

import torch

from relaxtune.bench.results import Recorder, add_json_option
from relaxtune.decoding.methods import METHODS, Needs
from relaxtune.decoding.round import verify_rounds
from relaxtune.decoding.sampling import sample_from_rows

TEMPERATURE = 0.6


def _best_seconds(fn, min_time: float = 0.2, min_reps: int = 5) -> float:
    """Fastest of repeated calls (seconds): the least disturbed by page faults of
    fresh large allocations and by other processes."""
    fn()  # warm-up
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _inputs(b: int, n: int, v: int, g: torch.Generator) -> dict:
    z_p = torch.randn(b, n + 1, v, generator=g) * 3
    z_q = z_p + torch.randn(b, n + 1, v, generator=g)
    p = (z_p / TEMPERATURE).softmax(-1)
    q = (z_q / TEMPERATURE).softmax(-1)
    u = torch.rand(b * n, generator=g)
    x = sample_from_rows(q[:, :n].reshape(-1, v), u).reshape(b, n)
    return dict(p=p, q=q, draft_ids=x, z_p=z_p, z_q=z_q, temperature=TEMPERATURE)


def _greedy(inputs: dict) -> dict:
    """The same rows with greedy drafts: the drafter's argmax, q one-hot."""
    q = inputs["q"]
    x = q[:, : inputs["draft_ids"].shape[1]].argmax(-1)
    return inputs | {"draft_ids": x, "q": torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]).to(q.dtype)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary size V (Qwen: 151936)")
    ap.add_argument("--drafts", default="3,5,10,20", help="draft lengths N, comma separated")
    ap.add_argument("--batches", default="1,16", help="batch sizes B, comma separated")
    ap.add_argument("--methods", default=",".join(METHODS), help="method ids, comma separated")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="N = 3, 10 and B = 1, 16 only, shorter timing")
    add_json_option(ap)
    args = ap.parse_args(argv)
    rec = Recorder("round", "Cost of one verification round", argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    drafts = [3, 10] if args.quick else [int(s) for s in args.drafts.split(",")]
    batches = [int(s) for s in args.batches.split(",")]
    methods = [METHODS[m] if m in METHODS else None for m in args.methods.split(",")]
    if None in methods:
        ap.error(f"unknown method in {args.methods!r}; known: {', '.join(METHODS)}")
    min_time = 0.05 if args.quick else 0.2

    g = torch.Generator().manual_seed(0)
    print(f"verify_rounds vs softmax, V = {args.vocab}, threads = {torch.get_num_threads()}, torch {torch.__version__}")
    print(f"{'method':<16} {'B':>3} {'N':>3} {'round ms':>9} {'softmax ms':>10} {'ratio':>6} {'target':>6}  ok")
    failures, table = 0, []
    for b in batches:
        for n in drafts:
            inputs = _inputs(b, n, args.vocab, g)
            t_soft = _best_seconds(lambda: torch.softmax(inputs["z_p"], -1), min_time)
            for spec in methods:
                knob = spec.grid[len(spec.grid) // 2] if spec.has_knob else None
                gen = torch.Generator().manual_seed(1)
                rows = _greedy(inputs) if Needs.GREEDY_DRAFTS in spec.needs else inputs

                def run():
                    verify_rounds(**rows, method=spec, knob=knob, generator=gen, validate=False)

                t = _best_seconds(run, min_time)
                target = 2.0 if spec.pointwise else 5.0
                ok = t / t_soft < target
                failures += not ok
                print(
                    f"{spec.id:<16} {b:>3} {n:>3} {t * 1e3:>9.3f} {t_soft * 1e3:>10.3f} "
                    f"{t / t_soft:>6.2f} {target:>6.1f}  {'yes' if ok else 'NO'}"
                )
                table.append([spec.id, b, n, round(t * 1e3, 3), round(t_soft * 1e3, 3), round(t / t_soft, 2), target])
    print(f"{failures} configuration(s) over target")
    rec.table(
        f"verify_rounds against one softmax over the same logits, V = {args.vocab}, {torch.get_num_threads()} threads",
        ["method", "B", "N", "round ms", "softmax ms", "ratio", "target"],
        table,
        [f"{failures} configuration(s) over target"],
        show=False,
    )
    rec.write(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
