"""Batched generation: a response does not depend on its batch (batch of 1, batch of 8
and the one-sequence engine agree token for token in float32), strict stays lossless
on the batched path, and failures stay with their rows."""

import pytest
import torch

from relaxtune.backends.hf import HFBackend
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.batch import Request, generate_batch
from relaxtune.engine.sequence import generate

from .conftest import P_FLOOR, chi2_pvalue
from .test_engine import _ar_joint
from .tiny_models import noisy_copy, tiny_lm, tiny_pair

SAMPLING = SamplingParams(temperature=0.8)
EOS = 37  # a token the tiny pair emits now and then: some responses end mid-round
LENGTHS = [1, 29, 3, 10, 47, 2, 17, 5, 33, 8, 21, 12]  # prompts of different lengths join as rows free up


def _requests() -> list[Request]:
    out = []
    for i, n in enumerate(LENGTHS):
        prompt = [(7 * i + 3 * j) % 64 for j in range(n)]
        stop = (" 11", " 5") if i % 3 == 0 else ()  # text of the tiny pair: ids joined by spaces
        out.append(Request(prompt, seed=100 + i, max_new_tokens=18 + 3 * i, stop=stop, key=i))
    return out


def _pair_with_eos() -> HFBackend:
    pair = tiny_pair(noise=0.2)
    backend = HFBackend(pair.drafter, pair.verifier, name="tiny-eos")
    backend.eos_token_ids = frozenset({EOS})
    return backend


def _view(g):
    s = g.stats
    return (
        g.token_ids,
        g.text,
        s.finish_reason,
        s.rounds,
        s.drafted,
        s.accepted,
        s.emitted,
        s.discarded,
        s.response_tokens,
        s.draft_forwards,
        s.verify_forwards,
    )


@pytest.mark.parametrize(
    "method, knob",
    [("strict", None), ("spec_cont_dec", 0.5), ("r_fuzzy", 0.3), ("ar", None)],
    ids=["strict", "spec_cont_dec", "r_fuzzy", "ar"],
)
@pytest.mark.slow
def test_a_response_does_not_depend_on_its_batch(method, knob):
    backend = _pair_with_eos()
    kw = dict(method=method, knob=knob, n_draft=3, sampling=SAMPLING)
    requests = _requests()
    alone = {
        r.key: generate(backend, r.prompt_ids, max_new_tokens=r.max_new_tokens, seed=r.seed, stop=r.stop, **kw)
        for r in requests
    }
    for size in (1, 8):
        got = {r.key: g for r, g in generate_batch(backend, requests, batch_size=size, **kw)}
        assert not [g for g in got.values() if isinstance(g, Exception)]
        assert {k: _view(g) for k, g in got.items()} == {k: _view(g) for k, g in alone.items()}, size
    ends = list(alone.values())
    by_eos = [g for g in ends if g.token_ids and g.token_ids[-1] == EOS]
    by_stop = [g for g in ends if g.stats.finish_reason == "stop" and g not in by_eos]
    assert by_eos and by_stop and any(g.stats.finish_reason == "length" for g in ends)
    if method != "ar":  # EOS and a stop string each ended a response inside a round's tokens
        assert any(g.stats.discarded for g in by_eos) and any(g.stats.discarded for g in by_stop)


def test_rows_are_charged_their_share_of_the_forwards():
    backend = tiny_pair(noise=0.2)
    out = [g for _, g in generate_batch(backend, _requests()[:4], n_draft=3, sampling=SAMPLING, batch_size=4)]
    for g in out:
        s = g.stats
        assert s.draft_forwards == 3 * s.rounds and s.verify_forwards == s.rounds  # prefill apart
        assert s.wall_seconds >= s.draft_seconds + s.verify_seconds + s.prefill_seconds > 0
        assert s.latency_seconds >= s.wall_seconds  # a share of the batch's time is less than its span


