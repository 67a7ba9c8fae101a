"""Every method on rows built from top-K logprobs (``-inf`` outside the returned
ids, as a server returns them), and the round's refusal to sample a NaN row."""

import math

import pytest
import torch

from relaxtune.decoding.methods import METHODS, Rows
from relaxtune.decoding.round import verify_rounds
from relaxtune.decoding.sampling import SamplingParams, transform_logits

from .conftest import P_FLOOR, chi2_pvalue

T = 0.8
B = 40000


def _keep(logprobs: torch.Tensor, ids: list[int]) -> torch.Tensor:
    out = torch.full_like(logprobs, -math.inf)
    out[ids] = logprobs[ids]
    return out


def server_rows(seed=0, v=24, k=5, extra_q=True):
    """One position and its bonus row the way ``SGLangBackend`` builds them:
    drafter rows keep their top-k logprobs; verifier rows keep their top-k, the
    draft's own logprob and the drafter's returned ids (``token_ids_logprob``).
    Returns ``(p, q, z_p, z_q)`` with ``p``/``z_p`` ``[2, V]``, ``q``/``z_q`` ``[2, V]``
    (``extra_q``) or ``[1, V]``, and the tokens of G the drafter returned nothing for."""
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(2, v, generator=g) * 2).log_softmax(-1)
    lq = (lp + torch.randn(2, v, generator=g) * 2.5).log_softmax(-1)
    q_ids = [lq[i].topk(k).indices.tolist() for i in range(2)]
    z_q = torch.stack([_keep(lq[i], q_ids[i]) for i in range(2)])
    asked = sorted(set(q_ids[0]) | set(q_ids[1]))
    z_p = torch.stack([_keep(lp[i], sorted(set(lp[i].topk(k).indices.tolist()) | set(asked))) for i in range(2)])
    sampling = SamplingParams(T)
    p, q = transform_logits(z_p, sampling), transform_logits(z_q, sampling)
    unknown_to_drafter = ((p[0] > 0) & z_q[0].isneginf()).nonzero().squeeze(-1)
    return p, (q if extra_q else q[:1]), z_p, (z_q if extra_q else z_q[:1]), unknown_to_drafter


def _first_tokens(method, knob, p, q, z_p, z_q, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.multinomial(q[0], B, replacement=True, generator=g)[:, None]
    expand = lambda t: t.expand(B, *t.shape)  # noqa: E731
    out = verify_rounds(expand(p), expand(q), x, method, knob, g, z_p=expand(z_p), z_q=expand(z_q), temperature=T)
    return out.tokens[:, 0], out


@pytest.mark.parametrize(
    "method, knob",
    [
        ("strict", None),
        ("ens", 0.2),
        ("r_fuzzy", 0.69),
        ("spec_casc_opt", 0.05),
        ("spec_casc_tok", 0.35),
        ("spec_casc_tok", 1.0),
        ("spec_cont_dec", 0.5),
        ("spec_cont_dec", 1.0),
        ("always_accept", None),
    ],
)
def test_methods_whose_target_is_a_distribution_emit_it_on_top_k_rows(method, knob):
    p, q, z_p, z_q, unknown = server_rows(3)
    assert unknown.numel() > 0  # tokens the verifier keeps and the drafter returned nothing for
    assert float(p[0, z_p[0].isneginf()].sum()) == 0.0 and float(q[0, z_q[0].isneginf()].sum()) == 0.0
    pi = METHODS[method].targets(Rows(p[:1], q[:1], None, z_p[:1], z_q[:1], T), knob).pi_res[0]
    assert torch.isfinite(pi).all() and abs(float(pi.sum()) - 1) < 1e-5 and float(pi.min()) >= 0
    first, _ = _first_tokens(method, knob, p, q, z_p, z_q)
    assert chi2_pvalue(first, pi) > P_FLOOR


@pytest.mark.parametrize("method, knob", [("mentored", 0.7), ("cactus", 1.0), ("sglang_threshold", 0.5)])
def test_verifier_anchored_methods_never_emit_a_token_outside_the_verifiers_rows(method, knob):
    p, q, z_p, z_q, _ = server_rows(4, extra_q=False)
    if method == "sglang_threshold":  # greedy drafts: the drafter's argmax, q one-hot
        q = torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]).float()
    first, out = _first_tokens(method, knob, p, q, z_p, z_q)
    rejected = first[out.accepted == 0]
    assert rejected.numel() > 100 and bool((p[0, rejected] > 0).all())


