"""Validation of the serving speed model: per serving batch size, the modeled speed-up
against the measured one, on the same backend.

    python -m relaxtune.bench.serving [--runtime llamacpp|hf|simulated] [--batch-sizes 1,4,16]
        [--n-draft 4] [--relaxed cactus:1] [--prompts 16] [--max-new-tokens 64] [--repeats 1]
        [--short] [--json PATH]

For each serving batch size B, on the same prompts (``--prompts`` responses of exactly
``--max-new-tokens`` tokens, EOS ignored) and the paper's sampling transform:

- measured: relaxtune's own batched decode (``relaxtune.engine.batch.generate_batch``, B
  rows, continuous refill) on the backend, strict and one relaxed point (``--relaxed``,
  cactus at delta = 1 by default) at draft length N, each over relaxtune's own batched AR
  on the same backend and rows: the ratio of aggregate tokens/s, the median of
  ``--repeats`` interleaved repeats;
- modeled: the speed model at B (``relaxtune.decoding.serving.ServingProfile``, from the
  backend's ``cost_profile(prompt_ids, n_drafts, batch_sizes=...)``) at the acceptance
  length the measured run had (fixed lengths: no length correction);
- the gap ``modeled / measured - 1``; ``!`` marks one over ``GAP`` (15 %, issue 37's bound).

Then the batch size from which speculation stops paying (``stops_paying_at`` over the
better of the two points), modeled and measured. ``--runtime llamacpp`` (the default) runs
the embedded pair's GGUF files on llama.cpp; ``hf`` its transformers copies;
``simulated`` the roofline pair of ``relaxtune.bench.serving_sim`` (a virtual clock:
checks the benchmark itself, never a machine). ``--short``: 2 batch sizes, 4 prompts,
8 tokens (the CI form). Timings are meaningful on an idle machine only.
"""

from __future__ import annotations

import argparse
import statistics
import time

from relaxtune.bench.batching import run_ours
from relaxtune.bench.drafters import parse_methods
from relaxtune.bench.harness import PROMPTS, chat_ids
from relaxtune.bench.results import Recorder, add_json_option
from relaxtune.decoding.serving import ServingProfile, stops_paying_at

__all__ = ["GAP", "measure", "serving_rows", "main"]

GAP = 0.15  # a relative gap above this between modeled and measured is flagged


def _profile(backend, prompt: list[int], n_draft: int, sizes: list[int]) -> ServingProfile:
    """The backend's serving profile at ``sizes`` (its ``cost_profile`` with ``batch_sizes``).

    Raises:
        RuntimeError: a backend whose ``cost_profile`` does not take ``batch_sizes`` yet.
    """
    try:
        profile = backend.cost_profile(prompt, [n_draft], batch_sizes=sizes)
    except TypeError as err:
        if "batch_sizes" not in str(err):
            raise
        raise RuntimeError(
            f"{type(backend).__name__}.cost_profile does not measure serving batch sizes yet (batch_sizes=...)"
        ) from err
    return profile if isinstance(profile, ServingProfile) else ServingProfile.single(profile)


def measure(
    backend,
    prompts: list[list[int]],
    sizes: list[int],
    n_draft: int,
    relaxed: tuple[str, float | None],
    max_new: int,
    repeats: int,
    clock=time.perf_counter,
) -> dict[int, dict[str, list[float]]]:
    """Per batch size, every repeat's figures (keys ``ar_tps``, ``strict_tps``, ``strict_l``,
    ``relaxed_tps``, ``relaxed_l``), AR, strict and relaxed interleaved B by B."""
    out: dict[int, dict[str, list[float]]] = {b: {} for b in sizes}
    method, knob = relaxed
    for _ in range(repeats):
        for b in sizes:
            for name, m, k in (("ar", "ar", None), ("strict", "strict", None), ("relaxed", method, knob)):
                r = run_ours(backend, prompts, b, max_new, n_draft, m, k, clock=clock)
                out[b].setdefault(f"{name}_tps", []).append(r["tps"])
                out[b].setdefault(f"{name}_l", []).append(r["l_accept"])
                print(f"  B = {b} {name}: {r['tps']:.2f} tok/s", flush=True)  # progress
    return out


def serving_rows(profile: ServingProfile, figures: dict[int, dict[str, list[float]]], n_draft: int) -> list[dict]:
    """Per batch size: the costs, and for ``strict`` and ``relaxed`` the median acceptance
    length, the modeled and measured speed-ups over batched AR and their gap."""
    rows = []
    for b, f in figures.items():
        p = profile.at(b)
        row = {"B": b, "t_ar": p.t_ar, "t_draft": p.t_draft, "t_verify": p.t_verify[n_draft + 1]}
        for name in ("strict", "relaxed"):
            l_accept = min(statistics.median(f[f"{name}_l"]), float(n_draft))
            modeled = p.speedup(l_accept, n_draft)
            measured = statistics.median(x / y for x, y in zip(f[f"{name}_tps"], f["ar_tps"]))
            row[name] = {"l_accept": l_accept, "modeled": modeled, "measured": measured, "gap": modeled / measured - 1}
        rows.append(row)
    return rows


