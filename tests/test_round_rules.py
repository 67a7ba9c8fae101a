"""The engines' round-level rules: vLLM 0.33.0 FLy and TensorRT-LLM's relaxed MTP
acceptance, each against a loop-by-loop transcription of the engine's kernel
(the oracle), plus their strict points, validation and the round-level hook's
contract (same path, same random numbers)."""

import math

import pytest
import torch

from relaxtune.decoding.fly import fly_entropy
from relaxtune.decoding.methods import ENGINE_METHODS, METHODS, get_method
from relaxtune.decoding.round import verify_round, verify_rounds
from relaxtune.decoding.sampling import SamplingParams, sample_from_rows, transform_logits
from relaxtune.decoding.trtllm import ThinkingState, trtllm_thinking_state

V = 7


def _fly_knobs(w, theta, k=3):
    return {"fly_window_size": w, "fly_entropy_threshold": theta, "fly_entropy_top_k": k}


def _sampled_batch(seed, b, n, temperature=0.9, top_k=None, greedy_drafts=False):
    g = torch.Generator().manual_seed(seed)
    z_p = torch.randn(b, n + 1, V, generator=g) * 1.5
    z_q = z_p[:, :n] + torch.randn(b, n, V, generator=g) * 0.8
    p = transform_logits(z_p, SamplingParams(temperature, top_k))
    if greedy_drafts:
        x = z_q.argmax(-1)
        q = torch.nn.functional.one_hot(x, V).float()
    else:
        q = transform_logits(z_q, SamplingParams(temperature))
        x = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(b, n)
    u = torch.rand(b, n + 1, generator=g)
    return z_p, p, q, x, u


# ------------------------------------------------------------------ vLLM FLy oracle


def vllm_fly_random(P, Q, d, u, w, theta, k, no_draft_probs):
    """vLLM 0.33.0 ``apply_fly_random_acceptance_kernel`` then the native random kernel,
    one request, transcribed loop by loop (``P / q >= u`` in float64, u := 0 to defer)."""
    K = len(d)
    H = fly_entropy(P[:K], k)
    u = u.double().clone()

    def qd(i):
        return 1.0 if no_draft_probs else float(Q[i, d[i]])

    def native(i, uu):
        return qd(i) > 0 and float(P[i, d[i]]) / qd(i) >= float(uu[i])

    orig = u.clone()
    for i in range(K):
        can = (
            not native(i, orig)
            and qd(i) > 0
            and float(P[i, d[i]]) > 0
            and i + w < K
            and float(H[i]) >= theta
            and all(native(i + o, orig) for o in range(1, w + 1))
        )
        if can:
            u[i] = 0.0
    n = 0
    while n < K and native(n, u):
        n += 1
    return n


def vllm_fly_greedy(logits, d, w, theta, k):
    """vLLM 0.33.0 ``apply_fly_greedy_acceptance_kernel`` then the native greedy kernel:
    returns the emitted tokens (drafts while they match the edited argmax, then the argmax)."""
    K = len(d)
    a = logits.argmax(-1).tolist()
    H = fly_entropy(logits[:K].softmax(-1), k)
    for i in range(K):
        can = (
            d[i] != a[i]
            and i + w < K
            and float(H[i]) >= theta
            and float(logits[i, d[i]]) > -math.inf
            and all(d[i + o] == a[i + o] for o in range(1, w + 1))
        )
        if can:
            a[i] = d[i]
    out = []
    for i in range(K):
        out.append(a[i])
        if d[i] != a[i]:
            return out
    return out + [a[K]]


