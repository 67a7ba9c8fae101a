"""The SGLang client's serving costs, measured through its servers at several serving
batch sizes (``ServerCosts.cost_profile``, a ``relaxtune.decoding.serving.ServingProfile``).

Every timing is the wall time of B concurrent HTTP ``/generate`` requests, one per
stream, issued together and awaited together (one ``httpx.AsyncClient`` on its own
event loop, ``relaxtune.backends.http.AsyncHTTP``, allowing B requests in flight): so
every time includes HTTP, JSON and the server's scheduling overhead, as the client
pays them. Stream b's prefix is the prompt plus 64 tokens of its own (the in-process
backends measure after the prompt plus 64 tokens too), cached on the servers by an
untimed first call.

- ``t_ar(B)``, ``t_draft(B)``: one decode step of B concurrent streams on the verifier
  (drafter) server, derived as ``wall / DECODE_TOKENS`` of B concurrent greedy requests
  of ``DECODE_TOKENS`` new tokens each (``ignore_eos``, no logprobs: plain AR serving).
  The wall also holds one request's HTTP round trip and its one-token prefill,
  spread over the ``DECODE_TOKENS`` steps.
- ``t_verify[N+1](B)``: the wall of B concurrent scoring requests of the very shape the
  client verifies a round with (``SGLangBackend.score``: ``prefix + N drafts``, one
  greedy new token, ``logprob_start_len = len(prefix) - 1``, the top-K logprobs and,
  with a drafter server, ``asked_ids`` ids in ``token_ids_logprob``): the server
  recomputes N + 1 tokens after the cached prefix. Never priced below ``t_ar(B)``
  (as ``relaxtune.backends.costs.measure_profile``).

All shapes of all batch sizes are timed interleaved in one
``relaxtune.decoding.speed.measure_interleaved`` call, each cost the fastest pass. Not
measured: the client drafts one request per token (``SGLangBackend.draft``), which
costs an HTTP round trip per draft more than the drafter's decode step priced here;
and a native speculative server (``native``) is never timed: its rounds run inside
SGLang, behind one request per response, with no step or verify pass to time apart.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence

from ..decoding.serving import ServingProfile
from ..decoding.speed import MAX_PASSES, MIN_PASSES, CostProfile, measure_interleaved, noisy_flags
from .http import AsyncHTTP, ServerClient, SGLangError

__all__ = [
    "ServerCosts",
    "DECODE_TOKENS",
    "CONTEXT_TOKENS",
    "stream_prefixes",
    "request_shapes",
    "concurrent_job",
    "server_batch_sizes",
    "served_dtype",
]

DECODE_TOKENS = 32  # new tokens per decode request: a decode step is its wall / DECODE_TOKENS
CONTEXT_TOKENS = 64  # tokens of each stream's own after the prompt, in its cached prefix


def server_batch_sizes(url: str, timeout: float = 10.0) -> tuple[int, ...]:
    """The serving batch sizes ``--serving-batch-sizes auto`` profiles on an SGLang server:
    ``relaxtune.decoding.serving.default_batch_sizes`` of the ``device`` its
    ``GET /server_info`` reports (its launch flags: ``cuda``, ``cpu``, ...). A server that
    does not answer is taken to be a GPU's (SGLang's default device); the job then fails on
    its health check with the server's own error."""
    import httpx

    from ..decoding.serving import default_batch_sizes

    try:
        info = httpx.get(f"{url.rstrip('/')}/server_info", timeout=timeout).json()
        device = str(info.get("device") or "cuda") if isinstance(info, dict) else "cuda"
    except (httpx.HTTPError, ValueError):
        device = "cuda"
    return default_batch_sizes(device)


@functools.lru_cache(maxsize=8)  # a server's dtype is fixed at launch: one request per export
def served_dtype(url: str, timeout: float = 10.0) -> str:
    """The dtype an SGLang server runs its model at, from its ``GET /server_info`` (its
    ``--dtype`` launch flag): the flag's value (``bfloat16``, ``float16`` ...), ``"auto (the
    checkpoint's own)"`` for SGLang's default, or ``"as served"`` when the server does not
    answer or does not say."""
    import httpx

    try:
        info = httpx.get(f"{url.rstrip('/')}/server_info", timeout=timeout).json()
    except (httpx.HTTPError, ValueError):
        return "as served"
    dtype = info.get("dtype") if isinstance(info, dict) else None
    if not isinstance(dtype, str) or not dtype:
        return "as served"
    return "auto (the checkpoint's own)" if dtype == "auto" else dtype


