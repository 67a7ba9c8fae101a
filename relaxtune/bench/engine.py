"""relaxtune's engine against transformers' own generation, side by side in one process.

    python -m relaxtune.bench.engine [--tables single,batch] [--drafts 2,4,8] [--batch-sizes 1,4,8]
        [--max-new-tokens 128] [--prompts 8] [--repeats 3] [--device cpu|cuda] [--random-weights]
        [--runtime hf|llamacpp] [--short] [--json PATH]

On the embedded pair (or ``--drafter`` / ``--verifier``), two tables:

single (one sequence at a time), for each draft length N: (a) transformers
``generate`` AR, (b) transformers assisted generation with the same drafter
and N (constant schedule, confidence threshold 0), (c) relaxtune AR, (d)
relaxtune strict, (e) relaxtune cactus at delta = 1; tokens/s, acceptance
length, the ratios d/a, d/b, e/d, relaxtune's forward floor (the share of its
wall time spent in model forwards), the forward costs the runs measured (t_AR
from (c), t_draft and t_verify(N+1) from (d)), c_rel, and the physical limit
``S_max = (l_accept + 1) t_AR / (t_verify(N+1) + N t_draft)``.

batch (``relaxtune.bench.batching``), for each batch size B: transformers'
batched ``generate`` (AR, left-padded) against relaxtune's batched strict at
``--batch-n-draft`` on the same prompts: aggregate tokens/s, per-sequence
latency, and the ratios to relaxtune at B = 1 and to transformers.

``--runtime llamacpp`` runs the batch table on the GGUF files instead
(``relaxtune.bench.llamacpp``): llama.cpp's own batched AR against relaxtune
strict and one relaxed rule on the llama.cpp backend, same GGUF, same process.

All runs sample with the paper's transform (T 0.6, top-k 20, top-p 0.95) and
ignore EOS, so every response has exactly ``--max-new-tokens`` tokens. Every
figure is the median of ``--repeats`` interleaved repeats with its spread
((max - min) / median); a spread above 10 % marks a run disturbed by other work.

``--short`` is the CI form (N = 2, B = 1 and 2, 2 prompts x 4 tokens, one repeat);
``--json PATH`` also writes every table's medians as JSON (``relaxtune.bench.results``).

``--random-weights`` builds both models from the embedded pair's architectures
(or from ``--drafter`` / ``--verifier`` folders holding a ``config.json``) with
random weights and random prompts: speeds, forward costs, c_rel, S_max and
batched throughput are meaningful (on ``--device cuda`` too), acceptance is not
(S_max is then also shown at l_accept = N, every draft accepted).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from relaxtune.backends.hf import HFBackend
from relaxtune.bench.batching import batch_table
from relaxtune.bench.harness import NOISY, PAPER, PROMPTS, build, fmt, hf_generate
from relaxtune.bench.results import Recorder, add_json_option
from relaxtune.engine.sequence import generate
from relaxtune.tune.setting_groups import DTYPES
from relaxtune.tune.settings import field_info


def _hf_single(backend: HFBackend, prompts: list[list[int]], max_new: int, n_draft: int | None) -> float:
    t0 = time.perf_counter()
    tokens = sum(hf_generate(backend, [p], max_new, n_draft, seed=i) for i, p in enumerate(prompts))
    return tokens / (time.perf_counter() - t0)


def _ours(backend: HFBackend, prompts: list[list[int]], max_new: int, method: str, knob=None, n_draft: int = 1) -> dict:
    """Tokens/s, acceptance length, forward share of wall time, and the mean
    forward costs the run measured (seconds per drafter / verifier forward)."""
    t = dict(tokens=0, rounds=0, accepted=0, wall=0.0, draft=0.0, verify=0.0, d_fwd=0, v_fwd=0)
    for i, ids in enumerate(prompts):
        s = generate(
            backend, ids, method=method, knob=knob, n_draft=n_draft, sampling=PAPER, max_new_tokens=max_new, seed=i
        ).stats
        for key, value in (
            ("tokens", s.response_tokens),
            ("rounds", s.rounds),
            ("accepted", s.accepted),
            ("wall", s.wall_seconds),
            ("draft", s.draft_seconds),
            ("verify", s.verify_seconds),
            ("d_fwd", s.draft_forwards),
            ("v_fwd", s.verify_forwards),
        ):
            t[key] += value
    return dict(
        tps=t["tokens"] / t["wall"],
        l_accept=t["accepted"] / t["rounds"],
        floor=(t["draft"] + t["verify"]) / t["wall"],
        t_verify=t["verify"] / t["v_fwd"],
        t_draft=t["draft"] / t["d_fwd"] if t["d_fwd"] else 0.0,
    )


def single_table(
    backend: HFBackend, prompts: list[list[int]], drafts: list[int], max_new: int, repeats: int, random_weights: bool
) -> dict[str, list]:
    """One sequence at a time: (a)..(e) per N, each the median of interleaved repeats; returns
    every repeat's figures by run (``a``, ``c``, ``b<N>``, ``d<N>``, ``e<N>``)."""
    runs: dict[str, list] = {}
    for _ in range(repeats):
        runs.setdefault("a", []).append(_hf_single(backend, prompts, max_new, None))
        runs.setdefault("c", []).append(_ours(backend, prompts, max_new, "ar"))
        for n in drafts:
            runs.setdefault(f"b{n}", []).append(_hf_single(backend, prompts, max_new, n))
            runs.setdefault(f"d{n}", []).append(_ours(backend, prompts, max_new, "strict", n_draft=n))
            runs.setdefault(f"e{n}", []).append(_ours(backend, prompts, max_new, "cactus", 1.0, n_draft=n))
    col = lambda key, field: [r[field] for r in runs[key]]  # noqa: E731
    a, c_tps, t_ar = runs["a"], col("c", "tps"), col("c", "t_verify")
    print(f"(a) transformers AR   {fmt(a)} tok/s")
    print(
        f"(c) relaxtune AR      {fmt(c_tps)} tok/s   c/a {fmt([c / x for c, x in zip(c_tps, a)])}   "
        f"forward share {statistics.median(col('c', 'floor')):.1%}   t_AR {fmt([t * 1e3 for t in t_ar], 1)} ms"
    )
    for n in drafts:
        b, d, e = runs[f"b{n}"], col(f"d{n}", "tps"), col(f"e{n}", "tps")
        l_acc, t_d, t_v = col(f"d{n}", "l_accept"), col(f"d{n}", "t_draft"), col(f"d{n}", "t_verify")
        # the physical limit from the forward costs these runs measured: (l + 1) t_AR / (t_verify(N+1) + N t_draft)
        s_max = [(acc + 1) * ar / (v + n * dr) for acc, ar, v, dr in zip(l_acc, t_ar, t_v, t_d)]
        print(f"N = {n}")
        print(f"  (b) transformers assisted {fmt(b)} tok/s")
        print(
            f"  (d) relaxtune strict      {fmt(d)} tok/s  l_accept {fmt(l_acc)}  forward share "
            f"{statistics.median(col(f'd{n}', 'floor')):.1%}  t_draft {fmt([x * 1e3 for x in t_d], 1)} ms  "
            f"t_verify({n + 1}) {fmt([x * 1e3 for x in t_v], 1)} ms  c_rel {fmt([x / y for x, y in zip(t_d, t_ar)], 3)}"
        )
        print(f"  (e) relaxtune cactus 1.0  {fmt(e)} tok/s  l_accept {fmt(col(f'e{n}', 'l_accept'))}")
        print(
            f"  d/a {fmt([x / y for x, y in zip(d, a)])}   d/b {fmt([x / y for x, y in zip(d, b)])}   "
            f"e/d {fmt([x / y for x, y in zip(e, d)])}   S_max {fmt(s_max)}   "
            f"(d/a)/S_max {fmt([x / y / s for x, y, s in zip(d, a, s_max)])}"
        )
        if random_weights:
            ceiling = [(n + 1) * ar / (v + n * dr) for ar, v, dr in zip(t_ar, t_v, t_d)]
            print(f"  random weights: acceptance is not meaningful; S_max at l_accept = N: {fmt(ceiling)}")
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("drafter", "verifier", "dtype"):  # the job's own options: default and help from the settings
        info = field_info(name)
        ap.add_argument(
            f"--{name}", default=info.default, help=info.description, **({"choices": DTYPES} if name == "dtype" else {})
        )
    ap.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto")
    ap.add_argument("--random-weights", action="store_true", help="models from the configs, random weights")
    ap.add_argument("--tables", default=None, help="which tables: single, batch [default: both; batch on llamacpp]")
    ap.add_argument(
        "--runtime",
        default="hf",
        choices=["hf", "llamacpp"],
        help="hf: transformers on the bf16 models; llamacpp: llama.cpp on the GGUF files",
    )
    ap.add_argument("--tokenizer", default=None, help=field_info("tokenizer").description)
    ap.add_argument("--drafts", default="2,4,8", help="draft lengths N of the single table, comma separated")
    ap.add_argument("--batch-sizes", default="1,4,8", help="batch sizes B of the batch table, comma separated")
    ap.add_argument("--batch-n-draft", type=int, default=4, help="relaxtune strict's N in the batch table")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per run (the batch table needs one per row)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every figure")
    ap.add_argument("--short", action="store_true", help="N = 2, B = 1,2, 2 prompts x 4 tokens, 1 repeat: the CI form")
    add_json_option(ap)
    args = ap.parse_args(argv)
    if args.short:
        args.drafts, args.batch_sizes, args.prompts, args.max_new_tokens, args.repeats = "2", "1,2", 2, 4, 1
    rec = Recorder("engine", "relaxtune's engine against transformers and llama.cpp", argv)
    llama = args.runtime == "llamacpp"
    tables = {t.strip() for t in (args.tables or ("batch" if llama else "single,batch")).split(",") if t.strip()}
    if not tables <= {"single", "batch"} or args.repeats < 1 or args.prompts < 1:
        ap.error("--tables takes single and/or batch; --repeats and --prompts must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device here (use --device cpu)")
    if llama and (tables != {"batch"} or args.random_weights):
        ap.error("--runtime llamacpp runs the batch table on the GGUF files (no --random-weights, --tables batch)")
    if llama:
        return _llamacpp(args, rec)

    backend, prompts = build(args)
    print(
        f"{backend.name}, {args.dtype} on {backend.device}, {torch.get_num_threads()} threads, {len(prompts)} "
        f"prompts x {args.max_new_tokens} new tokens, T 0.6 top-k 20 top-p 0.95, median ±spread of "
        f"{args.repeats} repeats ('!': spread over {NOISY:.0%}, the run was disturbed)"
    )
    if "single" in tables:
        drafts = [int(s) for s in args.drafts.split(",")]
        runs = single_table(
            backend, prompts[: min(5, len(prompts))], drafts, args.max_new_tokens, args.repeats, args.random_weights
        )
        _record_single(rec, runs, drafts, f"{backend.name}, {args.dtype} on {backend.device}")
    if "batch" in tables:
        sizes = [int(s) for s in args.batch_sizes.split(",")]
        out = batch_table(backend, prompts, sizes, args.batch_n_draft, args.max_new_tokens, args.repeats)
        _record(
            rec,
            f"batched, transformers: {len(prompts)} responses x {args.max_new_tokens} tokens; A = transformers "
            f"generate (AR), S = relaxtune strict N={args.batch_n_draft}; tok/s aggregate, medians",
            out,
            {"A tok/s": "hf_tps", "S tok/s": "tps", "S l_accept": "l_accept"},
            ("S/A", "tps", "hf_tps"),
        )
    rec.write(args.json)
    return 0


