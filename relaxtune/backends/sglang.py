"""SGLang backend: two plain SGLang servers (drafter, verifier), the verify loop here.

SGLang's own speculative decoding cannot express the relaxed rules, so relaxtune
talks to two servers without speculative flags through the native ``/generate``
API and runs the round in ``relaxtune.decoding`` (``shared/docs/sglang-protocol.md``).

- Scoring (one verifier request per round): ``input_ids = prefix + drafts``,
  ``max_new_tokens = 1``, temperature 0 (raw logprobs), ``logprob_start_len =
  len(prefix) - 1``, ``top_logprobs_num = K``, ``token_ids_logprob = drafts``.
  In the response, ``input_top_logprobs[j]`` (j = 1..N) is the distribution
  before draft j (entry 0 is the boundary and is ignored), ``input_token_logprobs[j]``
  the exact ``log p(d_j)``, and ``output_top_logprobs[0]`` the bonus row.
- Drafting: token by token with our own sampler (``max_new_tokens = 1``, raw
  top-K logprobs of the next position), so ``q`` is known exactly; the radix
  cache makes each step cost one token.
- Rows are returned as dense log-probability rows ``[V]`` with ``-inf`` outside the
  returned ids; raw logprobs differ from raw logits by a per-row constant, so the
  sampling transform (and every method's rule) gives the same result. With a
  top-k cut ``k <= K`` the transformed rows are exact; without one, the mass
  outside the top-K is recorded per position (``state.extra["missing_mass"]``).
- Every sampling parameter is sent explicitly (never the server's model defaults).
- Transient faults (connection errors, timeouts, 5xx, a truncated body) are
  retried with exponential backoff; anything else, and a fault that outlives the
  retries, raises ``SGLangError`` naming the server and the field.
- All HTTP goes through one ``httpx.AsyncClient`` on a private event loop
  (``AsyncHTTP``), at most ``max_concurrency`` requests in flight (an
  ``asyncio.Semaphore``); ``evaluate`` drives ``max_concurrency`` sequences at
  once, so the servers batch them.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import torch

from .base import DraftResult, Pick, SequenceState
from .http import AsyncHTTP, SGLangError, ServerClient

__all__ = ["SGLangBackend", "SGLangError", "ServerClient", "AsyncHTTP", "parse_score", "parse_next", "GREEDY_ONE"]

GREEDY_ONE = {  # every sampling parameter, explicitly: one raw (greedy) step
    "max_new_tokens": 1, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "stop": [], "ignore_eos": True,
}


def _field(body: dict, path: str, server: str):
    node = body
    for key in path.split("."):
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise SGLangError(f"{server}: field '{path}' missing in the /generate response")
    return node


def _entries(entries, vocab: int, server: str, where: str) -> tuple[list[int], list[float]]:
    """Token ids and logprobs of a top-K list ``[[logprob, id, text?], ...]``."""
    if not isinstance(entries, list):
        raise SGLangError(f"{server}: field '{where}' is not a list of [logprob, token_id] entries")
    ids, lps = [], []
    for e in entries:
        if not isinstance(e, (list, tuple)) or len(e) < 2 or e[0] is None:
            raise SGLangError(f"{server}: malformed entry {e!r} in '{where}'")
        tid = int(e[1])
        if not 0 <= tid < vocab:
            raise SGLangError(f"{server}: token id {tid} in '{where}' is outside the vocabulary [0, {vocab})")
        ids.append(tid)
        lps.append(float(e[0]))
    return ids, lps


def _row(ids: list[int], lps: list[float], vocab: int) -> tuple[torch.Tensor, float]:
    row = torch.full((vocab,), -math.inf)
    if ids:
        row[torch.tensor(ids)] = torch.tensor(lps)
    missing = max(0.0, 1.0 - float(torch.tensor(lps, dtype=torch.float64).exp().sum())) if lps else 1.0
    return row, missing


def parse_next(body: dict, vocab: int, server: str = "server") -> tuple[torch.Tensor, float]:
    """The next-token row of a one-token greedy request: (log-prob row ``[V]``, missing mass)."""
    ids, lps = _entries(_field(body, "meta_info.output_top_logprobs.0", server), vocab, server, "output_top_logprobs[0]")
    return _row(ids, lps, vocab)


def parse_score(body: dict, drafts: Sequence[int], vocab: int, server: str = "server") -> tuple[torch.Tensor, list[float], int]:
    """Rows of a scoring request over ``prefix + drafts`` (``logprob_start_len =
    len(prefix) - 1``): ``([N+1, V]`` log-prob rows, missing mass per row,
    ``cached_tokens``). The exact ``log p(d_j)`` from ``input_token_logprobs`` is
    written into row j even when ``d_j`` is outside the top-K.

    Raises:
        SGLangError: a missing field, a misaligned length, or an id mismatch.
    """
    n = len(drafts)
    top = _field(body, "meta_info.input_top_logprobs", server)
    tok = _field(body, "meta_info.input_token_logprobs", server)
    if len(top) != n + 1 or len(tok) != n + 1:
        raise SGLangError(
            f"{server}: expected {n + 1} input logprob entries (boundary + {n} drafts), got "
            f"{len(tok)} input_token_logprobs and {len(top)} input_top_logprobs"
        )
    rows, missing = [], []
    for j in range(1, n + 1):
        ids, lps = _entries(top[j], vocab, server, f"input_top_logprobs[{j}]")
        lp_d, id_d = tok[j][0], int(tok[j][1])
        if id_d != int(drafts[j - 1]) or lp_d is None:
            raise SGLangError(f"{server}: input_token_logprobs[{j}] is for token {id_d}, expected draft {drafts[j - 1]}")
        if id_d not in ids:
            ids.append(id_d)
            lps.append(float(lp_d))
        row, miss = _row(ids, lps, vocab)
        rows.append(row)
        missing.append(miss)
    bonus, miss = parse_next(body, vocab, server)
    rows.append(bonus)
    missing.append(miss)
    cached = int(body.get("meta_info", {}).get("cached_tokens", -1))
    return torch.stack(rows), missing, cached


class SGLangBackend:
    """A drafter and a verifier served by SGLang.

    Args:
        drafter_url, verifier_url: base URLs of the two servers.
        tokenizer: the shared tokenizer (object, or a model id / folder to load it from).
        vocab_size: logit width V (default: the model config's, else the tokenizer's length).
        top_logprobs: K, the top-K returned per position (>= the sampling top-k for exact rows).
        timeout: seconds per request.
        retries: retries of transient faults per request.
        max_concurrency: sequences generated at once by ``evaluate``.
        native_url: an optional STANDALONE speculative server that runs
            ``sglang_threshold`` itself (``relaxtune.backends.sglang_native``).
        check: probe ``/health`` of the servers now.

    Raises:
        SGLangError: a server is unreachable (with ``check``).
    """

    def __init__(self, drafter_url: str, verifier_url: str, tokenizer, *, vocab_size: int | None = None,
                 top_logprobs: int = 64, timeout: float = 120.0, retries: int = 3, backoff: float = 0.5,
                 max_concurrency: int = 8, name: str | None = None, native_url: str | None = None,
                 check: bool = True) -> None:
        from .sglang_native import NativeSpecServer

        self.http = AsyncHTTP(timeout, max_concurrency)
        self.drafter = ServerClient(drafter_url, "drafter", self.http, retries, backoff)
        self.verifier = ServerClient(verifier_url, "verifier", self.http, retries, backoff)
        self.native = NativeSpecServer(native_url, self.http, retries, backoff) if native_url else None
        if check:  # fail fast, before loading a tokenizer
            try:
                for server in (self.drafter, self.verifier) + ((self.native.server,) if self.native else ()):
                    server.health()
            except SGLangError:
                self.http.close()
                raise
        if isinstance(tokenizer, str):
            from transformers import AutoConfig, AutoTokenizer

            path = tokenizer
            tokenizer = AutoTokenizer.from_pretrained(path)
            if vocab_size is None:
                try:
                    vocab_size = int(AutoConfig.from_pretrained(path).vocab_size)
                except (OSError, ValueError, AttributeError):
                    vocab_size = None
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size or len(tokenizer))
        self.top_logprobs = int(top_logprobs)
        self.max_concurrency = int(max_concurrency)
        self.name = name or f"sglang:{drafter_url}->{verifier_url}"
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))

    def start(self, prompt_ids: Sequence[int]) -> SequenceState:
        """A fresh state (no request yet)."""
        if len(prompt_ids) == 0:
            raise ValueError("the prompt must hold at least one token")
        state = SequenceState(tokens=[int(t) for t in prompt_ids], prompt_len=len(prompt_ids))
        state.extra.update(missing_mass=[], cached_tokens=[])
        return state

    def _request(self, ids: list[int], start: int, score_ids: list[int] | None = None) -> dict:
        payload = {"input_ids": ids, "sampling_params": dict(GREEDY_ONE), "return_logprob": True,
                   "logprob_start_len": start, "top_logprobs_num": self.top_logprobs}
        if score_ids:
            payload["token_ids_logprob"] = score_ids
        return payload

    def draft(self, state: SequenceState, n: int, pick: Pick, extra_step: bool = False) -> DraftResult:
        """Draft ``n`` tokens one request at a time (our sampler picks each)."""
        ids: list[int] = []
        rows = []
        for i in range(n + int(extra_step)):
            t0 = time.perf_counter()
            seq = state.tokens + ids
            body = self.drafter.generate(self._request(seq, len(seq) - 1))
            state.draft_seconds += time.perf_counter() - t0
            state.draft_forwards += 1
            row, _ = parse_next(body, self.vocab_size, str(self.drafter))
            rows.append(row)
            if i < n:
                ids.append(int(pick(row)))
        return DraftResult(ids, torch.stack(rows))

    def score(self, state: SequenceState, draft_ids: Sequence[int]) -> torch.Tensor:
        """Verifier log-prob rows ``[N+1, V]`` from one request."""
        drafts = [int(t) for t in draft_ids]
        t0 = time.perf_counter()
        body = self.verifier.generate(self._request(state.tokens + drafts, len(state.tokens) - 1, drafts))
        state.verify_seconds += time.perf_counter() - t0
        state.verify_forwards += 1
        rows, missing, cached = parse_score(body, drafts, self.vocab_size, str(self.verifier))
        state.extra["missing_mass"].extend(missing)
        state.extra["cached_tokens"].append(cached)
        return rows

    def step(self, state: SequenceState) -> torch.Tensor:
        """Verifier row ``[V]`` for the next token (AR)."""
        return self.score(state, [])[0]

    def commit(self, state: SequenceState, tokens: Sequence[int]) -> None:
        """Append tokens (the servers' radix caches need no rollback)."""
        state.tokens.extend(int(t) for t in tokens)

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids to text."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def close(self) -> None:
        """Close the HTTP client."""
        self.http.close()
