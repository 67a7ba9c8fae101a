"""The llama.cpp rows of ``python -m relaxtune.bench.engine --runtime llamacpp``.

On the embedded pair's GGUF files (or ``--drafter`` / ``--verifier`` GGUF paths),
in one process, for each batch size B and the same prompts (``len(prompts)``
responses of a fixed length, EOS ignored):

- (L) llama.cpp's own batched AR on the verifier's GGUF: its low-level API, one
  ``llama_decode`` of one token per sequence per step, each sequence sampled by
  its own llama.cpp sampler chain (top-k 20, top-p 0.95, temperature 0.6), B
  prompts at a time;
- (S) relaxtune strict at N = ``--batch-n-draft`` on ``LlamaCppBackend`` (the same
  verifier GGUF, the embedded drafter's GGUF), ``generate_batch`` with B rows;
- (R) one relaxed rule (cactus at delta = 1, the single table's) the same way.

Prints aggregate tokens/s, S's and R's acceptance lengths, and the ratios S/L,
R/L and S/S(B=first). Repeats are interleaved (B by B: L, S, R); every figure is
the median with its spread.
"""

from __future__ import annotations

import time

from relaxtune.backends.llamacpp import LlamaCppBackend
from relaxtune.bench.batching import run_ours
from relaxtune.bench.harness import PAPER, fmt

__all__ = ["run_llamacpp_ar", "llamacpp_table", "RELAXED"]

RELAXED = ("cactus", 1.0)  # the relaxed rule of the rows (the single table's (e))


def run_llamacpp_ar(backend: LlamaCppBackend, prompts: list[list[int]], size: int, max_new: int, seed: int = 0) -> dict:
    """llama.cpp's batched AR on the backend's verifier context, ``size`` prompts at a
    time: aggregate tokens/s and mean latency per sequence (s)."""
    model = backend.verifier
    L = model.L
    t0, tokens, latency = time.perf_counter(), 0, 0.0
    for start in range(0, len(prompts), size):
        group = prompts[start : start + size]
        begun = time.perf_counter()
        slots = [model.acquire() for _ in group]
        chains = []
        try:
            for i, _ in enumerate(group):
                chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
                for s in (
                    L.llama_sampler_init_top_k(PAPER.top_k),
                    L.llama_sampler_init_top_p(PAPER.top_p, 1),
                    L.llama_sampler_init_temp(PAPER.temperature),
                    L.llama_sampler_init_dist(seed + start + i),
                ):
                    L.llama_sampler_chain_add(chain, s)
                chains.append(chain)
            # prefill all but the last prompt token, then one token per sequence per decode
            model.decode([(slot, 0, p[:-1], 0) for slot, p in zip(slots, group) if len(p) > 1])
            last = [p[-1] for p in group]
            pos = [len(p) - 1 for p in group]
            b = model.batch
            order = sorted(range(len(group)), key=lambda i: slots[i])
            for _ in range(max_new):
                for k, i in enumerate(order):
                    b.token[k], b.pos[k], b.n_seq_id[k], b.logits[k] = last[i], pos[i], 1, True
                    b.seq_id[k][0] = slots[i]
                b.n_tokens = len(group)
                with model.lock:
                    if L.llama_decode(model.ctx, b) != 0:
                        raise RuntimeError("llama_decode failed")
                    for k, i in enumerate(order):
                        last[i] = L.llama_sampler_sample(chains[i], model.ctx, k)
                        pos[i] += 1
            tokens += max_new * len(group)
        finally:
            for chain in chains:
                L.llama_sampler_free(chain)
            for slot in slots:
                model.release(slot)
        latency += (time.perf_counter() - begun) * len(group)
    return dict(tps=tokens / (time.perf_counter() - t0), latency=latency / len(prompts))


def llamacpp_table(
    backend: LlamaCppBackend, prompts: list[list[int]], sizes: list[int], n_draft: int, max_new: int, repeats: int
) -> dict[int, dict[str, list[float]]]:
    """Measure and print the table; returns every repeat's figures by B (keys
    ``l_tps``, ``s_tps``, ``s_l_accept``, ``r_tps``, ``r_l_accept`` and the latencies)."""
    out: dict[int, dict[str, list[float]]] = {b: {} for b in sizes}
    method, knob = RELAXED
    for _ in range(repeats):
        for b in sizes:
            for prefix, result in (
                ("l_", run_llamacpp_ar(backend, prompts, b, max_new)),
                ("s_", run_ours(backend, prompts, b, max_new, n_draft)),
                ("r_", run_ours(backend, prompts, b, max_new, n_draft, method, knob)),
            ):
                for key, value in result.items():
                    out[b].setdefault(prefix + key, []).append(value)
                print(f"  B = {b} {prefix[0].upper()}: {result['tps']:.2f} tok/s", flush=True)  # progress
    base = out[sizes[0]]["s_tps"]
    print(
        f"llama.cpp: {len(prompts)} responses per run, {backend.verifier.threads} threads; L = llama.cpp batched AR "
        f"(its sampler), S = relaxtune strict N={n_draft}, R = relaxtune {method} {knob:g} N={n_draft}, both on "
        f"LlamaCppBackend; tok/s aggregate"
    )
    print(
        f"{'B':>3} | {'L tok/s':>12} | {'S tok/s':>12} | {'S l_accept':>10} | {'R tok/s':>12} | {'R l_accept':>10} | "
        f"{'S/L':>12} | {'R/L':>12} | {f'S/S(B={sizes[0]})':>12}"
    )
    for b in sizes:
        r = out[b]
        ratio = lambda x, y: fmt([p / q for p, q in zip(r[x], r[y] if isinstance(y, str) else y)])  # noqa: E731
        print(
            f"{b:>3} | {fmt(r['l_tps']):>12} | {fmt(r['s_tps']):>12} | {fmt(r['s_l_accept']):>10} | "
            f"{fmt(r['r_tps']):>12} | {fmt(r['r_l_accept']):>10} | {ratio('s_tps', 'l_tps'):>12} | "
            f"{ratio('r_tps', 'l_tps'):>12} | {ratio('s_tps', base):>12}"
        )
    return out