def _med(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _record_single(rec: Recorder, runs: dict[str, list], drafts: list[int], what: str) -> None:
    """The single table's medians, one row per N (tok/s of (a)..(e), l_accept, d/a, d/b, e/d)."""
    tps = lambda key: [r["tps"] if isinstance(r, dict) else r for r in runs[key]]  # noqa: E731
    rows = []
    for n in drafts:
        a, b, d, e = tps("a"), tps(f"b{n}"), tps(f"d{n}"), tps(f"e{n}")
        rows.append(
            [n, _med(a), _med(b), _med(tps("c")), _med(d), _med(e), _med([r["l_accept"] for r in runs[f"d{n}"]])]
            + [_med([x / y for x, y in zip(p, q)]) for p, q in ((d, a), (d, b), (e, d))]
        )
    rec.table(
        f"one sequence at a time, {what}: (a) transformers AR, (b) transformers assisted, (c) relaxtune AR, "
        "(d) relaxtune strict, (e) relaxtune cactus 1.0; tok/s, medians",
        ["N", "(a)", "(b)", "(c)", "(d)", "(e)", "(d) l_accept", "d/a", "d/b", "e/d"],
        rows,
        show=False,
    )


def _record(rec: Recorder, caption: str, out: dict, columns: dict[str, str], *ratios: tuple[str, str, str]) -> None:
    """A batch table's medians, one row per B: ``columns`` (name -> key of ``out[B]``) and
    ``ratios`` (name, numerator key, denominator key: the median of the repeats' ratios)."""
    rows = [
        [b]
        + [_med(r[key]) for key in columns.values()]
        + [_med([x / y for x, y in zip(r[num], r[den])]) for _, num, den in ratios]
        for b, r in out.items()
    ]
    rec.table(caption, ["B", *columns, *(name for name, _, _ in ratios)], rows, show=False)


def _llamacpp(args, rec: Recorder) -> int:
    """The llama.cpp table (``relaxtune.bench.llamacpp``) on the pair's GGUF files."""
    from relaxtune.backends.llamacpp import load_gguf_pair
    from relaxtune.bench.harness import chat_ids
    from relaxtune.bench.llamacpp import llamacpp_table

    sizes = [int(s) for s in args.batch_sizes.split(",")]
    backend = load_gguf_pair(
        args.drafter, args.verifier, max(sizes), n_ctx_seq=args.max_new_tokens + 256, tokenizer=args.tokenizer
    )
    backend.eos_token_ids = frozenset()  # fixed-length runs
    prompts = [chat_ids(backend.tokenizer, p) for p in (PROMPTS * args.prompts)[: args.prompts]]
    print(
        f"{backend.name}, GGUF on llama.cpp, {len(prompts)} prompts x {args.max_new_tokens} new tokens, T 0.6 "
        f"top-k 20 top-p 0.95, median ±spread of {args.repeats} repeats ('!': spread over {NOISY:.0%})"
    )
    out = llamacpp_table(backend, prompts, sizes, args.batch_n_draft, args.max_new_tokens, args.repeats)
    backend.close()
    _record(
        rec,
        f"batched, llama.cpp: {len(prompts)} responses x {args.max_new_tokens} tokens; L = llama.cpp batched AR, "
        f"S = relaxtune strict N={args.batch_n_draft}, R = relaxtune cactus 1 N={args.batch_n_draft}, both on "
        "LlamaCppBackend; tok/s aggregate, medians",
        out,
        {"L tok/s": "l_tps", "S tok/s": "s_tps", "S l_accept": "s_l_accept"}
        | {"R tok/s": "r_tps", "R l_accept": "r_l_accept"},
        ("S/L", "s_tps", "l_tps"),
        ("R/L", "r_tps", "l_tps"),
    )
    rec.write(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