@pytest.mark.slow
def test_strict_is_lossless_on_the_batched_path():
    """The first two tokens of many batched responses follow the verifier's AR joint
    (chi-square), for two prompts of different lengths sharing the batches."""
    v = 6
    verifier = tiny_lm(vocab=v, seed=3, scale=3.0)
    backend = HFBackend(noisy_copy(verifier, 0.5), verifier)
    prompts = {"short": [1, 2, 3], "long": [5, 0, 4, 4, 1, 2, 3, 5, 5]}
    samples = 1500
    requests = [Request(prompts[k], seed=s, max_new_tokens=2, key=k) for s in range(samples) for k in prompts]
    codes: dict[str, list[int]] = {k: [] for k in prompts}
    for r, g in generate_batch(backend, requests, method="strict", n_draft=3, batch_size=16):
        codes[r.key].append(g.token_ids[0] * v + g.token_ids[1])
    for key, prompt in prompts.items():
        assert chi2_pvalue(torch.tensor(codes[key]), _ar_joint(verifier, prompt, v)) > P_FLOOR
        assert chi2_pvalue(torch.tensor(codes[key]), _ar_joint(backend.drafter, prompt, v)) < 1e-6


class _FailingJoin(HFBackend):
    def join(self, batch, prompts):
        if any(len(p) == 3 for p in prompts):
            raise RuntimeError("cannot prefill")
        return super().join(batch, prompts)


class _FailingRound(HFBackend):
    rounds = 0

    def score_batch(self, batch, draft_ids):
        self.rounds += 1
        if self.rounds == 4:
            raise RuntimeError("out of memory")
        return super().score_batch(batch, draft_ids)


@pytest.mark.slow
def test_failures_stay_with_their_rows():
    pair = tiny_pair(noise=0.2)
    requests = _requests()
    ok = {r.key: g for r, g in generate_batch(pair, requests, n_draft=3, sampling=SAMPLING, batch_size=4)}
    failing = _FailingJoin(pair.drafter, pair.verifier)
    got = {r.key: g for r, g in generate_batch(failing, requests, n_draft=3, sampling=SAMPLING, batch_size=4)}
    bad = {k for k, g in got.items() if isinstance(g, Exception)}
    assert bad == {2} and all(got[k].token_ids == ok[k].token_ids for k in got if k not in bad)
    failing = _FailingRound(pair.drafter, pair.verifier)
    got = {r.key: g for r, g in generate_batch(failing, requests, n_draft=3, sampling=SAMPLING, batch_size=4)}
    bad = {k for k, g in got.items() if isinstance(g, Exception)}
    assert len(bad) == 4 and "out of memory" in str(got[next(iter(bad))])  # the batch of that round
    assert len(got) == len(requests) and all(got[k].token_ids == ok[k].token_ids for k in got if k not in bad)


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="at least one token"):
        Request([], seed=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request([1], seed=0, max_new_tokens=0)
    with pytest.raises(ValueError, match="batch_size"):
        next(generate_batch(tiny_pair(noise=0.2), [Request([1], 0, 4)], batch_size=-1))


def test_models_that_cannot_share_a_ragged_cache_batch_row_by_row():
    """Sliding-window models (``ragged`` False) run their batches row by row on the one-sequence
    caches (``relaxtune.backends.rows``): the same responses as the ragged batch."""
    pair = _pair_with_eos()
    rows = HFBackend(pair.drafter, pair.verifier, name="tiny-rows", batch_size=4)
    rows.eos_token_ids, rows.ragged = pair.eos_token_ids, False
    kw = dict(method="spec_cont_dec", knob=0.5, n_draft=3, sampling=SAMPLING, batch_size=4)
    requests = _requests()[:6]
    ragged = {r.key: _view(g) for r, g in generate_batch(pair, requests, **kw)}
    by_row = {r.key: _view(g) for r, g in generate_batch(rows, requests, **kw)}
    assert by_row == ragged and len(by_row) == 6
    batch = rows.start_batch()
    assert batch.extra == {"rows": True}  # no ragged cache was built