@pytest.mark.parametrize("greedy_drafts", [False, True])
@pytest.mark.parametrize("w, theta, top_k", [(1, 0.3, None), (2, 0.5, None), (3, 0.0, 4), (2, 0.8, 3)])
def test_fly_sampled_path_matches_the_vllm_kernels_round_for_round(greedy_drafts, w, theta, top_k):
    n = 5
    z_p, p, q, x, u = _sampled_batch(11, 2000, n, top_k=top_k, greedy_drafts=greedy_drafts)
    knobs = _fly_knobs(w, theta)
    out = verify_rounds(p, q, x, "fly", knobs, uniforms=u, temperature=0.9)
    strict = verify_rounds(p, q, x, "strict", uniforms=u, temperature=0.9)
    flipped = 0
    for i in range(p.shape[0]):
        ref = vllm_fly_random(p[i], q[i], x[i].tolist(), u[i, :n], w, theta, 3, greedy_drafts)
        assert int(out.accepted[i]) == ref, i
        flipped += ref > int(strict.accepted[i])
    assert flipped > 20  # the deferral fires on these rows
    assert bool((out.accepted >= strict.accepted).all())
    # the token after the accepted drafts is the native residual norm((p - q)+) (or the bonus from p)
    b = torch.arange(p.shape[0])
    acc = out.accepted
    rej = acc < n
    rows = (p[b, acc.clamp_max(n)] - torch.cat([q, torch.zeros(q.shape[0], 1, V)], 1)[b, acc]).clamp_min(0)
    expect = sample_from_rows(rows, u[:, n])
    assert torch.equal(out.tokens[b[rej], acc[rej]], expect[rej])
    assert torch.equal(out.tokens[b[~rej], n], sample_from_rows(p[b[~rej], n], u[~rej, n]))


@pytest.mark.parametrize("w, theta, k", [(1, 0.2, 3), (2, 0.4, 3), (2, 0.0, 2), (3, 0.6, 5)])
def test_fly_greedy_path_matches_the_vllm_kernels_round_for_round(w, theta, k):
    n = 5
    g = torch.Generator().manual_seed(3)
    b = 2000
    z_p = torch.randn(b, n + 1, V, generator=g) * 1.2
    z_p[:, :, -1] = -math.inf  # a token the verifier excludes is never flipped in
    z_q = z_p[:, :n] + torch.randn(b, n, V, generator=g) * 0.7
    x = torch.where(torch.rand(b, n, generator=g) < 0.1, V - 1, z_q.argmax(-1))
    q = torch.nn.functional.one_hot(x, V).float()
    p = transform_logits(z_p, SamplingParams(0.0))
    out = verify_rounds(
        p, q, x, "fly", _fly_knobs(w, theta, k), z_p=z_p, temperature=0.0, generator=torch.Generator().manual_seed(0)
    )
    flipped = 0
    for i in range(b):
        ref = vllm_fly_greedy(z_p[i], x[i].tolist(), w, theta, k)
        got = out.tokens[i, : int(out.num_emitted[i])].tolist()
        assert got == ref, i
        flipped += sum(int(t != int(a)) for t, a in zip(got, z_p[i].argmax(-1).tolist()))
    assert flipped > 20
    assert not bool(((out.tokens[:, :n] == V - 1) & (torch.arange(n) < out.accepted[:, None])).any())


def test_fly_at_its_strict_point_is_strict_bit_for_bit_with_the_same_random_numbers():
    z_p, p, q, x, _ = _sampled_batch(5, 3000, 4)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    a = verify_rounds(p, q, x, "fly", _fly_knobs(2, math.inf), g1, temperature=0.9)
    s = verify_rounds(p, q, x, "strict", None, g2, temperature=0.9)
    assert torch.equal(a.tokens, s.tokens) and torch.equal(a.accepted, s.accepted)
    assert torch.equal(g1.get_state(), g2.get_state())  # the same N + 1 uniforms consumed
    spec = get_method("fly")
    assert spec.is_strict(_fly_knobs(2, math.inf)) and spec.is_strict(math.inf) and not spec.is_strict(0.3)


