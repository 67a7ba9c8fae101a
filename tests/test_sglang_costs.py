"""The request shapes the SGLang cost profile times, against stand-in servers (the live
measurement is in ``tests/test_sglang_live_costs.py``): the verify timing sends the very
request the client verifies a round with, a timing's requests are in flight together,
and decode requests ask for ``DECODE_TOKENS`` greedy tokens on B distinct prefixes."""

from __future__ import annotations

import pytest

from relaxtune.backends.http import AsyncHTTP, ServerClient
from relaxtune.backends.sglang import GREEDY_ONE, SGLangBackend
from relaxtune.backends.sglang_costs import (
    CONTEXT_TOKENS,
    DECODE_TOKENS,
    concurrent_job,
    request_shapes,
    stream_prefixes,
)
from relaxtune.testing.sglang_standin import StandInServer

V = 64


@pytest.fixture
def servers(tiny_backend):
    d = StandInServer(tiny_backend.drafter).start()
    v = StandInServer(tiny_backend.verifier).start()
    yield d, v
    for s in (d, v):
        s.stop()


@pytest.fixture
def backend(servers, tiny_backend):
    d, v = servers
    b = SGLangBackend(d.url, v.url, tiny_backend.tokenizer, vocab_size=V, top_logprobs=V, backoff=0.01)
    yield b
    b.close()


@pytest.mark.parametrize("n_draft", [1, 3])
def test_the_verify_timing_sends_the_clients_own_scoring_request(servers, backend, n_draft):
    _, v = servers
    prompt = [5, 9, 7]
    shapes = request_shapes(backend, prompt, [n_draft], batch_size=2)
    assert list(shapes) == ["t_ar", "t_draft", f"t_verify[{n_draft + 1}]"]
    server, timed = shapes[f"t_verify[{n_draft + 1}]"]
    assert server is backend.verifier and len(timed) == 2
    for b, payload in enumerate(timed):  # the client's round on stream b's prefix, drafting the same ids
        prefix, drafts = payload["input_ids"][:-n_draft], payload["input_ids"][-n_draft:]
        state = backend.start(prefix)
        steps = iter(drafts)
        assert backend.draft(state, n_draft, pick=lambda row: next(steps)).ids == drafts
        backend.score(state, drafts)
        assert v.payloads[-1] == payload  # exactly the client's request: N + 1 tokens after the cached prefix
        assert len(payload["input_ids"]) - payload["logprob_start_len"] == n_draft + 1
        assert len(payload["token_ids_logprob"]) == V  # asked_ids = K ids of the drafter's rows


def test_decode_timings_ask_for_greedy_tokens_on_distinct_prefixes(backend):
    shapes = request_shapes(backend, [5, 9, 7], [2, 4], batch_size=3)
    assert list(shapes) == ["t_ar", "t_draft", "t_verify[3]", "t_verify[5]"]
    assert shapes["t_ar"][0] is backend.verifier and shapes["t_draft"][0] is backend.drafter
    decode = shapes["t_ar"][1]
    assert decode == shapes["t_draft"][1]
    assert [p["input_ids"] for p in decode] == stream_prefixes([5, 9, 7], 3, V)
    assert all(p["sampling_params"] == {**GREEDY_ONE, "max_new_tokens": DECODE_TOKENS} for p in decode)
    assert all(set(p) == {"input_ids", "sampling_params"} for p in decode)  # plain AR serving: no logprobs
    prefixes = stream_prefixes([5, 9, 7], 3, V)
    assert [p[3:6] for p in prefixes] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert all(len(p) == 3 + CONTEXT_TOKENS for p in prefixes) and len({tuple(p) for p in prefixes}) == 3


def test_without_a_drafter_server_nothing_is_drafted_or_asked(servers, tiny_backend):
    _, v = servers
    alone = SGLangBackend(None, v.url, tiny_backend.tokenizer, vocab_size=V, top_logprobs=V)
    try:
        shapes = request_shapes(alone, [5, 9], [0, 2], batch_size=1)
    finally:
        alone.close()
    assert list(shapes) == ["t_ar", "t_verify[3]"]  # N = 0 verifies one token: t_ar prices it
    assert "token_ids_logprob" not in shapes["t_verify[3]"][1][0]  # lookup drafts: a round asks for no ids


def test_a_timing_keeps_its_b_requests_in_flight_together(servers, backend):
    _, v = servers
    v.delay = 0.3
    http = AsyncHTTP(30.0, max_concurrency=4)
    try:
        server = ServerClient(v.url, "verifier", http)
        concurrent_job(server, request_shapes(backend, [5, 9, 7], [2], batch_size=4)["t_verify[3]"][1])()
    finally:
        http.close()
    assert v.peak_in_flight == 4 and v.requests == 4


def test_batch_sizes_must_be_integers_of_at_least_one(backend):
    for sizes in [(), (0,), (1, 2.5)]:
        with pytest.raises(ValueError, match="batch sizes must be integers >= 1"):
            backend.cost_profile([5, 9], [2], batch_sizes=sizes)
