"""SGLang's native threshold rule (sglang_threshold): the kernel, transcribed, and its closed form."""

import math

import pytest
import torch

from relaxtune.decoding.methods import METHODS, Rows
from relaxtune.decoding.round import verify_rounds
from relaxtune.decoding.sampling import SamplingParams, transform_logits

from .conftest import P_FLOOR, chi2_pvalue

B = 60000


def kernel_chain(p, x, u, u_final, t, acc=None):
    """SGLang 0.5.23's ``TreeSpeculativeSamplingTargetOnly``
    (``sgl_kernel/speculative/sampling.cuh``) for one chain (topk 1), transcribed
    loop by loop: accept while ``p(x) > 0 and (coin < p(x) / acc or p(x) >= single)``
    (float division: ``p(x) / 0 = inf``); then sample ``relu(p - rejected)`` at the
    stop row: the first id whose running sum exceeds ``u_final * sum``. ``t`` is
    ``threshold_single``; ``acc`` (default ``t``) is ``threshold_acc``, clamped to
    1e-9 by the host code."""
    single, acc = t, (t if acc is None else acc)
    n = x.shape[0]
    accepted, row = 0, 0
    rejected = torch.zeros_like(p[0])
    for j in range(n):
        px = float(p[j, x[j]])
        if px > 0 and (float(u[j]) < (px / acc if acc > 0 else math.inf) or px >= single):
            accepted += 1
            row = j + 1
        else:
            rejected[x[j]] = px
            break
    residual = (p[row] - rejected).clamp_min(0).double()
    target = float(u_final) * float(residual.sum())
    token = int((residual.cumsum(0) > target).nonzero()[0])
    return [int(v) for v in x[:accepted]] + [token], accepted


def _greedy_batch(seed, b, n=3, v=8, temperature=0.7, top_k=None):
    g = torch.Generator().manual_seed(seed)
    z_p = torch.randn(b, n + 1, v, generator=g) * 2
    z_q = z_p[:, :n] + torch.randn(b, n, v, generator=g)
    p = transform_logits(z_p, SamplingParams(temperature, top_k))
    x = z_q.argmax(-1)
    q = torch.nn.functional.one_hot(x, v).float()
    return g, p, q, x


@pytest.mark.parametrize("top_k", [None, 3])
@pytest.mark.parametrize("t", [1.0, 0.6, 0.2, 0.0])
def test_matches_the_sglang_kernel_round_for_round(t, top_k):
    g, p, q, x = _greedy_batch(5, 3000, top_k=top_k)
    u = torch.rand(p.shape[0], p.shape[1], generator=g)
    out = verify_rounds(p, q, x, "sglang_threshold", t, uniforms=u, temperature=0.7)
    same = 0
    for i in range(p.shape[0]):
        tokens, accepted = kernel_chain(p[i], x[i], u[i], u[i, -1], t)
        assert int(out.accepted[i]) == accepted
        same += out.tokens[i, : accepted + 1].tolist() == tokens
    assert same >= 0.999 * p.shape[0]  # inverse CDF in the same id order (float sums may split a hair)
    p_x = p[:, :3].gather(-1, x.unsqueeze(-1)).squeeze(-1)
    if t == 0.0:  # every draft the verifier keeps, never one it excludes (the top-k cut)
        leading = (p_x > 0).long().cumprod(-1).sum(-1)
        assert torch.equal(out.accepted, leading) and (top_k is None) == bool((leading == 3).all())


def test_a_draft_the_verifier_excludes_is_never_accepted_at_threshold_zero():
    p = torch.tensor([[[0.0, 0.6, 0.4], [0.2, 0.3, 0.5]]]).expand(2000, 2, 3)
    x = torch.zeros(2000, 1, dtype=torch.long)
    q = torch.nn.functional.one_hot(x, 3).float()
    out = verify_rounds(p, q, x, "sglang_threshold", 0.0, torch.Generator().manual_seed(1), temperature=0.7)
    assert int(out.accepted.sum()) == 0 and chi2_pvalue(out.tokens[:, 0], p[0, 0]) > P_FLOOR
    assert float(METHODS["sglang_threshold"].rej_at(Rows(p[0, :1], q[0], x[0], None, None, 0.7), 0.0)) == 0.0


def test_threshold_one_is_lossless_and_bit_identical_to_strict_on_greedy_drafts():
    g, p, q, x = _greedy_batch(6, 4000)
    assert METHODS["sglang_threshold"].is_strict(1.0)
    ref = verify_rounds(p, q, x, "strict", generator=torch.Generator().manual_seed(3))
    out = verify_rounds(p, q, x, "sglang_threshold", 1.0, generator=torch.Generator().manual_seed(3), temperature=0.7)
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.accepted, ref.accepted)
    # one fixed position: the emitted distribution is p although the draft is deterministic
    p1, x1 = p[:1, :2].expand(B, 2, -1), x[:1, :1].expand(B, 1)
    q1 = torch.nn.functional.one_hot(x1, p.shape[-1]).float()
    first = verify_rounds(
        p1, q1, x1, "sglang_threshold", 1.0, torch.Generator().manual_seed(4), temperature=0.7
    ).tokens[:, 0]
    assert chi2_pvalue(first, p[0, 0]) > P_FLOOR


