"""The speculative round: exactness (statistical), strict points, edge cases, errors."""

import functools

import pytest
import torch

from relaxtune.decoding.methods import METHODS, Rows
from relaxtune.decoding.round import verify_round, verify_rounds

from .conftest import P_FLOOR, chi2_pvalue, random_rows

B = 60000  # rounds per statistical test
V = 6


def _fixed_batch(p, q, n_rows, g, z_p=None, z_q=None):
    """Repeat one sequence's rows ``n_rows`` times, with fresh drafts ``x_i ~ q_i``."""
    n = p.shape[0] - 1
    x = torch.stack([torch.multinomial(q[i], n_rows, replacement=True, generator=g) for i in range(n)], -1)
    expand = lambda t: None if t is None else t.expand(n_rows, *t.shape)  # noqa: E731
    return expand(p), expand(q), x, expand(z_p), expand(z_q)


def _first_tokens(method, knob, p, q, g, z_p=None, z_q=None, temperature=0.8, n_rows=B):
    pb, qb, x, zpb, zqb = _fixed_batch(p, q, n_rows, g, z_p, z_q)
    out = verify_rounds(pb, qb, x, method, knob, g, z_p=zpb, z_q=zqb, temperature=temperature)
    return out.tokens[:, 0], out


def _setup(seed, n=1, v=V, temperature=0.8, extra_q=False):
    g = torch.Generator().manual_seed(seed)
    z_p = torch.randn(n + 1, v, generator=g, dtype=torch.float64) * 1.5
    z_q = torch.randn(n + 1, v, generator=g, dtype=torch.float64) * 1.5
    p = (z_p / temperature).softmax(-1).float()
    q = (z_q / temperature).softmax(-1).float()
    return g, p, (q if extra_q else q[:n]), z_p.float(), (z_q if extra_q else z_q[:n]).float()


# ---------------------------------------------------------------- strict is exact


@pytest.mark.parametrize("n", [1, 3])
def test_strict_emits_exactly_p(n):
    g, p, q, _, _ = _setup(10 + n, n=n)
    first, out = _first_tokens("strict", None, p, q, g)
    assert chi2_pvalue(first, p[0]) > P_FLOOR
    assert chi2_pvalue(first, q[0]) < 1e-9  # the test can tell p from q
    assert torch.equal(out.num_emitted, out.accepted + 1)
    assert ((out.tokens >= 0).sum(-1) == out.num_emitted).all()


@functools.cache
def _toy_rows(prefix: tuple, v: int = 3) -> tuple:
    """A context-dependent toy pair: p(. | prefix), q(. | prefix) fixed by the prefix."""
    g = torch.Generator().manual_seed(hash(prefix) % (2**31))
    p = (torch.randn(v, generator=g) * 1.5).softmax(-1)
    q = (torch.randn(v, generator=g) * 1.5).softmax(-1)
    return p, q


def _spec_generate_two(method, knob, n, g):
    out: list[int] = []
    while len(out) < 2:
        drafts, q_rows, p_rows = [], [], []
        for _ in range(n):
            p_i, q_i = _toy_rows(tuple(out + drafts))
            drafts.append(int(torch.multinomial(q_i, 1, generator=g)))
            q_rows.append(q_i)
            p_rows.append(p_i)
        p_rows.append(_toy_rows(tuple(out + drafts))[0])
        res = verify_round(torch.stack(p_rows), torch.stack(q_rows), torch.tensor(drafts), method, knob, g)
        out += res.tokens
    return out[0], out[1]


@pytest.mark.slow
def test_strict_joint_of_first_two_tokens_is_ar():
    g = torch.Generator().manual_seed(7)
    v, samples = 3, 6000
    pairs = [_spec_generate_two("strict", None, 3, g) for _ in range(samples)]
    codes = torch.tensor([a * v + b for a, b in pairs])
    p0 = _toy_rows(())[0]
    joint = torch.stack([p0[a] * _toy_rows((a,))[0] for a in range(v)]).reshape(-1)
    assert chi2_pvalue(codes, joint) > P_FLOOR
    q0 = _toy_rows(())[1]
    wrong = torch.stack([q0[a] * _toy_rows((a,))[1] for a in range(v)]).reshape(-1)
    assert chi2_pvalue(codes, wrong) < 1e-9


# ------------------------------------------------- methods with pi_rej = pi_res = pi