def test_fly_validation_and_defaults():
    spec = ENGINE_METHODS["fly"]
    assert "fly" not in METHODS  # not wired into listings or the search yet
    assert spec.knob_names == ("fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k")
    assert spec.named(0.3) == _fly_knobs(None, 0.3, 3)
    z_p, p, q, x, u = _sampled_batch(1, 4, 1)
    with pytest.raises(ValueError, match="num_speculative_tokens >= 2"):
        verify_rounds(p, q, x, "fly", 0.3, uniforms=u, temperature=0.9)
    z_p, p, q, x, u = _sampled_batch(1, 4, 3)
    with pytest.raises(ValueError, match="fly_window_size < num_speculative_tokens: W = 3, N = 3"):
        verify_rounds(p, q, x, "fly", _fly_knobs(3, 0.3), uniforms=u, temperature=0.9)
    with pytest.raises(ValueError, match="fly_window_size of 'fly' is an integer"):
        spec.check_knob(_fly_knobs(1.5, 0.3))
    with pytest.raises(ValueError, match="needs the raw verifier logits"):
        verify_rounds(transform_logits(z_p, SamplingParams(0.0)), q, x, "fly", 0.3, uniforms=u, temperature=0.0)
    # None is vLLM's default window min(6, N - 1): here N = 3, W = 2, the same as an explicit 2
    a = verify_rounds(p, q, x, "fly", _fly_knobs(None, 0.0), uniforms=u, temperature=0.9)
    b = verify_rounds(p, q, x, "fly", _fly_knobs(2, 0.0), uniforms=u, temperature=0.9)
    assert torch.equal(a.tokens, b.tokens)


def test_fly_entropy_is_not_renormalised_within_the_top_k():
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    top = torch.tensor([0.4, 0.3, 0.2])
    assert torch.allclose(fly_entropy(p, 3), -(top * top.log()).sum().unsqueeze(0))
    assert torch.allclose(fly_entropy(p, 10), -(p * p.log()).sum(-1))  # k capped at V
    assert float(fly_entropy(torch.tensor([[1.0, 0.0, 0.0]]), 3)) == 0.0


# ------------------------------------------------------- TensorRT-LLM relaxed MTP

BEGIN, END = 5, 6


def trt_kernel(logits, d, delta_state, topk, delta_cfg):
    """``mtpRelaxedAcceptanceKernel`` for one request, transcribed loop by loop, then the
    phase flip over the committed tokens (golden token included)."""
    probs = logits.float().softmax(-1)
    val, idx = probs.topk(min(topk, probs.shape[-1]), -1)
    n = 0
    while n < len(d):
        threshold = float(val[n, 0]) - delta_state
        ok = False
        for jj in range(val.shape[-1]):
            if jj > 0 and threshold > float(val[n, jj]):
                break
            if d[n] == int(idx[n, jj]):
                n += 1
                ok = True
                break
        if not ok:
            break
    out = list(d[:n]) + [int(idx[n, 0])]
    for t in out:
        if t == BEGIN:
            delta_state = delta_cfg
        if t == END:
            delta_state = 0.0
    return out, delta_state


@pytest.mark.parametrize("topk, delta", [(10, 0.6), (3, 0.1), (2, 0.05), (1, 0.6)])
def test_trtllm_matches_the_kernel_across_rounds_with_the_thinking_state(topk, delta):
    b, n, rounds = 300, 3, 8
    g = torch.Generator().manual_seed(21)
    prompts = [[1, BEGIN, 2] if i % 3 else [1, 2] for i in range(b)]
    state = trtllm_thinking_state(prompts, BEGIN, END)
    ref_delta = [delta if i % 3 else 0.0 for i in range(b)]
    knobs = {"relaxed_topk": topk, "relaxed_delta": delta}
    relaxed = 0
    for r in range(rounds):
        z_p = torch.randn(b, n + 1, V, generator=g) * 1.3
        z_p[:, :, BEGIN] += 0.8 * (r % 2)  # make the phase tokens frequent on alternate rounds
        z_p[:, :, END] += 0.8 * ((r + 1) % 2)
        ranks = torch.randint(0, 3, (b, n), generator=g)  # drafts among the verifier's top 3
        x = z_p[:, :n].argsort(-1, descending=True).gather(-1, ranks.unsqueeze(-1)).squeeze(-1)
        q = torch.nn.functional.one_hot(x, V).float()
        p = transform_logits(z_p, SamplingParams(0.0))
        out = verify_rounds(
            p,
            q,
            x,
            "trtllm_relaxed",
            knobs,
            z_p=z_p,
            temperature=0.0,
            state=state,
            generator=torch.Generator().manual_seed(r),
        )
        for i in range(b):
            tokens, ref_delta[i] = trt_kernel(z_p[i], x[i].tolist(), ref_delta[i], topk, delta)
            assert out.tokens[i, : int(out.num_emitted[i])].tolist() == tokens, (r, i)
            relaxed += sum(int(t) != int(a) for t, a in zip(tokens[:-1], z_p[i].argmax(-1).tolist()))
        state = out.state
        assert state.thinking.tolist() == [dd > 0 for dd in ref_delta] or delta == 0
    assert (relaxed > 50) == (topk > 1)