def test_relaxed_threshold_follows_its_closed_form():
    v, t = 6, 0.5
    p0 = torch.tensor([0.05, 0.3, 0.25, 0.2, 0.15, 0.05])
    x0 = 1  # p(x) = 0.3 < t: accepted with probability 0.6 instead of 0.3
    p = torch.stack([p0, torch.full((v,), 1.0 / v)])[None].expand(B, 2, v)
    x = torch.full((B, 1), x0)
    q = torch.nn.functional.one_hot(x, v).float()
    out = verify_rounds(p, q, x, "sglang_threshold", t, torch.Generator().manual_seed(8), temperature=0.7)
    a = min(1.0, 0.3 / t)
    rate = out.accepted.double().mean().item()
    assert abs(rate - a) < 5 * (a * (1 - a) / B) ** 0.5
    expected = p0 * (1 - a) / (1 - p0[x0])
    expected[x0] = a
    assert chi2_pvalue(out.tokens[:, 0], expected) > P_FLOOR
    assert chi2_pvalue(out.tokens[:, 0], p0) < 1e-9


def test_refuses_sampled_drafts_and_greedy_sampling():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(2, 3, 5, generator=g).softmax(-1)
    q = torch.rand(2, 2, 5, generator=g).softmax(-1)  # not one-hot
    x = q.argmax(-1)
    with pytest.raises(ValueError, match="one-hot q"):
        verify_rounds(p, q, x, "sglang_threshold", 0.5, g, temperature=0.7)
    with pytest.raises(ValueError, match="temperature 0"):
        verify_rounds(p, q, x, "sglang_threshold", 0.5, g, temperature=0.0)
    with pytest.raises(ValueError, match="outside the valid range"):
        METHODS["sglang_threshold"].check_knob(1.5)


@pytest.mark.parametrize("single, acc", [(0.9, 0.5), (0.3, 0.8), (1.0, 0.4), (0.5, 1.0), (0.2, 0.0)])
def test_two_named_knobs_match_the_kernel_round_for_round(single, acc):
    """SGLang's two thresholds as two named knobs (its own names), each its own dimension."""
    g, p, q, x = _greedy_batch(7, 3000)
    u = torch.rand(p.shape[0], p.shape[1], generator=g)
    knobs = {"speculative_accept_threshold_single": single, "speculative_accept_threshold_acc": acc}
    out = verify_rounds(p, q, x, "sglang_threshold", knobs, uniforms=u, temperature=0.7)
    same = 0
    for i in range(p.shape[0]):
        tokens, accepted = kernel_chain(p[i], x[i], u[i], u[i, -1], single, max(acc, 1e-9))
        assert int(out.accepted[i]) == accepted
        same += out.tokens[i, : accepted + 1].tolist() == tokens
    assert same >= 0.999 * p.shape[0]


def test_named_knobs_and_the_single_knob_view():
    spec = METHODS["sglang_threshold"]
    assert spec.knob_names == ("speculative_accept_threshold_single", "speculative_accept_threshold_acc")
    assert spec.named(0.4) == {"speculative_accept_threshold_single": 0.4, "speculative_accept_threshold_acc": 0.4}
    assert spec.check_knob(0.4) == 0.4  # the tuner's alpha stays a number
    assert spec.is_strict(1.0) and not spec.is_strict(0.9)
    assert spec.is_strict({"speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0})
    # both must be at 1: a lower single threshold alone relaxes
    assert not spec.is_strict({"speculative_accept_threshold_single": 0.5, "speculative_accept_threshold_acc": 1.0})
    with pytest.raises(ValueError, match="missing: speculative_accept_threshold_acc"):
        spec.check_knob({"speculative_accept_threshold_single": 0.5})
    with pytest.raises(ValueError, match="speculative_accept_threshold_acc = 1.5 is outside"):
        spec.check_knob({"speculative_accept_threshold_single": 0.5, "speculative_accept_threshold_acc": 1.5})
    # the tied mapping is the one-number rule, bit for bit
    g, p, q, x = _greedy_batch(3, 500)
    u = torch.rand(p.shape[0], p.shape[1], generator=g)
    a = verify_rounds(p, q, x, "sglang_threshold", 0.35, uniforms=u, temperature=0.7)
    b = verify_rounds(p, q, x, "sglang_threshold", spec.named(0.35), uniforms=u, temperature=0.7)
    assert torch.equal(a.tokens, b.tokens)