@pytest.mark.parametrize(
    "method, knob",
    [
        ("ens", 0.3),
        ("ens", 1.0),
        ("r_fuzzy", 0.69),
        ("spec_casc_opt", 1.0),
        ("spec_casc_tok", 0.35),
        ("spec_casc_tok", 0.0),
        ("spec_cont_dec", 0.5),
        ("always_accept", None),
    ],
)
def test_emitted_distribution_is_the_methods_pi(method, knob):
    g, p, q, z_p, z_q = _setup(21, n=1, extra_q=True)
    spec = METHODS[method]
    pi = spec.targets(Rows(p[:1], q[:1], None, z_p[:1], z_q[:1], 0.8), knob).pi_res[0]
    assert (pi - p[0]).abs().sum() > 0.1  # the relaxation really changes the target
    first, _ = _first_tokens(method, knob, p, q, g, z_p, z_q)
    assert chi2_pvalue(first, pi) > P_FLOOR
    assert chi2_pvalue(first, p[0]) < 1e-9


def test_spec_cont_dec_draws_its_bonus_token_from_pi():
    g, p, q, z_p, z_q = _setup(22, n=1, extra_q=True)
    spec = METHODS["spec_cont_dec"]
    pi_bonus = spec.targets(Rows(p[1:2], q[1:2], None, z_p[1:2], z_q[1:2], 0.8), 0.5).pi_res[0]
    assert (pi_bonus - p[1]).abs().sum() > 0.1
    _, out = _first_tokens("spec_cont_dec", 0.5, p, q, g, z_p, z_q)
    bonus = out.tokens[out.accepted == 1, 1]  # the draft was accepted: the second token is the bonus
    assert len(bonus) > 3000
    assert chi2_pvalue(bonus, pi_bonus) > P_FLOOR
    assert chi2_pvalue(bonus, p[1]) < 1e-9


def _closed_form(method, knob, p, q):
    """Acceptance rate and emitted distribution of one position, by enumeration
    of the drafted token: P(y) = q(y) a(y) + sum_x q(x) (1 - a(x)) R_x(y)."""
    spec = METHODS[method]
    v = p.shape[-1]
    emitted = torch.zeros(v, dtype=torch.float64)
    beta = 0.0
    for x in range(v):
        t = spec.targets(Rows(p[None], q[None], torch.tensor([x])), knob)
        a = min(1.0, float(t.pi_rej[0, x]) / float(q[x]))
        beta += float(q[x]) * a
        emitted[x] += float(q[x]) * a
        resid = (t.pi_res[0] - q).clamp_min(0).double()
        resid = resid / resid.sum() if resid.sum() > 1e-12 else t.pi_res[0].double()
        emitted += float(q[x]) * (1 - a) * resid
    return beta, emitted


@pytest.mark.parametrize("method, knob", [("mentored", 0.3), ("mentored", 0.7), ("cactus", 0.02), ("cactus", 0.1)])
def test_mentored_and_cactus_match_their_closed_forms(method, knob):
    g, p, q, _, _ = _setup(33, n=1)
    p0, q0 = p[0].double(), q[0].double()
    beta, emitted = _closed_form(method, knob, p0, q0)
    if method == "mentored":  # the docstring's closed form
        doc_beta = torch.minimum(q0, p0 / (1 - knob)).sum()
        resid = (p0 - q0).clamp_min(0)
        doc = torch.minimum(q0, p0 / (1 - knob)) + (1 - doc_beta) * resid / resid.sum()
        assert float(doc_beta) == pytest.approx(beta) and torch.allclose(doc, emitted)
    first, out = _first_tokens(method, knob, p, q, g)
    rate = out.accepted.double().mean().item()
    assert 0.05 < beta < 0.95
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / B) ** 0.5
    strict_beta = torch.minimum(q0, p0).sum().item()
    assert beta > strict_beta + 0.02  # relaxation accepts more than strict
    assert chi2_pvalue(first, emitted) > P_FLOOR
    assert chi2_pvalue(first, p[0]) < 1e-9


# ---------------------------------------------------------------- strict points


def _random_batch(seed, b=4000, n=3, v=8, temperature=0.7):
    g = torch.Generator().manual_seed(seed)
    z_p = torch.randn(b, n + 1, v, generator=g) * 2
    z_q = z_p + torch.randn(b, n + 1, v, generator=g)
    p = (z_p / temperature).softmax(-1)
    q = (z_q / temperature).softmax(-1)
    x = torch.multinomial(q[:, :n].reshape(-1, v), 1, generator=g).reshape(b, n)
    return dict(p=p, q=q, draft_ids=x, z_p=z_p, z_q=z_q, temperature=temperature)


