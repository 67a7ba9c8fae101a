"""SGLang backend: two plain SGLang servers (drafter, verifier), the verify loop here.

SGLang's own speculative decoding cannot express the relaxed rules, so relaxtune
talks to two servers without speculative flags through the native ``/generate``
API and runs the round in ``relaxtune.decoding`` (``docs/reference/sglang-protocol.md``).

- Scoring (one verifier request per round): ``input_ids = prefix + drafts``,
  ``max_new_tokens = 1``, temperature 0 (raw logprobs), ``logprob_start_len =
  len(prefix) - 1``, ``top_logprobs_num = K``, ``token_ids_logprob`` = ``K`` ids
  of the drafter's rows of this round, rank by rank. In the response,
  ``input_top_logprobs[j]`` (j = 1..N) is the distribution before draft j (entry
  0 is the boundary and is ignored), ``input_token_logprobs[j]`` the exact
  ``log p(d_j)``, ``input_token_ids_logprobs[j]`` the exact verifier logprobs of
  the drafter's ids, and ``output_top_logprobs[0]`` / ``output_token_ids_logprobs[0]``
  the bonus row.
- Drafting: token by token with our own sampler (``max_new_tokens = 1``, raw
  top-K logprobs of the next position), so ``q`` is known exactly; the radix
  cache makes each step cost one token.
- Rows are returned as dense log-probability rows ``[V]`` with ``-inf`` outside the
  returned ids; raw logprobs differ from raw logits by a per-row constant, so the
  sampling transform (and every method's rule) gives the same result. With a
  top-k cut ``k <= K`` the transformed rows are exact; without one, the mass
  outside the returned ids is recorded per position (``state.extra["missing_mass"]``).
  The verifier rows also hold ``K`` tokens of the drafter's rows taken rank by
  rank (each row's top ``K // (N + 1)`` at least: its whole top-20 for N <= 2
  at K = 64), so ``p`` is exact where ``q`` has its mass: the residual
  ``(p - q)+``, JS, TV and the cascades' sums over ``q`` (``spec_casc_tok``'s set
  ``A`` on raw logits even under a top-k cut). The price: ``(N + 1) K`` extra
  entries per scoring response (twice the top-K alone; every drafter id would
  cost ``(N + 1)^2 K``, 185 KiB and 25 ms of parsing per round at N = 10).
- SGLang 0.5.23 reports an input id at or above ``vocab_size - 1`` as 0 in
  ``input_token_logprobs`` (``SchedulerLogprobResultProcessor._process_input_token_logprobs``,
  ``logprob_result_processor.py``); its logprob is the true id's, so a draft
  ``vocab_size - 1`` scores normally.
- Every sampling parameter is sent explicitly: native ``/generate`` applies no
  generation_config defaults, but a server launched with
  ``--preferred-sampling-params`` merges those into any parameter left out.
- Stop tokens: the union SGLang stops on (``Req._check_token_based_finish``):
  the tokenizer's EOS, the model config's and generation config's
  ``eos_token_id`` (``ModelConfig._get_hf_eos_token_id``) and the turn-final
  markers SGLang adds (``attach_additional_stop_token_ids``).
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
from collections.abc import Sequence

import torch

from .base import DraftResult, Pick, SequenceState
from .http import AsyncHTTP, ServerClient, SGLangError
from .rows import RowByRow
from .sglang_costs import ServerCosts

__all__ = [
    "SGLangBackend",
    "SGLangError",
    "ServerClient",
    "AsyncHTTP",
    "parse_score",
    "parse_next",
    "stop_token_ids",
    "GREEDY_ONE",
]

# float32 log-softmax rounding: a logprob may exceed 0, and a row's probabilities may sum above 1, by this much
LOGPROB_SLACK = 1e-4
MASS_SLACK = 1e-3

GREEDY_ONE = {  # every sampling parameter, explicitly: one raw (greedy) step
    "max_new_tokens": 1,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "stop": [],
    "ignore_eos": True,
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


def _entries(entries, vocab: int, server: str, where: str, known: dict[int, float] | None = None) -> dict[int, float]:
    """``{token id: logprob}`` of a list ``[[logprob, id, text or null], ...]``,
    added to ``known`` (an id already there keeps its value)."""
    if not isinstance(entries, list):
        raise SGLangError(f"{server}: field '{where}' is not a list of [logprob, token_id] entries")
    known = {} if known is None else known
    for e in entries:
        if not isinstance(e, (list, tuple)) or len(e) < 2 or e[0] is None:
            raise SGLangError(f"{server}: malformed entry {e!r} in '{where}'")
        tid = int(e[1])
        if not 0 <= tid < vocab:
            raise SGLangError(f"{server}: token id {tid} in '{where}' is outside the vocabulary [0, {vocab})")
        lp = float(e[0])
        if math.isnan(lp) or lp > LOGPROB_SLACK:
            raise SGLangError(
                f"{server}: impossible logprob {lp!r} for token {tid} in '{where}' (a log-probability "
                "is at most 0): the server's rows are not log-probabilities"
            )
        known.setdefault(tid, lp)
    return known


def _row(known: dict[int, float], vocab: int, server: str = "server", where: str = "row") -> tuple[torch.Tensor, float]:
    """A log-prob row ``[V]`` (``-inf`` where unknown) and its missing mass.

    Raises:
        SGLangError: the returned probabilities sum above 1 (beyond float32 rounding,
            ``MASS_SLACK``): impossible for log-probabilities, so the row is refused
            (the sample fails) rather than renormalised into some other distribution.
    """
    row = torch.full((vocab,), -math.inf)
    if not known:
        return row, 1.0
    lps = torch.tensor(list(known.values()), dtype=torch.float64)
    total = float(lps.exp().sum())
    if total > 1.0 + MASS_SLACK:
        raise SGLangError(
            f"{server}: impossible row '{where}': its {len(known)} returned probabilities sum to "
            f"{total:.4g} (at most 1): the server's rows are not log-probabilities"
        )
    row[torch.tensor(list(known))] = lps.float()
    return row, max(0.0, 1.0 - total)


def _per_position(body: dict, key: str, count: int, server: str) -> list:
    """``meta_info[key]`` checked to hold ``count`` entries."""
    entries = _field(body, f"meta_info.{key}", server)
    if not isinstance(entries, list) or len(entries) != count:
        got = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise SGLangError(f"{server}: expected {count} '{key}' entries, got {got}")
    return entries


def parse_next(body: dict, vocab: int, server: str = "server", asked: bool = False) -> tuple[torch.Tensor, float]:
    """The next-token row of a one-token greedy request: (log-prob row ``[V]``,
    missing mass). With ``asked`` (the request sent ``token_ids_logprob``) the
    logprobs of ``output_token_ids_logprobs[0]`` join the top-K.

    Raises:
        SGLangError: a missing or malformed field, or an impossible row (a logprob
            above 0, probabilities summing above 1: see ``_row``).
    """
    known = _entries(_field(body, "meta_info.output_top_logprobs.0", server), vocab, server, "output_top_logprobs[0]")
    if asked:
        extra = _per_position(body, "output_token_ids_logprobs", 1, server)[0]
        _entries(extra, vocab, server, "output_token_ids_logprobs[0]", known)
    return _row(known, vocab, server, "output_top_logprobs[0]")


def parse_score(
    body: dict, drafts: Sequence[int], vocab: int, server: str = "server", asked: bool = False
) -> tuple[torch.Tensor, list[float], int]:
    """Rows of a scoring request over ``prefix + drafts`` (``logprob_start_len =
    len(prefix) - 1``): ``([N+1, V]`` log-prob rows, missing mass per row,
    ``cached_tokens``). Row j holds the top-K, the exact ``log p(d_j)`` from
    ``input_token_logprobs`` (outside the top-K too) and, with ``asked``, the
    logprobs of the ``token_ids_logprob`` ids (``input_token_ids_logprobs[j]``,
    ``output_token_ids_logprobs[0]`` for the bonus row).

    SGLang 0.5.23 reports a draft at or above ``vocab - 1`` as id 0 in
    ``input_token_logprobs`` (the logprob is the draft's): accepted as such.

    Raises:
        SGLangError: a missing field, a misaligned length, an id mismatch, or an
            impossible row (a logprob above 0, probabilities summing above 1).
    """
    n = len(drafts)
    top = _per_position(body, "input_top_logprobs", n + 1, server)
    tok = _per_position(body, "input_token_logprobs", n + 1, server)
    by_id = _per_position(body, "input_token_ids_logprobs", n + 1, server) if asked else None
    rows, missing = [], []
    for j, d in enumerate(drafts, start=1):
        known = _entries(top[j], vocab, server, f"input_top_logprobs[{j}]")
        lp_d, id_d = tok[j][0], int(tok[j][1])
        if id_d != (d if d < vocab - 1 else 0):
            raise SGLangError(f"{server}: input_token_logprobs[{j}] is for token {id_d}, expected draft {d}")
        if lp_d is None:
            raise SGLangError(f"{server}: input_token_logprobs[{j}] has no logprob for draft {d}")
        _entries([[lp_d, d]], vocab, server, f"input_token_logprobs[{j}]", known)
        if by_id is not None:
            _entries(by_id[j], vocab, server, f"input_token_ids_logprobs[{j}]", known)
        row, miss = _row(known, vocab, server, f"input_top_logprobs[{j}]")
        rows.append(row)
        missing.append(miss)
    bonus, miss = parse_next(body, vocab, server, asked)
    rows.append(bonus)
    missing.append(miss)
    cached = int(body.get("meta_info", {}).get("cached_tokens", -1))
    return torch.stack(rows), missing, cached


# turn-final markers SGLang 0.5.23 stops on when the tokenizer has them
# (``sglang/srt/utils/hf_transformers/common.py``, ``_ADDITIONAL_STOP_TOKEN_TEXTS``)
_EXTRA_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")


def stop_token_ids(tokenizer, *configs) -> frozenset[int]:
    """The ids an SGLang server stops on: ``tokenizer.eos_token_id``, the
    ``eos_token_id`` (an int or a list) of each config (model config, generation
    config; None skipped) and the tokenizer's ids of SGLang's extra turn-final
    markers (``Req._check_token_based_finish`` in ``schedule_batch.py``).
    Qwen: ``<|im_end|>`` (tokenizer, config) and ``<|endoftext|>`` (generation config)."""
    ids: set[int] = set()
    for source in (tokenizer, *configs):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    ids.update(added[t] for t in _EXTRA_STOP_TEXTS if t in added)
    return frozenset(int(i) for i in ids)


def _configs(path: str) -> tuple:
    """The model config and generation config under ``path`` (None where absent)."""
    from transformers import AutoConfig, GenerationConfig

    out = []
    for loader in (AutoConfig, GenerationConfig):
        try:
            out.append(loader.from_pretrained(path))
        except (OSError, ValueError):
            out.append(None)
    return tuple(out)


class SGLangBackend(RowByRow, ServerCosts):
    """A drafter and a verifier served by SGLang. Its batches run row by row, the
    rows' requests in flight together (``relaxtune.backends.rows``): R rows keep R
    requests in flight, at most ``max_concurrency`` (``batch_size``). ``cost_profile``
    times the servers at serving batch sizes (``relaxtune.backends.sglang_costs``).

    Args:
        drafter_url, verifier_url: base URLs of the two servers; ``drafter_url`` None for
            a verifier alone (``relaxtune.backends.lookup.PromptLookupBackend`` drafts).
        tokenizer: the shared tokenizer (object, or a model id / folder to load it
            from, with the model config and generation config when there: their
            EOS ids join the stop tokens, ``stop_token_ids``).
        vocab_size: logit width V (default: the model config's, else the tokenizer's length).
        top_logprobs: K, the top-K returned per position (>= the sampling top-k for exact rows).
        asked_ids: how many of the drafter's ids per round the verifier scores
            exactly (``token_ids_logprob``; default K, 0 asks none).
        timeout: seconds per request.
        retries: retries of transient faults per request.
        max_concurrency: sequences generated at once (``batch_size``; requests in flight).
        native_url: an optional STANDALONE speculative server that runs
            ``sglang_threshold`` itself (``relaxtune.backends.sglang_native``).
        check: probe ``/health`` of the servers now.
        models: ``(drafter, verifier)`` as the job names them: with ``check``, each
            server's ``/model_info`` must report that model
            (``relaxtune.backends.sglang_models.serves``).

    Raises:
        SGLangError: a server is unreachable, or serves another model than named (with ``check``).
    """

    def __init__(
        self,
        drafter_url: str,
        verifier_url: str,
        tokenizer,
        *,
        vocab_size: int | None = None,
        top_logprobs: int = 64,
        asked_ids: int | None = None,
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_concurrency: int = 8,
        name: str | None = None,
        native_url: str | None = None,
        check: bool = True,
        models: tuple[str, str] | None = None,
    ) -> None:
        from .sglang_native import NativeSpecServer

        self.http = AsyncHTTP(timeout, max_concurrency)
        self.drafter = ServerClient(drafter_url, "drafter", self.http, retries, backoff) if drafter_url else None
        self.verifier = ServerClient(verifier_url, "verifier", self.http, retries, backoff)
        self.native = NativeSpecServer(native_url, self.http, retries, backoff) if native_url else None
        if check:  # fail fast, before loading a tokenizer
            try:
                for server in (self.drafter, self.verifier) + ((self.native.server,) if self.native else ()):
                    if server is not None:
                        server.health()
                if models is not None:
                    from .sglang_models import check_serves

                    if self.drafter is not None and models[0] is not None:
                        check_serves(self.drafter, models[0], "--drafter")
                    check_serves(self.verifier, models[1], "--verifier")
            except SGLangError:
                self.http.close()
                raise
        configs: tuple = ()
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            configs = _configs(tokenizer)
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
            if vocab_size is None and getattr(configs[0], "vocab_size", None):
                vocab_size = int(configs[0].vocab_size)
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size or len(tokenizer))
        self.top_logprobs = int(top_logprobs)
        self.asked_ids = self.top_logprobs if asked_ids is None else int(asked_ids)
        self.max_concurrency = self.batch_size = int(max_concurrency)
        self.name = name or f"sglang:{drafter_url}->{verifier_url}"
        self.eos_token_ids = stop_token_ids(tokenizer, *configs)

    concurrent_rows = True  # a row's calls are HTTP requests: the rows' run in threads
    point_mass_drafts = False

    def start(self, prompt_ids: Sequence[int]) -> SequenceState:
        """A fresh state (no request yet)."""
        if len(prompt_ids) == 0:
            raise ValueError("the prompt must hold at least one token")
        state = SequenceState(tokens=[int(t) for t in prompt_ids], prompt_len=len(prompt_ids))
        state.extra.update(missing_mass=[], cached_tokens=[], drafter_ids=[])
        return state

    def _request(self, ids: list[int], start: int, score_ids: list[int] | None = None) -> dict:
        payload = {
            "input_ids": ids,
            "sampling_params": dict(GREEDY_ONE),
            "return_logprob": True,
            "logprob_start_len": start,
            "top_logprobs_num": self.top_logprobs,
        }
        if score_ids:
            payload["token_ids_logprob"] = score_ids
        return payload

    def draft(self, state: SequenceState, n: int, pick: Pick, extra_step: bool = False) -> DraftResult:
        """Draft ``n`` tokens one request at a time (our sampler picks each); the
        first ``asked_ids`` ids of the drafter's rows taken rank by rank (every
        row's best, then every row's second, ...) are kept for the next ``score``."""
        if self.drafter is None:
            raise RuntimeError(f"{self.name}: no drafter server (a model-free drafter wraps this backend)")
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
        logits = torch.stack(rows)
        top = logits.topk(min(self.top_logprobs, self.vocab_size), dim=-1)  # [R, K], each row's ids by rank
        # every row's rank 0, then every row's rank 1, ... (ids a row did not return left out)
        by_rank = top.indices.T.reshape(-1)[torch.isfinite(top.values.T.reshape(-1))].tolist()
        state.extra["drafter_ids"] = sorted(list(dict.fromkeys(by_rank))[: self.asked_ids])
        return DraftResult(ids, logits)

    def score(self, state: SequenceState, draft_ids: Sequence[int]) -> torch.Tensor:
        """Verifier log-prob rows ``[N+1, V]`` from one request, exact on the ids
        the last ``draft`` kept."""
        drafts = [int(t) for t in draft_ids]
        asked, state.extra["drafter_ids"] = state.extra.get("drafter_ids", []), []
        t0 = time.perf_counter()
        body = self.verifier.generate(self._request(state.tokens + drafts, len(state.tokens) - 1, asked))
        state.verify_seconds += time.perf_counter() - t0
        state.verify_forwards += 1
        rows, missing, cached = parse_score(body, drafts, self.vocab_size, str(self.verifier), asked=bool(asked))
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
