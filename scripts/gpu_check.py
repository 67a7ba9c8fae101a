"""GPU check of the SGLang backend (run by scripts/gpu_check.sh on a host with one GPU).

Against two running SGLang servers (drafter, verifier), on the first 8 GSM8K
problems: AR, strict and cactus (delta 1) through the SGLang backend, then strict
in-process (transformers on the GPU) on the same pair. Asserts:
- strict's accuracy is within noise of AR's (paired interval contains 0);
- the verifier's prefix cache is reused (cached_tokens > 0 after the first round);
- acceptance length over SGLang agrees with the in-process engine within 0.5 tokens;
- with --native-url (a STANDALONE speculative server): sglang_threshold at the
  server's point reads the server's counters without a failed sample, and its
  acceptance length agrees with the client-loop transcription within 0.5 tokens.
Prints one line per check and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from relaxtune.backends.hf import load_pair
from relaxtune.backends.sglang import SGLangBackend
from relaxtune.evaluation import DecodeConfig, evaluate
from relaxtune.stats import paired_drop
from relaxtune.tasks import TaskSpec, load_problems


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
        name="gsm8k_gpu_check", version=1, dataset={"path": "json", "data_files": args.gsm8k},
        fields={"question": "question", "answer": "answer"},
        prompt={"template": "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
                "thinking": False},
        grader={"kind": "math", "gold": "gsm8k"}, sampling={"temperature": 0.6, "top_p": 0.95, "top_k": 20},
        max_new_tokens=args.max_new_tokens,
    )
    problems = load_problems(spec, args.problems)
    out = tempfile.mkdtemp(prefix="gpu-check-")
    remote = SGLangBackend(args.drafter_url, args.verifier_url, args.verifier, max_concurrency=8, name="sglang")
    results, t0 = {}, time.time()
    for label, cfg in {"ar": DecodeConfig("ar", None, 1), "strict": DecodeConfig("strict", None, 4),
                       "cactus": DecodeConfig("cactus", 1.0, 4)}.items():
        results[label] = evaluate(spec, remote, cfg, output_dir=out, problems=problems, progress=False)
        r = results[label]
        print(f"sglang {label:7s} accuracy {r.accuracy:.3f} l_accept {r.l_accept:.2f} length {r.mean_length:.0f} "
              f"({time.time() - t0:.0f} s)", flush=True)
    local = load_pair(args.drafter, args.verifier, dtype="bfloat16", device="cuda")
    inproc = evaluate(spec, local, DecodeConfig("strict", None, 4), output_dir=out + "/local", problems=problems,
                      progress=False)
    print(f"in-process strict accuracy {inproc.accuracy:.3f} l_accept {inproc.l_accept:.2f}", flush=True)

    failures = []
    ar = {r["problem_id"]: r["correct"] for r in results["ar"].records}
    st = {r["problem_id"]: r["correct"] for r in results["strict"].records}
    ids = sorted(set(ar) & set(st))
    _, lo, hi = paired_drop([ar[i] for i in ids], [st[i] for i in ids], confidence=0.95)
    ok = lo <= 0 <= hi
    print(f"check strict within noise of AR: paired drop interval [{lo:.3f}, {hi:.3f}] {'ok' if ok else 'FAIL'}")
    failures += [] if ok else ["strict vs AR"]
    cached = [c for r in results["strict"].records for c in r.get("cached_tokens", [])[1:]]
    share = sum(c > 0 for c in cached) / max(len(cached), 1)
    ok = share >= 0.9
    print(f"check prefix cache reuse: {share:.0%} of later rounds had cached_tokens > 0 {'ok' if ok else 'FAIL'}")
    failures += [] if ok else ["cache reuse"]
    gap = abs(results["strict"].l_accept - inproc.l_accept)
    ok = gap <= 0.5
    print(f"check acceptance agrees with in-process: |{results['strict'].l_accept:.2f} - {inproc.l_accept:.2f}| = {gap:.2f} "
          f"{'ok' if ok else 'FAIL'}")
    failures += [] if ok else ["acceptance"]
    if args.native_url:
        native = SGLangBackend(args.drafter_url, args.verifier_url, args.verifier, native_url=args.native_url,
                               max_concurrency=8, name="sglang-native")
        t, n = native.native.point()
        cfg = DecodeConfig("sglang_threshold", t, n)
        nat = evaluate(spec, native, cfg, output_dir=out, problems=problems, progress=False)
        emu = evaluate(spec, remote, cfg, output_dir=out, problems=problems, progress=False)
        gap = abs(nat.l_accept - emu.l_accept)
        ok = nat.failed == 0 and gap <= 0.5
        print(f"check native sglang_threshold t={t:g} N={n}: failed {nat.failed}, l_accept {nat.l_accept:.2f} vs "
              f"client loop {emu.l_accept:.2f}, accuracy {nat.accuracy:.3f} vs {emu.accuracy:.3f} {'ok' if ok else 'FAIL'}")
        failures += [] if ok else ["native sglang_threshold"]
    print(json.dumps({"failures": failures, "seconds": round(time.time() - t0)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