STRICT_POINTS = [
    ("ens", 0.0),
    ("mentored", 0.0),
    ("cactus", 0.0),
    ("r_fuzzy", float("-inf")),
    ("r_fuzzy", -0.5),
    ("spec_casc_opt", float("-inf")),
    ("spec_casc_tok", float("-inf")),
    ("spec_casc_tok", -0.5),
    ("spec_cont_dec", 0.0),
]


@pytest.mark.parametrize("method, knob", STRICT_POINTS)
def test_strict_point_is_bit_identical_to_strict(method, knob):
    batch = _random_batch(41)
    assert METHODS[method].is_strict(knob)
    ref = verify_rounds(**batch, method="strict", generator=torch.Generator().manual_seed(9))
    out = verify_rounds(**batch, method=method, knob=knob, generator=torch.Generator().manual_seed(9))
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.accepted, ref.accepted)
    assert 0 < ref.accepted.float().mean() < 3  # rejections and full accepts both happen


@pytest.mark.parametrize("method", ["spec_casc_opt", "spec_casc_tok"])
def test_cascades_at_zero_are_not_strict(method):
    assert not METHODS[method].is_strict(0.0)
    batch = _random_batch(42)
    ref = verify_rounds(**batch, method="strict", generator=torch.Generator().manual_seed(9))
    out = verify_rounds(**batch, method=method, knob=0.0, generator=torch.Generator().manual_seed(9))
    assert not torch.equal(out.tokens, ref.tokens)
    g, p, q, z_p, z_q = _setup(44, n=1)
    first, _ = _first_tokens(method, 0.0, p, q, g, z_p, z_q)
    assert chi2_pvalue(first, p[0]) < 1e-9  # its output distribution is not p


def test_ens_with_zero_verifier_weight_is_always_accept():
    batch = _random_batch(43)
    ref = verify_rounds(**batch, method="always_accept", generator=torch.Generator().manual_seed(2))
    out = verify_rounds(**batch, method="ens", knob=1.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(out.tokens, ref.tokens)
    assert (out.accepted == 3).all()


# ------------------------------------------------------------------- edge cases


def test_cactus_never_emits_a_token_the_verifier_excludes():
    g = torch.Generator().manual_seed(5)
    p = torch.tensor([0.4, 0.3, 0.3, 0.0, 0.0, 0.0]).expand(4, 6)
    q = torch.tensor([0.05, 0.05, 0.1, 0.3, 0.3, 0.2]).expand(3, 6)
    _, out = _first_tokens("cactus", 10.0, p, q, g, temperature=0.8)
    emitted = out.tokens[out.tokens >= 0]
    assert emitted.numel() > B and not ((emitted >= 3).any())
    _, loose = _first_tokens("ens", 0.5, p, q, g)  # ens does accept them: it rambles
    assert (loose.tokens >= 3).any()


def test_draft_with_zero_drafter_probability_is_rejected():
    g = torch.Generator().manual_seed(6)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.0, 0.5, 0.5]])
    out = verify_rounds(
        p.expand(1000, 2, 3), q.expand(1000, 1, 3), torch.zeros(1000, 1, dtype=torch.long), "mentored", 0.9, g
    )
    assert (out.accepted == 0).all()
    assert set(out.tokens[:, 0].tolist()) == {0}  # residual norm((p - q)+) = token 0


def test_zero_residual_mass_falls_back_to_pi_res():
    # always_accept with a draft of q(x) = 0: rejected, and (q - q)+ = 0 -> sample from q
    g = torch.Generator().manual_seed(8)
    q = torch.tensor([[0.0, 0.25, 0.75]])
    p = torch.tensor([[0.3, 0.3, 0.4], [0.3, 0.3, 0.4]])
    out = verify_rounds(
        p.expand(B, 2, 3), q.expand(B, 1, 3), torch.zeros(B, 1, dtype=torch.long), "always_accept", None, g
    )
    assert (out.accepted == 0).all()
    assert chi2_pvalue(out.tokens[:, 0], q[0]) > P_FLOOR