def test_trtllm_outside_thinking_and_at_its_strict_points_is_strict_greedy():
    b, n = 2000, 4
    g = torch.Generator().manual_seed(2)
    z_p = torch.randn(b, n + 1, V, generator=g)
    x = torch.randint(0, V, (b, n), generator=g)
    x = torch.where(torch.rand(b, n, generator=g) < 0.6, z_p[:, :n].argmax(-1), x)
    q = torch.nn.functional.one_hot(x, V).float()
    p = transform_logits(z_p, SamplingParams(0.0))
    strict = verify_rounds(p, q, x, "strict", temperature=0.0, generator=torch.Generator().manual_seed(0))
    outside = ThinkingState(torch.zeros(b, dtype=torch.bool), BEGIN, END)
    inside = ThinkingState(torch.ones(b, dtype=torch.bool), BEGIN, END)
    for knobs, state in [
        ({"relaxed_topk": 10, "relaxed_delta": 0.9}, outside),
        ({"relaxed_topk": 1, "relaxed_delta": 0.9}, inside),
        ({"relaxed_topk": 10, "relaxed_delta": 0.0}, inside),
    ]:
        out = verify_rounds(
            p,
            q,
            x,
            "trtllm_relaxed",
            knobs,
            z_p=z_p,
            temperature=0.0,
            state=state,
            generator=torch.Generator().manual_seed(0),
        )
        assert torch.equal(out.tokens, strict.tokens) and torch.equal(out.accepted, strict.accepted)
    spec = get_method("trtllm_relaxed")
    assert spec.is_strict({"relaxed_topk": 1, "relaxed_delta": 0.9}) and spec.is_strict(0.0)
    assert not spec.is_strict({"relaxed_topk": 10, "relaxed_delta": 0.6})
    assert spec.named(0.6) == {"relaxed_topk": 10, "relaxed_delta": 0.6}


def test_trtllm_refuses_sampling_missing_state_and_missing_logits():
    g = torch.Generator().manual_seed(0)
    z_p = torch.randn(2, 3, V, generator=g)
    p = transform_logits(z_p, SamplingParams(0.0))
    x = p[:, :2].argmax(-1)
    q = torch.nn.functional.one_hot(x, V).float()
    st = trtllm_thinking_state([[BEGIN], [END, 1]], BEGIN, END)
    assert st.thinking.tolist() == [True, False]
    with pytest.raises(ValueError) as refused:
        verify_rounds(p, q, x, "trtllm_relaxed", 0.6, z_p=z_p, temperature=0.7, state=st)
    assert str(refused.value) == (  # says what to change, and where
        "method 'trtllm_relaxed' is greedy-only as its engine runs it: it ignores the temperature (here 0.7) "
        "and emits the verifier's argmax; measure it at temperature 0 (a task spec with "
        "sampling: {temperature: 0}; generate and eval: --temperature 0)"
    )
    with pytest.raises(ValueError, match="carries state across rounds: pass state="):
        verify_rounds(p, q, x, "trtllm_relaxed", 0.6, z_p=z_p, temperature=0.0)
    with pytest.raises(ValueError, match="raw verifier logits"):
        verify_rounds(p, q, x, "trtllm_relaxed", 0.6, temperature=0.0, state=st)
    one = verify_round(
        p[0],
        q[0],
        x[0],
        "trtllm_relaxed",
        0.6,
        z_p=z_p[0],
        temperature=0.0,
        state=ThinkingState(torch.tensor([True]), BEGIN, END),
    )
    assert isinstance(one.state, ThinkingState) and one.accepted == 2
