"""The in-process engine on tiny random models: exactness, cache rollback, statistics."""

import pytest
import torch

from relaxtune.backends.hf import HFBackend
from relaxtune.decoding.sampling import SamplingParams
from relaxtune.decoding.speed import SPREAD_TOLERANCE
from relaxtune.engine.sequence import generate

from .clocks import SquareClock, timed
from .conftest import P_FLOOR, chi2_pvalue
from .tiny_models import noisy_copy, tiny_lm, tiny_pair

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], list(range(3, 60, 2))]


@pytest.mark.parametrize("n_draft", [1, 3, 7])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["len1", "len10", "len29"])
def test_greedy_strict_equals_greedy_ar(n_draft, prompt):
    backend = tiny_pair(noise=0.2)
    ar = generate(backend, prompt, method="ar", sampling=GREEDY, max_new_tokens=40)
    sd = generate(backend, prompt, method="strict", n_draft=n_draft, sampling=GREEDY, max_new_tokens=40)
    assert sd.token_ids == ar.token_ids
    assert 0 < sd.stats.accepted < sd.stats.drafted  # both accepts and rejections happened
    assert sd.stats.finish_reason == ar.stats.finish_reason == "length"


def test_cache_rollback_equals_recomputation():
    """Commit rounds that reject at chosen positions; the cached logits must match
    a from-scratch forward over the final sequence."""
    backend = tiny_pair(noise=0.2)
    state = backend.start([7, 8, 9])
    g = torch.Generator().manual_seed(0)
    pick = lambda z: int(torch.multinomial(z.softmax(-1), 1, generator=g))  # noqa: E731
    rounds = [(0, 4), (2, 4), (4, 4), (1, 3), (3, 3), (0, 2), (5, 5)]
    for keep, n in rounds:
        drafts = backend.draft(state, n, pick)
        backend.score(state, drafts.ids)
        forced = (drafts.ids[keep] + 1) % backend.vocab_size if keep < n else drafts.ids[-1]
        backend.commit(state, drafts.ids[:keep] + [forced])  # rejection at `keep` (or all accepted)
    drafts = backend.draft(state, 3, pick, extra_step=True)
    z_p = backend.score(state, drafts.ids)
    seq = torch.tensor([state.tokens + drafts.ids])
    with torch.inference_mode():
        ref_p = backend.verifier(input_ids=seq).logits[0, -4:]
        ref_q = backend.drafter(input_ids=seq).logits[0, -4:]
    assert torch.allclose(z_p, ref_p, atol=1e-5)
    assert torch.allclose(drafts.logits, ref_q, atol=1e-5)
    assert state.extra["v_cache"].get_seq_length() == len(seq[0])
    # every position was fed once; only the rejected drafts were fed in vain
    assert state.verify_tokens_fed == len(seq[0]) + sum(n - keep for keep, n in rounds)


def _ar_joint(model, prompt, v):
    with torch.inference_mode():
        p1 = model(input_ids=torch.tensor([prompt])).logits[0, -1].softmax(-1)
        seqs = torch.tensor([prompt + [a] for a in range(v)])
        p2 = model(input_ids=seqs).logits[:, -1].softmax(-1)
    return (p1[:, None] * p2).reshape(-1)


@pytest.mark.parametrize("method, knob", [("strict", None), ("ar", None), ("sglang_threshold", 1.0)])
@pytest.mark.slow
def test_sampled_first_two_tokens_follow_ar(method, knob):
    v = 6
    verifier = tiny_lm(vocab=v, seed=3, scale=3.0)
    backend = HFBackend(noisy_copy(verifier, 0.5), verifier)
    prompt = [1, 2, 3]
    joint = _ar_joint(verifier, prompt, v)
    samples = 2500
    codes = []
    for seed in range(samples):
        out = generate(backend, prompt, method=method, knob=knob, n_draft=3, max_new_tokens=2, seed=seed)
        codes.append(out.token_ids[0] * v + out.token_ids[1])
    assert chi2_pvalue(torch.tensor(codes), joint) > P_FLOOR
    q_joint = _ar_joint(backend.drafter, prompt, v)
    assert chi2_pvalue(torch.tensor(codes), q_joint) < 1e-6  # the drafter's joint is rejected


@pytest.mark.parametrize("method, knob", [("strict", None), ("cactus", 1.0), ("spec_cont_dec", 0.5), ("r_fuzzy", 0.3)])
def test_statistics_add_up(method, knob):
    backend = tiny_pair(noise=0.2)
    out = generate(
        backend,
        PROMPTS[1],
        method=method,
        knob=knob,
        n_draft=4,
        max_new_tokens=37,
        seed=1,
        sampling=SamplingParams(temperature=0.8),
    )
    s = out.stats
    assert s.drafted == 4 * s.rounds
    assert s.response_tokens == len(out.token_ids) == s.emitted == 37 and s.finish_reason == "length"
    # every round puts its accepted drafts and one more token in; a cut at the budget removes the last
    # round's residual or bonus token first (and maybe drafts before it), and only the last round overshoots
    assert 0 <= s.discarded <= 4 and s.emitted - s.accepted == s.rounds - (s.discarded > 0)
    extra = 1 if method == "spec_cont_dec" else 0
    assert s.draft_forwards == (4 + extra) * s.rounds
    assert s.verify_forwards == s.rounds
    assert s.wall_seconds >= s.draft_seconds + s.verify_seconds > 0
    assert s.acceptance_length == pytest.approx(s.accepted / s.rounds)