@pytest.mark.parametrize("method, knob", [("strict", None), ("mentored", 0.5)])
def test_greedy_drafts_follow_the_greedy_rule(method, knob):
    # one-hot q: accept with probability pi_rej(x); on reject sample pi_res without x
    g = torch.Generator().manual_seed(12)
    p = torch.tensor([[0.3, 0.45, 0.25], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    out = verify_rounds(p.expand(B, 2, 3), q.expand(B, 1, 3), torch.ones(B, 1, dtype=torch.long), method, knob, g)
    accept = min(1.0, 0.45 / (1 - (knob or 0.0)))
    rate = out.accepted.double().mean().item()
    assert abs(rate - accept) < 5 * (accept * (1 - accept) / B) ** 0.5
    rejected = out.tokens[out.accepted == 0, 0]
    assert chi2_pvalue(rejected, torch.tensor([0.3, 0.0, 0.25])) > P_FLOOR


def test_same_seed_same_result_and_explicit_uniforms():
    batch = _random_batch(50, b=500)
    a = verify_rounds(**batch, method="cactus", knob=1.0, generator=torch.Generator().manual_seed(3))
    b = verify_rounds(**batch, method="cactus", knob=1.0, generator=torch.Generator().manual_seed(3))
    u = torch.rand(500, 4, generator=torch.Generator().manual_seed(3))
    c = verify_rounds(**batch, method="cactus", knob=1.0, uniforms=u)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize("method, knob", [("strict", None), ("r_fuzzy", 0.2), ("spec_cont_dec", 0.5)])
def test_batch_rows_equal_single_rounds(method, knob):
    batch = _random_batch(51, b=64)
    u = torch.rand(64, 4, generator=torch.Generator().manual_seed(4))
    out = verify_rounds(**batch, method=method, knob=knob, uniforms=u)
    assert len(set(out.accepted.tolist())) > 1  # ragged acceptance
    for i in range(64):
        one = verify_round(
            batch["p"][i],
            batch["q"][i],
            batch["draft_ids"][i],
            method,
            knob,
            uniforms=u[i],
            z_p=batch["z_p"][i],
            z_q=batch["z_q"][i],
            temperature=batch["temperature"],
        )
        assert one == out.row(i)
        assert len(one.tokens) == one.accepted + 1


# ----------------------------------------------------------------------- errors


def _good(n=2, v=5):
    g = torch.Generator().manual_seed(0)
    return random_rows(g, n + 1, v), random_rows(g, n, v), torch.zeros(n, dtype=torch.long)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda p, q, x: (p, q, x, "nope", None), "unknown method 'nope'"),
        (lambda p, q, x: (p, q, x, "mentored", 1.2), "outside the valid range"),
        (lambda p, q, x: (p[:1], q[:0], x[:0], "strict", None), "N = 0"),
        (lambda p, q, x: (p, q[:, :4], x, "strict", None), "q must be"),
        (lambda p, q, x: (p, q, x[:1], "strict", None), "draft_ids must be"),
        (lambda p, q, x: (p, q, x + 9, "strict", None), r"draft_ids must lie in \[0, V = 5\)"),
        (lambda p, q, x: (p * 2, q, x, "strict", None), "p row 0 sums to 2"),
        (
            lambda p, q, x: (p.index_fill(1, torch.tensor([0]), float("nan")), q, x, "strict", None),
            "p row 0 contains NaN",
        ),
        (lambda p, q, x: (p, q - q.mean(), x, "strict", None), "q row 0 has negative entries"),
        (lambda p, q, x: (p, q, x, "spec_casc_tok", 0.3), "needs the raw verifier logits"),
    ],
)
def test_bad_input_is_named(mutate, match):
    p, q, x, method, knob = mutate(*_good())
    with pytest.raises(ValueError, match=match):
        verify_round(p, q, x, method, knob, torch.Generator().manual_seed(0))


def test_greedy_refused_in_the_round():
    p, q, x = _good()
    with pytest.raises(ValueError, match="collapses to strict at temperature 0"):
        verify_round(p, q, x, "cactus", 1.0, temperature=0.0)


def test_spec_cont_dec_needs_the_extra_drafter_row():
    p, q, x = _good()
    z = torch.zeros(3, 5)
    with pytest.raises(ValueError, match="one extra drafter step"):
        verify_round(p, q, x, "spec_cont_dec", 0.5, z_p=z, z_q=z[:2], temperature=0.7)
