"""The batch table of ``python -m relaxtune.bench.engine``: throughput by batch size.

For each batch size B, on the same prompts (``len(prompts)`` responses of a
fixed length): (A) transformers' batched ``generate`` (AR, B left-padded prompts
per call) and (S) relaxtune's batched strict at draft length N
(``relaxtune.engine.batch.generate_batch``, B rows, continuous refill). Prints the
aggregate tokens/s (all responses' tokens over the wall time of the run),
the mean per-sequence latency (seconds from a response's start to its end),
S's acceptance length, and the ratios S/S(B=1), S/A and S/A(B=1). Repeats are
interleaved (B by B, A then S) so a disturbance from other work hits every
figure; each is the median with its spread.
"""

from __future__ import annotations

import time

from relaxtune.backends.hf import HFBackend
from relaxtune.bench.harness import PAPER, fmt, hf_generate, sync
from relaxtune.engine.batch import Request, generate_batch

__all__ = ["batch_table", "run_hf", "run_ours"]


def run_hf(backend: HFBackend, prompts: list[list[int]], size: int, max_new: int) -> dict:
    """transformers AR, ``size`` prompts per ``generate`` call: tokens/s and mean latency (s)."""
    t0, tokens, latency = time.perf_counter(), 0, 0.0
    for i in range(0, len(prompts), size):
        group = prompts[i : i + size]
        start = time.perf_counter()
        tokens += hf_generate(backend, group, max_new, seed=i)
        latency += (time.perf_counter() - start) * len(group)
    return dict(tps=tokens / (time.perf_counter() - t0), latency=latency / len(prompts))


def run_ours(
    backend: HFBackend,
    prompts: list[list[int]],
    size: int,
    max_new: int,
    n_draft: int,
    method: str = "strict",
    knob: float | None = None,
    clock=time.perf_counter,
) -> dict:
    """relaxtune ``method`` (strict by default; ``"ar"``: AR) at N, ``size`` rows: tokens/s, mean
    latency (s, wall), l_accept (0 for AR). ``clock`` reads the seconds the throughput is over
    (a simulated backend's virtual clock in tests)."""
    t0, tokens, latency, rounds, accepted = clock(), 0, 0.0, 0, 0
    requests = [Request(ids, seed=i, max_new_tokens=max_new) for i, ids in enumerate(prompts)]
    for _, gen in generate_batch(
        backend, requests, method=method, knob=knob, n_draft=n_draft, sampling=PAPER, batch_size=size
    ):
        if isinstance(gen, Exception):
            raise gen
        tokens += gen.stats.response_tokens
        latency += gen.stats.latency_seconds
        rounds += gen.stats.rounds
        accepted += gen.stats.accepted
    sync(getattr(backend, "device", "cpu"))
    return dict(tps=tokens / (clock() - t0), latency=latency / len(prompts), l_accept=accepted / rounds)


def batch_table(
    backend: HFBackend, prompts: list[list[int]], sizes: list[int], n_draft: int, max_new: int, repeats: int
) -> dict[int, dict[str, list[float]]]:
    """Measure and print the table; returns every repeat's figures by B
    (keys ``hf_tps``, ``hf_latency``, ``tps``, ``latency``, ``l_accept``)."""
    out: dict[int, dict[str, list[float]]] = {b: {} for b in sizes}
    for _ in range(repeats):
        for b in sizes:
            for prefix, result in (
                ("hf_", run_hf(backend, prompts, b, max_new)),
                ("", run_ours(backend, prompts, b, max_new, n_draft)),
            ):
                for key, value in result.items():
                    out[b].setdefault(prefix + key, []).append(value)
    base, hf_base = out[sizes[0]]["tps"], out[sizes[0]]["hf_tps"]
    print(
        f"batched: {len(prompts)} responses per run; A = transformers generate (AR, batched), "
        f"S = relaxtune strict N={n_draft} (batched); tok/s aggregate, latency per sequence"
    )
    print(
        f"{'B':>3} | {'A tok/s':>12} | {'A latency s':>12} | {'S tok/s':>12} | {'S latency s':>12} | "
        f"{'l_accept':>10} | {f'S/S(B={sizes[0]})':>12} | {'S/A':>12} | {f'S/A(B={sizes[0]})':>12}"
    )
    for b in sizes:
        r = out[b]
        print(
            f"{b:>3} | {fmt(r['hf_tps']):>12} | {fmt(r['hf_latency'], 1):>12} | {fmt(r['tps']):>12} | "
            f"{fmt(r['latency'], 1):>12} | {fmt(r['l_accept']):>10} | "
            f"{fmt([x / y for x, y in zip(r['tps'], base)]):>12} | "
            f"{fmt([x / y for x, y in zip(r['tps'], r['hf_tps'])]):>12} | "
            f"{fmt([x / y for x, y in zip(r['tps'], hf_base)]):>12}"
        )
    return out