def _stops(rows: list[dict], which: str) -> int | None:
    return stops_paying_at({r["B"]: max(r["strict"][which], r["relaxed"][which]) for r in rows})


def _backend(args, sizes: list[int]):
    """The backend (EOS ignored), its prompts and the clock its throughput is read on."""
    if args.runtime == "simulated":
        from relaxtune.bench.serving_sim import SimServingPair

        backend = SimServingPair.crossing_at(args.crossing)
        return backend, [[1 + i % 7] * 4 for i in range(args.prompts)], backend.clock
    from relaxtune.backends.embedded import DRAFTER, VERIFIER
    from relaxtune.backends.load import load_backend

    backend = load_backend(DRAFTER.name, VERIFIER.name, runtime=args.runtime, batch_size=max(sizes), dtype=args.dtype)
    backend.eos_token_ids = frozenset()  # fixed-length runs
    prompts = [chat_ids(backend.tokenizer, p) for p in (PROMPTS * args.prompts)[: args.prompts]]
    return backend, prompts, time.perf_counter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default="llamacpp", choices=["llamacpp", "hf", "simulated"])
    ap.add_argument("--batch-sizes", default="1,4,16", help="serving batch sizes B, comma separated")
    ap.add_argument("--n-draft", type=int, default=4, help="draft length N")
    ap.add_argument("--relaxed", default="cactus:1", help="the relaxed point, method:knob")
    ap.add_argument("--prompts", type=int, default=16, help="responses per run (at least the largest B)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats (median)")
    ap.add_argument("--dtype", default="bfloat16", help="--runtime hf: the models' dtype")
    ap.add_argument("--crossing", type=int, default=8, help="--runtime simulated: where speculation stops paying")
    ap.add_argument("--short", action="store_true", help="batch sizes 1,2, 4 prompts, 8 tokens: the CI form")
    add_json_option(ap)
    args = ap.parse_args(argv)
    if args.short:
        args.batch_sizes, args.prompts, args.max_new_tokens = "1,2", 4, 8
    sizes = sorted({int(s) for s in args.batch_sizes.split(",")})
    (relaxed,) = parse_methods(args.relaxed)
    if args.repeats < 1 or args.prompts < sizes[-1]:
        ap.error("--repeats must be >= 1 and --prompts at least the largest batch size")
    rec = Recorder("serving", "The serving speed model against measured throughput", argv)
    backend, prompts, clock = _backend(args, sizes)
    print(
        f"{backend.name} ({args.runtime}), {len(prompts)} prompts x {args.max_new_tokens} new tokens (EOS ignored), "
        f"N = {args.n_draft}, T 0.6 top-k 20 top-p 0.95, median of {args.repeats} repeat(s)",
        flush=True,
    )
    profile = _profile(backend, prompts[0], args.n_draft, sizes)
    figures = measure(backend, prompts, sizes, args.n_draft, relaxed, args.max_new_tokens, args.repeats, clock)
    rows = serving_rows(profile, figures, args.n_draft)
    mark = lambda g: f"{g:+.1%}" + (" !" if abs(g) > GAP else "")  # noqa: E731
    label = f"{relaxed[0]} {relaxed[1]:g}" if relaxed[1] is not None else relaxed[0]
    stops = {w: _stops(rows, w) for w in ("modeled", "measured")}
    flagged = sum(abs(r[n]["gap"]) > GAP for r in rows for n in ("strict", "relaxed"))
    rec.table(
        f"{backend.name} on {args.runtime}: speed-up over relaxtune's batched AR at each serving batch size B, "
        f"modeled (the cost profile at B, the run's acceptance) against measured (tokens/s ratio); N = "
        f"{args.n_draft}, {len(prompts)} x {args.max_new_tokens} tokens; ! = gap over {GAP:.0%}",
        [
            "B",
            "t_AR ms",
            "t_draft ms",
            f"t_verify({args.n_draft + 1}) ms",
            "strict l_accept",
            "strict modeled",
            "strict measured",
            "strict gap",
            f"{label} l_accept",
            f"{label} modeled",
            f"{label} measured",
            f"{label} gap",
        ],
        [
            [
                r["B"],
                round(r["t_ar"] * 1e3, 2),
                round(r["t_draft"] * 1e3, 2),
                round(r["t_verify"] * 1e3, 2),
                *(
                    v
                    for n in ("strict", "relaxed")
                    for v in (
                        round(r[n]["l_accept"], 2),
                        round(r[n]["modeled"], 3),
                        round(r[n]["measured"], 3),
                        mark(r[n]["gap"]),
                    )
                ),
            ]
            for r in rows
        ],
        [
            "speculation stops paying at B = "
            + ", measured: ".join("never (in these sizes)" if stops[w] is None else str(stops[w]) for w in stops)
            + " (modeled first; the better of the two points)",
            f"gaps over {GAP:.0%}: {flagged} of {2 * len(rows)}",
        ],
    )
    rec.write(args.json)
    if hasattr(backend, "close"):
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