def test_sglang_threshold_drafts_the_drafters_argmax():
    backend = tiny_pair(noise=0.2)
    out = generate(
        backend,
        PROMPTS[1],
        method="sglang_threshold",
        knob=0.0,
        n_draft=4,
        max_new_tokens=20,
        seed=1,
        sampling=SamplingParams(temperature=0.8),
    )
    assert out.stats.accepted == out.stats.drafted  # t = 0 accepts every draft
    seq = list(PROMPTS[1])
    with torch.inference_mode():
        for i, token in enumerate(out.token_ids):
            if i % 5 != 4:  # drafted positions (every fifth token is the bonus, from p)
                assert token == int(backend.drafter(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(token)


def test_same_seed_same_response_and_eos_stop():
    backend = tiny_pair(noise=0.2)
    a = generate(backend, [4, 5], method="mentored", knob=0.5, seed=9, max_new_tokens=30, sampling=SamplingParams(0.9))
    b = generate(backend, [4, 5], method="mentored", knob=0.5, seed=9, max_new_tokens=30, sampling=SamplingParams(0.9))
    assert a.token_ids == b.token_ids
    eos = a.token_ids[5]
    stopping = HFBackend(backend.drafter, backend.verifier)
    stopping.eos_token_ids = frozenset({eos})
    c = generate(stopping, [4, 5], method="mentored", knob=0.5, seed=9, max_new_tokens=30, sampling=SamplingParams(0.9))
    first = a.token_ids.index(eos)
    assert c.token_ids == a.token_ids[: first + 1] and c.stats.finish_reason == "stop"


def test_stop_strings_cut_the_text():
    backend = tiny_pair(noise=0.2)
    full = generate(backend, [4, 5], method="strict", seed=2, max_new_tokens=20)
    needle = " ".join(str(t) for t in full.token_ids[6:8])
    cut = generate(backend, [4, 5], method="strict", seed=2, max_new_tokens=20, stop=[needle])
    assert cut.stats.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(needle)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(method="nope"), "unknown method"),
        (dict(method="cactus", knob=-1.0), "outside the valid range"),
        (dict(method="cactus", knob=1.0, sampling=GREEDY), "collapses to strict"),
        (dict(method="strict", n_draft=0), "n_draft"),
        (dict(method="strict", max_new_tokens=0), "max_new_tokens"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny_pair(noise=0.2), [1, 2], **kwargs)


def test_mismatched_vocabularies_are_refused():
    with pytest.raises(ValueError, match="share a vocabulary"):
        HFBackend(tiny_lm(vocab=32), tiny_lm(vocab=64))


def test_cost_profile_prices_every_draft_length_at_least_one_step():
    backend = tiny_pair(noise=0.2)
    serving = backend.cost_profile(PROMPTS[1], [2, 5], min_passes=2, max_passes=3)
    assert serving.batch_sizes == [1] and serving.declared == 1
    profile = serving.at(1)
    assert set(profile.t_verify) == {3, 6} and 2 <= profile.passes <= 3 and profile.batch_size == 1
    assert all(t >= profile.t_ar > 0 for t in profile.t_verify.values()) and profile.t_draft > 0
    assert set(profile.spread) == {"t_ar", "t_draft", "t_verify[3]", "t_verify[6]"}
    noisy = [k for k, v in profile.spread.items() if v > SPREAD_TOLERANCE]
    assert bool(profile.flags) == bool(noisy) and all(k in profile.flags[0] for k in noisy)


def test_cost_profile_times_every_batch_size_in_one_interleaved_measurement():
    backend = tiny_pair(noise=0.2)
    shapes: list[tuple[str, tuple[int, ...]]] = []
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, a, kw, name=name: shapes.append((name, tuple(kw["input_ids"].shape))), with_kwargs=True
        )
        for name, m in (("v", backend.verifier), ("d", backend.drafter))
    ]
    try:
        serving = backend.cost_profile(PROMPTS[1], [2, 5], (3, 1), min_passes=3, max_passes=4, clock=SquareClock())
    finally:
        for h in hooks:
            h.remove()
    assert serving.batch_sizes == [1, 3] and [p.batch_size for p in serving.profiles.values()] == [1, 3]
    # one measurement: batch 3's shapes were timed after batch 1's in the same pass (the m-th timed call)
    one, three = serving.at(1), serving.at(3)
    assert (one.t_ar, one.t_draft, one.t_verify[3], one.t_verify[6]) == pytest.approx([timed(m) for m in range(4)])
    assert (three.t_ar, three.t_draft, three.t_verify[3], three.t_verify[6]) == pytest.approx(
        [timed(m) for m in range(4, 8)]
    )
    # every timing grew pass after pass: all four passes ran, each batch size flagged on its own
    assert one.passes == three.passes == 4 and len(one.flags) == len(three.flags) == 1
    assert "batch 3" in three.source and "batch 1" in one.source
    assert [f.split(":")[0] for f in serving.flags] == ["batch 1", "batch 3"]
    # the forwards ran B rows of k tokens: a warm-up and four timed passes of each shape
    timed_shapes = [s for s in shapes if s[1][1] < 10]  # the prefills feed the whole context
    for shape in [
        ("v", (1, 1)),
        ("d", (1, 1)),
        ("v", (1, 3)),
        ("v", (1, 6)),
        ("v", (3, 1)),
        ("d", (3, 1)),
        ("v", (3, 3)),
        ("v", (3, 6)),
    ]:
        assert timed_shapes.count(shape) == 5, shape
    assert len(timed_shapes) == 40
    with pytest.raises(ValueError, match="integers >= 1"):
        backend.cost_profile(PROMPTS[1], [2], (0, 4))