def test_spec_cont_dec_takes_the_drafters_smallest_returned_logprob_for_unknown_tokens():
    beta = 1.0
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0]])
    z_q = torch.tensor([[-0.5, -1.5, -math.inf, -2.0, -math.inf]])  # token 2: in G, unknown to the drafter
    pi = METHODS["spec_cont_dec"].targets(Rows(p, p, None, None, z_q, T), beta).pi_res[0]
    floor = torch.tensor([-0.5, -1.5, -2.0])
    expected = (p[0, :3].log() * (1 + beta) - beta * floor / T).softmax(-1)
    assert torch.allclose(pi[:3], expected) and float(pi[3:].abs().sum()) == 0.0
    at = METHODS["spec_cont_dec"].rej_at(Rows(p, p, torch.tensor([2]), None, z_q, T), beta)
    assert torch.allclose(at, expected[2:3])
    # finite rows (a model's logits) are untouched: the floor is a no-op
    finite = torch.tensor([[-0.5, -1.5, -9.0, -2.0, -3.0]])
    ref = (p[0].log() * (1 + beta) - beta * finite[0] / T).softmax(-1)
    assert torch.equal(METHODS["spec_cont_dec"].targets(Rows(p, p, None, None, finite, T), beta).pi_res[0], ref)


def test_spec_casc_tok_at_one_is_q_even_outside_the_top_k():
    p, q, z_p, z_q, _ = server_rows(5, extra_q=False)
    assert bool(z_p[0].isneginf().any())
    rows = Rows(p[:1], q, torch.tensor([int(q[0].argmax())]), z_p[:1], z_q, T)
    assert torch.equal(METHODS["spec_casc_tok"].targets(rows, 1.0).pi_res, q)
    assert torch.equal(METHODS["spec_casc_tok"].rej_at(rows, 1.0), q[0, rows.x])


def _nan_round(method, knob, accept: bool, where="p"):
    p, q, z_p, z_q, _ = server_rows(6)
    x = torch.tensor([[int(q[0].argmax())]])
    if where == "p":
        p = p.clone()
        p[1 if accept else 0] = math.nan
    u = torch.zeros(1, 2) if accept else torch.tensor([[0.9999, 0.5]])
    if accept:
        q = p.clone() if where == "p" else q  # ratio 1: the draft is accepted
    return verify_rounds(
        p[None], q[None], x, method, knob, uniforms=u, z_p=z_p[None], z_q=z_q[None], temperature=T, validate=False
    )


@pytest.mark.parametrize("accept, what", [(False, "residual"), (True, "bonus")])
@pytest.mark.parametrize("method, knob", [("strict", None), ("cactus", 1.0), ("spec_cont_dec", 0.5)])
def test_a_nan_row_is_never_sampled(method, knob, accept, what):
    with pytest.raises(ValueError, match=f"{method}: the {what} row of sequence 0 .* not a finite distribution"):
        _nan_round(method, knob, accept)


def test_nan_drafter_logits_are_refused_not_emitted():
    p, q, z_p, z_q, _ = server_rows(7)
    z_q = z_q.clone()
    z_q[:] = math.nan
    x = torch.tensor([[int(q[0].argmax())]])
    with pytest.raises(ValueError, match="spec_cont_dec: the (residual|bonus) row"):
        verify_rounds(
            p[None],
            q[None],
            x,
            "spec_cont_dec",
            0.5,
            uniforms=torch.tensor([[0.5, 0.5]]),
            z_p=z_p[None],
            z_q=z_q[None],
            temperature=T,
            validate=False,
        )
