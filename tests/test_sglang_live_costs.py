"""The SGLang client's serving cost profile, measured through real SGLang 0.5.23 servers
on this CPU (``live_sglang``; the servers are the session's ``live_pair``). Times on a
shared machine are noise: only their presence, sign and bookkeeping are checked."""

from __future__ import annotations

import asyncio

import pytest

from relaxtune.backends.sglang import SGLangBackend
from relaxtune.backends.sglang_costs import DECODE_TOKENS, request_shapes
from relaxtune.decoding.serving import ServingProfile

pytestmark = pytest.mark.live_sglang
V = 64
PROMPT = [5, 9, 7, 11]


def test_the_profile_has_every_batch_size_and_draft_length_timed_concurrently(live_pair):
    backend = SGLangBackend(*live_pair.urls, live_pair.verifier, top_logprobs=V, max_concurrency=1)
    try:  # max_concurrency 1 caps the client's requests, not the measurement's
        profile = backend.cost_profile(PROMPT, [1, 3], batch_sizes=(3, 1), min_passes=2, max_passes=3)
        shapes = request_shapes(backend, PROMPT, [1, 3], batch_size=3)

        async def together(server, payloads):
            return await asyncio.gather(*(server.agenerate(p) for p in payloads))

        bodies = {label: backend.http.run(together(*shape)) for label, shape in shapes.items()}
    finally:
        backend.close()
    assert isinstance(profile, ServingProfile) and profile.batch_sizes == [1, 3] and dict(profile.weights) == {1: 1.0}
    for b, p in profile.profiles.items():
        assert p.batch_size == b and set(p.t_verify) == {2, 4}
        assert p.t_ar > 0 and p.t_draft > 0 and min(p.t_verify.values()) >= p.t_ar
        assert set(p.spread) == {"t_ar", "t_draft", "t_verify[2]", "t_verify[4]"} and 2 <= p.passes <= 3
        assert f"batch {b}: {b} concurrent HTTP /generate requests per timing" in p.source
        assert "HTTP and scheduling overhead included" in p.source
        assert f"wall of {DECODE_TOKENS} greedy new tokens / {DECODE_TOKENS}" in p.source
        assert live_pair.urls[0] in p.source and live_pair.urls[1] in p.source and "native" not in p.source
    # what was timed, once more: decode answers DECODE_TOKENS tokens; scoring recomputes only N + 1 tokens
    assert all(b["meta_info"]["completion_tokens"] == DECODE_TOKENS for k in ("t_ar", "t_draft") for b in bodies[k])
    for k in (2, 4):
        for payload, body in zip(shapes[f"t_verify[{k}]"][1], bodies[f"t_verify[{k}]"]):
            assert body["meta_info"]["cached_tokens"] == payload["logprob_start_len"] == len(payload["input_ids"]) - k


def test_without_a_drafter_server_t_draft_is_t_ar_and_a_native_server_is_not_timed(live_pair):
    backend = SGLangBackend(
        None, live_pair.urls[1], live_pair.verifier, top_logprobs=V, native_url="http://127.0.0.1:9", check=False
    )
    try:  # nothing listens at the native URL: the measurement never asks it
        profile = backend.cost_profile(PROMPT, [2], batch_sizes=(2,), min_passes=1, max_passes=2)
    finally:
        backend.close()
    p = profile.at(2)
    assert profile.batch_sizes == [2] and p.batch_size == 2 and p.t_draft == p.t_ar and set(p.t_verify) == {3}
    assert set(p.spread) == {"t_ar", "t_verify[3]"}
    assert "no drafter server: t_draft = t_ar" in p.source
    assert "native speculative server http://127.0.0.1:9 not timed" in p.source
