"""GPU check of the SGLang backend (run by scripts/gpu_check.sh on a host with one GPU).

Against two running SGLang servers (drafter, verifier), on the first 8 GSM8K
problems: AR, strict and cactus (delta 1) through the SGLang backend, then strict
in-process (transformers on the GPU) on the same pair. Asserts:
- strict's accuracy is within noise of AR's (paired interval contains 0);
- the verifier's prefix cache is reused (cached_tokens > 0 after the first round);
- acceptance length over SGLang agrees with the in-process engine within 0.5 tokens;
- with --native-url (a STANDALONE speculative server): sglang_threshold at the
  server's point reads the server's counters without a failed sample, and its
  acceptance length agrees with the client-loop transcription within 0.5 tokens;
- real-server behaviours (``server_cases``): a draft at vocab_size - 1 scores;
  the stop tokens hold the generation config's EOS ids and a short chat answer
  ends on one of them over the plain servers; with --native-url, a one-token
  response (no verify round) is a sample with zero rounds and no ``spec_*`` key,
  the speculative server stops on a token of that set, the same seed gives the
  same response (deterministic inference), and a threshold set through
  /set_internal_state is the one read back (then restored).
Prints one line per check and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import httpx

from relaxtune.backends.hf import load_pair
from relaxtune.backends.sglang import SGLangBackend
from relaxtune.certify.stats import drop_bound, paired_counts
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.sequence import generate
from relaxtune.tasks.spec import TaskSpec, load_problems
from relaxtune.tune.evaluation import evaluate
from relaxtune.tune.point_records import DecodeConfig


def check(failures: list[str], name: str, ok: bool, detail: str) -> None:
    """Print one check's line and record a failure."""
    print(f"check {name}: {detail} {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(name)


def server_cases(remote: SGLangBackend, native: SGLangBackend | None, verifier: str, failures: list[str]) -> None:
    """Real-server behaviours the stand-in imitates: the id rewrite at
    vocab_size - 1, stop tokens, zero-round responses, seeds, live thresholds."""
    from transformers import GenerationConfig

    tok = remote.tokenizer
    state = remote.start(tok.encode("The capital of France is"))
    rows = remote.score(state, [remote.vocab_size - 1])
    check(
        failures,
        "draft at vocab_size - 1",
        bool(rows[0, remote.vocab_size - 1] > float("-inf")),
        f"logprob {float(rows[0, remote.vocab_size - 1]):.2f}",
    )
    eos = GenerationConfig.from_pretrained(verifier).eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    check(
        failures,
        "stop tokens hold the generation config's",
        eos <= remote.eos_token_ids,
        f"{sorted(eos)} in {sorted(remote.eos_token_ids)}",
    )
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Reply with the single word: yes"}],
        add_generation_prompt=True,
        enable_thinking=False,
    )
    chat = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    sampling = SamplingParams(0.6, 20, 0.95)
    out = generate(remote, chat, method="strict", n_draft=4, sampling=sampling, max_new_tokens=64, seed=1)
    check(
        failures,
        "the client loop stops on a stop token",
        out.stats.finish_reason == "stop" and out.token_ids[-1] in remote.eos_token_ids,
        f"{out.stats.finish_reason}, last id {out.token_ids[-1]}",
    )
    if native is None:
        return
    server, (t, n) = native.native, native.native.point()
    ids, _, _, tel, _ = server.generate(chat, threshold=t, n_draft=n, sampling=sampling, max_new_tokens=1, seed=3)
    params = {"max_new_tokens": 1, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "sampling_seed": 3}
    meta = server.server.generate({"input_ids": chat, "sampling_params": params})["meta_info"]
    check(
        failures,
        "zero-round response",
        tel.rounds == 0 and len(ids) == 1 and not any(k.startswith("spec_") for k in meta),
        f"rounds {tel.rounds}, spec keys {sorted(k for k in meta if k.startswith('spec_'))}",
    )
    params = dict(params, max_new_tokens=64)
    first, second = (server.server.generate({"input_ids": chat, "sampling_params": params}) for _ in range(2))
    reason = first["meta_info"]["finish_reason"]
    check(
        failures,
        "the speculative server stops on a stop token of ours",
        reason.get("type") == "stop" and reason.get("matched") in remote.eos_token_ids,
        f"finish_reason {reason}",
    )
    check(
        failures,
        "same seed, same response",
        first["output_ids"] == second["output_ids"],
        f"{len(first['output_ids'])} and {len(second['output_ids'])} tokens",
    )
    url = f"{server.server.url}/set_internal_state"
    live = {"speculative_accept_threshold_single": 0.3, "speculative_accept_threshold_acc": 0.3}
    httpx.post(url, json={"server_args": live}, timeout=30)
    moved = server.point()
    httpx.post(url, json={"server_args": {k: t for k in live}}, timeout=30)
    check(
        failures, "live thresholds", moved == (0.3, n) and server.point() == (t, n), f"read {moved} after setting 0.3"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--verifier", required=True)
    ap.add_argument("--drafter-url", required=True)
    ap.add_argument("--verifier-url", required=True)
    ap.add_argument("--native-url", default=None, help="STANDALONE speculative server (sglang_threshold)")
    ap.add_argument("--gsm8k", required=True, help="local GSM8K test JSONL")
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    args = ap.parse_args()

    spec = TaskSpec(
        name="gsm8k_gpu_check",
        version=1,
        dataset={"path": "json", "data_files": args.gsm8k},
        fields={"question": "question", "answer": "answer"},
        prompt={
            "template": "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
            "thinking": False,
        },
        grader={"kind": "math", "gold": "gsm8k"},
        sampling={"temperature": 0.6, "top_p": 0.95, "top_k": 20},
        max_new_tokens=args.max_new_tokens,
    )
    problems = load_problems(spec, args.problems)
    out = tempfile.mkdtemp(prefix="gpu-check-")
    remote = SGLangBackend(args.drafter_url, args.verifier_url, args.verifier, max_concurrency=8, name="sglang")
    results, t0 = {}, time.time()
    for label, cfg in {
        "ar": DecodeConfig("ar", None, 1),
        "strict": DecodeConfig("strict", None, 4),
        "cactus": DecodeConfig("cactus", 1.0, 4),
    }.items():
        results[label] = evaluate(spec, remote, cfg, output_dir=out, problems=problems, progress=False)
        r = results[label]
        print(
            f"sglang {label:7s} accuracy {r.accuracy:.3f} l_accept {r.l_accept:.2f} length {r.mean_length:.0f} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
        )
    local = load_pair(args.drafter, args.verifier, dtype="bfloat16", device="cuda")
    inproc = evaluate(
        spec, local, DecodeConfig("strict", None, 4), output_dir=out + "/local", problems=problems, progress=False
    )
    print(f"in-process strict accuracy {inproc.accuracy:.3f} l_accept {inproc.l_accept:.2f}", flush=True)

    failures: list[str] = []
    ar, st = results["ar"].records, results["strict"].records  # a two-sided 95% interval from two 97.5% bounds
    hi = drop_bound(paired_counts(ar, st), 0.975).bound  # acc(AR) - acc(strict) <= hi
    lo = -drop_bound(paired_counts(st, ar), 0.975).bound
    check(failures, "strict within noise of AR", lo <= 0 <= hi, f"paired drop interval [{lo:.3f}, {hi:.3f}]")
    cached = [c for r in results["strict"].records for c in r.get("cached_tokens", [])[1:]]
    share = sum(c > 0 for c in cached) / max(len(cached), 1)
    check(failures, "prefix cache reuse", share >= 0.9, f"{share:.0%} of later rounds had cached_tokens > 0")
    gap = abs(results["strict"].l_accept - inproc.l_accept)
    check(
        failures,
        "acceptance agrees with in-process",
        gap <= 0.5,
        f"|{results['strict'].l_accept:.2f} - {inproc.l_accept:.2f}| = {gap:.2f}",
    )
    native = None
    if args.native_url:
        native = SGLangBackend(
            args.drafter_url,
            args.verifier_url,
            args.verifier,
            native_url=args.native_url,
            max_concurrency=8,
            name="sglang-native",
        )
        t, n = native.native.point()
        cfg = DecodeConfig("sglang_threshold", t, n)
        nat = evaluate(spec, native, cfg, output_dir=out, problems=problems, progress=False)
        emu = evaluate(spec, remote, cfg, output_dir=out, problems=problems, progress=False)
        gap = abs(nat.l_accept - emu.l_accept)
        check(
            failures,
            f"native sglang_threshold t={t:g} N={n}",
            nat.failed == 0 and gap <= 0.5,
            f"failed {nat.failed}, l_accept {nat.l_accept:.2f} vs client loop {emu.l_accept:.2f}, "
            f"accuracy {nat.accuracy:.3f} vs {emu.accuracy:.3f}",
        )
    server_cases(remote, native, args.verifier, failures)
    print(json.dumps({"failures": failures, "seconds": round(time.time() - t0)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