def stream_prefixes(prompt_ids: Sequence[int], batch_size: int, vocab_size: int) -> list[list[int]]:
    """B distinct prefixes: the prompt plus ``CONTEXT_TOKENS`` tokens, stream b's
    shifted by b (``(t + b) % V``), so the B streams share no cached tokens past the prompt.

    Raises:
        ValueError: an empty prompt.
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt must hold at least one token")
    head = [int(t) for t in prompt_ids]
    return [head + [(t + b) % vocab_size for t in range(CONTEXT_TOKENS)] for b in range(batch_size)]


def request_shapes(
    backend, prompt_ids: Sequence[int], n_drafts: Sequence[int], batch_size: int, decode_tokens: int = DECODE_TOKENS
) -> dict[str, tuple[ServerClient, list[dict]]]:
    """Per timing label (``t_ar``, ``t_draft`` with a drafter server, ``t_verify[k]``
    for each ``k = N + 1 > 1``): its server and the B ``/generate`` payloads one timing
    sends together. Decode payloads: the client's greedy parameters with
    ``max_new_tokens = decode_tokens`` and no logprobs; scoring payloads: the client's
    own (``backend._request``), N drafts after each prefix, asked ids as a round has them.

    Args:
        backend: a ``relaxtune.backends.sglang.SGLangBackend``.
    """
    prefixes = stream_prefixes(prompt_ids, batch_size, backend.vocab_size)
    # the client's own greedy parameters (every one explicit), for decode_tokens new tokens
    params = dict(backend._request(prefixes[0], 0)["sampling_params"], max_new_tokens=int(decode_tokens))
    decode = [{"input_ids": p, "sampling_params": params} for p in prefixes]
    shapes = {"t_ar": (backend.verifier, decode)}
    if backend.drafter is not None:
        shapes["t_draft"] = (backend.drafter, decode)
    # the ids a round asks the verifier for: asked_ids of the drafter's rows (none without a drafter server)
    asked = list(range(min(backend.asked_ids, backend.vocab_size))) if backend.drafter is not None else []
    for k in sorted({int(n) + 1 for n in n_drafts} - {1}):
        drafts = [[(b + j) % backend.vocab_size for j in range(1, k)] for b in range(batch_size)]
        shapes[f"t_verify[{k}]"] = (
            backend.verifier,
            [backend._request(p + d, len(p) - 1, asked) for p, d in zip(prefixes, drafts)],
        )
    return shapes


def concurrent_job(server: ServerClient, payloads: list[dict]) -> Callable[[], None]:
    """A call that sends ``payloads`` to ``server`` together (``server.http`` must allow
    them all in flight) and returns when every answer is in.

    Raises (from the call):
        SGLangError: a request failed for good, or a decode request answered another
            number of new tokens than it asked for (its wall would be divided wrongly).
    """

    async def together() -> list[dict]:
        return await asyncio.gather(*(server.agenerate(p) for p in payloads))

    def run() -> None:
        for payload, body in zip(payloads, server.http.run(together())):
            want = payload["sampling_params"]["max_new_tokens"]
            got = body.get("meta_info", {}).get("completion_tokens")
            if got != want:
                raise SGLangError(f"{server}: a request for {want} new tokens answered {got}")

    return run


class ServerCosts:
    """``cost_profile`` for ``relaxtune.backends.sglang.SGLangBackend`` (reads its
    ``verifier``, ``drafter``, ``native``, ``http``, ``vocab_size``, ``top_logprobs``,
    ``asked_ids``, ``name`` and ``_request``)."""

    def cost_profile(
        self,
        prompt_ids: Sequence[int],
        n_drafts: Sequence[int],
        batch_sizes: Sequence[int] = (1,),
        min_passes: int = MIN_PASSES,
        max_passes: int = MAX_PASSES,
    ) -> ServingProfile:
        """The servers' costs at each serving batch size B, timed through HTTP
        (``relaxtune.backends.sglang_costs``): ``t_ar(B)`` and ``t_draft(B)`` are
        ``wall / DECODE_TOKENS`` of B concurrent greedy decode requests on the verifier
        and drafter server, ``t_verify[N+1](B)`` the wall of B concurrent scoring
        requests of the client's round shape (N + 1 tokens recomputed after a cached
        prefix); HTTP and scheduling overhead included. Every shape of every batch size
        is timed in one ``measure_interleaved`` call; a spread above
        ``SPREAD_TOLERANCE`` is flagged in that batch size's profile. Without a drafter
        server (prompt lookup drafts) ``t_draft = t_ar``. A native speculative server
        is not timed (nothing per step to time through its one request per response):
        with one, only the two plain servers are measured, and ``source`` says so.

        Args:
            prompt_ids: the prompt every stream's prefix starts with.
            n_drafts: the draft lengths N to price (``t_verify[N+1]``).
            batch_sizes: the serving batch sizes B (concurrent streams), each >= 1.
            min_passes / max_passes: bounds on the interleaved passes.

        Returns:
            ``ServingProfile``: one ``CostProfile`` (seconds, ``batch_size`` B) per B,
            weighted at the smallest B.

        Raises:
            ValueError: no batch size, or one that is not an integer >= 1; an empty prompt.
            SGLangError: a request failed for good, or answered a wrong token count.
        """
        if not batch_sizes or any(int(b) != b or b < 1 for b in batch_sizes):
            raise ValueError(f"batch sizes must be integers >= 1, got {list(batch_sizes)!r}")
        sizes = sorted({int(b) for b in batch_sizes})
        http = AsyncHTTP(self.http.timeout, max(sizes))  # B requests in flight, whatever max_concurrency is
        try:
            jobs, labels = {}, {}
            for b in sizes:
                for label, (server, payloads) in request_shapes(self, prompt_ids, n_drafts, b).items():
                    alone = ServerClient(server.url, server.role, http, server.retries, server.backoff)
                    jobs[(b, label)] = concurrent_job(alone, payloads)
                    labels.setdefault(b, []).append(label)
            fastest, spread, passes = measure_interleaved(jobs, min_passes=min_passes, max_passes=max_passes)
        finally:
            http.close()
        return ServingProfile({b: self._profile_at(b, labels[b], fastest, spread, passes) for b in sizes})

    def _profile_at(self, b: int, labels: list[str], fastest: dict, spread: dict, passes: int) -> CostProfile:
        """Batch size ``b``'s ``CostProfile`` from the interleaved timings (keys ``(b, label)``)."""
        t_ar = fastest[(b, "t_ar")] / DECODE_TOKENS
        t_draft = fastest[(b, "t_draft")] / DECODE_TOKENS if (b, "t_draft") in fastest else t_ar
        mine = {label: spread[(b, label)] for label in labels}
        flags = noisy_flags(
            mine,
            passes,
            ": other requests or other work were running; re-measure with the servers and the machine idle, or give "
            "--c-rel",
        )
        return CostProfile(
            t_ar=t_ar,
            t_draft=t_draft,
            t_verify={
                int(x.removeprefix("t_verify[").rstrip("]")): max(fastest[(b, x)], t_ar)
                for x in labels
                if x.startswith("t_verify[")
            },
            source=self._source(b),
            spread=mine,
            passes=passes,
            flags=flags,
            batch_size=b,
        )

    def _source(self, b: int) -> str:
        """How batch size ``b`` was timed, by which servers, and when."""
        drafter = f"drafter {self.drafter.url}" if self.drafter is not None else "no drafter server: t_draft = t_ar"
        native = f"; native speculative server {self.native.server.url} not timed" if self.native is not None else ""
        return (
            f"{self.name}: SGLang verifier {self.verifier.url}, {drafter}{native}; batch {b}: {b} concurrent "
            f"HTTP /generate requests per timing (HTTP and scheduling overhead included); t_ar, t_draft = wall of "
            f"{DECODE_TOKENS} greedy new tokens / {DECODE_TOKENS}; t_verify[k] = wall of the client's scoring "
            f"request (k tokens after a cached prefix, top-{self.top_logprobs} logprobs); measured "
            f"{time.strftime('%Y-%m-%d')}"
        )
