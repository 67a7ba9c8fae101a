"""relaxtune's engine against transformers' own generation, side by side in one process.

    python -m relaxtune.bench.engine [--drafts 2,4,8] [--max-new-tokens 128] [--prompts 5]

On the embedded pair (or ``--drafter`` / ``--verifier``), for each draft length N:
(a) transformers ``generate`` AR, (b) transformers assisted generation with the
same drafter and N (constant schedule, confidence threshold 0), (c) relaxtune AR,
(d) relaxtune strict, (e) relaxtune cactus at delta = 1. All sample with the
paper's transform (T 0.6, top-k 20, top-p 0.95) and ignore EOS so every run
makes exactly ``--max-new-tokens`` tokens. Prints tokens/s, acceptance length,
the ratios d/a, d/b, e/d, relaxtune's forward floor (the share of its wall time
spent in model forwards), and the physical limit of this machine
``S_max = (l_accept + 1) t_AR / (t_verify(N+1) + N t_draft)`` from the mean
forward costs the runs themselves measured (t_AR from (c), the rest from (d)).
"""

from __future__ import annotations

import argparse
import time

import torch

from relaxtune.backends.hf import HFBackend, load_pair
from relaxtune.embedded import DRAFTER, VERIFIER
from relaxtune.engine import generate
from relaxtune.sampling import SamplingParams

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that returns the prime factors of an integer.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that parses a CSV line with quoted fields.",
]
PAPER = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)


def _chat_ids(tokenizer, text: str) -> list[int]:
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _hf_generate(backend: HFBackend, prompts: list[list[int]], max_new: int, n_draft: int | None) -> float:
    kw = dict(
        do_sample=True, temperature=PAPER.temperature, top_k=PAPER.top_k, top_p=PAPER.top_p,
        max_new_tokens=max_new, min_new_tokens=max_new,
    )
    if n_draft is not None:
        kw.update(
            assistant_model=backend.drafter, num_assistant_tokens=n_draft,
            num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0,
        )
    tokens, t0 = 0, time.perf_counter()
    for i, ids in enumerate(prompts):
        torch.manual_seed(i)
        with torch.inference_mode():
            out = backend.verifier.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **kw)
        tokens += out.shape[1] - len(ids)
    return tokens / (time.perf_counter() - t0)


def _ours(backend: HFBackend, prompts: list[list[int]], max_new: int, method: str, knob=None, n_draft: int = 1) -> dict:
    """Tokens/s, acceptance length, forward share of wall time, and the mean
    forward costs the run measured (seconds per drafter / verifier forward)."""
    t = dict(tokens=0, rounds=0, accepted=0, wall=0.0, draft=0.0, verify=0.0, d_fwd=0, v_fwd=0)
    for i, ids in enumerate(prompts):
        s = generate(backend, ids, method=method, knob=knob, n_draft=n_draft, sampling=PAPER, max_new_tokens=max_new,
                     seed=i).stats
        for key, value in (("tokens", s.response_tokens), ("rounds", s.rounds), ("accepted", s.accepted),
                           ("wall", s.wall_seconds), ("draft", s.draft_seconds), ("verify", s.verify_seconds),
                           ("d_fwd", s.draft_forwards), ("v_fwd", s.verify_forwards)):
            t[key] += value
    return dict(tps=t["tokens"] / t["wall"], l_accept=t["accepted"] / t["rounds"],
                floor=(t["draft"] + t["verify"]) / t["wall"], t_verify=t["verify"] / t["v_fwd"],
                t_draft=t["draft"] / t["d_fwd"] if t["d_fwd"] else 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default=DRAFTER.name)
    ap.add_argument("--verifier", default=VERIFIER.name)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--drafts", default="2,4,8", help="draft lengths N, comma separated")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=5, help=f"how many of the {len(PROMPTS)} fixed prompts")
    args = ap.parse_args(argv)
    drafts = [int(s) for s in args.drafts.split(",")]

    backend = load_pair(args.drafter, args.verifier, dtype=args.dtype)
    backend.eos_token_ids = frozenset()  # fixed-length runs
    prompts = [_chat_ids(backend.tokenizer, p) for p in PROMPTS[: args.prompts]]
    print(f"{backend.name}, {args.dtype}, {torch.get_num_threads()} threads, {len(prompts)} prompts x "
          f"{args.max_new_tokens} new tokens, T 0.6 top-k 20 top-p 0.95")

    a = _hf_generate(backend, prompts, args.max_new_tokens, None)
    c = _ours(backend, prompts, args.max_new_tokens, "ar")
    print(f"(a) transformers AR   {a:6.2f} tok/s")
    print(f"(c) relaxtune AR      {c['tps']:6.2f} tok/s   c/a {c['tps'] / a:.2f}   forward share {c['floor']:.1%}   "
          f"t_AR {c['t_verify'] * 1e3:.0f} ms")
    for n in drafts:
        b = _hf_generate(backend, prompts, args.max_new_tokens, n)
        d = _ours(backend, prompts, args.max_new_tokens, "strict", n_draft=n)
        e = _ours(backend, prompts, args.max_new_tokens, "cactus", 1.0, n_draft=n)
        # the physical limit from the forward costs these runs measured: (l + 1) t_AR / (t_verify(N+1) + N t_draft)
        s_max = (d["l_accept"] + 1) * c["t_verify"] / (d["t_verify"] + n * d["t_draft"])
        print(f"N = {n}")
        print(f"  (b) transformers assisted {b:6.2f} tok/s")
        print(f"  (d) relaxtune strict      {d['tps']:6.2f} tok/s  l_accept {d['l_accept']:.2f}  forward share {d['floor']:.1%}  "
              f"t_draft {d['t_draft'] * 1e3:.0f} ms  t_verify({n + 1}) {d['t_verify'] * 1e3:.0f} ms")
        print(f"  (e) relaxtune cactus 1.0  {e['tps']:6.2f} tok/s  l_accept {e['l_accept']:.2f}  forward share {e['floor']:.1%}")
        print(f"  d/a {d['tps'] / a:.2f}   d/b {d['tps'] / b:.2f}   e/d {e['tps'] / d['tps']:.2f}   "
              f"S_max {s_max:.2f}   (d/a)/S_max {d['tps'] / a / s_max:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
