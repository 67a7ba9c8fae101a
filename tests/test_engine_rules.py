"""Typical acceptance and EARS: the sources' cases (vLLM's tests, rewritten on
normalised rows), closed forms (acceptance and first-token distribution,
chi-square with fixed seeds), the strict point, the randomness contract, and
top-K rows with -inf outside."""

import dataclasses
import functools

import pytest
import torch

from relaxtune.decoding.engine_rules import _typical_at, typical, typical_threshold
from relaxtune.decoding.methods import METHODS, Rows
from relaxtune.decoding.round import verify_rounds
from relaxtune.tune.search import strength

from .conftest import P_FLOOR, chi2_pvalue
from .test_topk_rows import server_rows

B = 60000
V = 6
T = 0.8


def test_registry_entries():
    typ, ears = METHODS["typical"], METHODS["ears"]
    assert (typ.knob, typ.strict_point, typ.grid) == ("epsilon", None, (0.25, 0.09, 0.03))
    assert (ears.knob, ears.strict_point, ears.grid) == ("tolerance", 0.0, (0.1, 0.3, 0.5))
    assert not typ.pointwise and not ears.pointwise  # both read the verifier's whole row
    assert not any(typ.is_strict(k) for k in (0.0, 0.09, 1.0)) and ears.is_strict(0.0)
    for spec in (typ, ears):
        spec.check_knob(0.0), spec.check_knob(1.0)
        with pytest.raises(ValueError, match="outside the valid range"):
            spec.check_knob(1.01)
        with pytest.raises(ValueError, match="collapses to strict at temperature 0"):
            spec.check_temperature(0.0)
    # a larger epsilon relaxes less: the tuner's strength runs from the top of the range
    assert strength("typical", 0.25) < strength("typical", 0.09) < strength("typical", 0.03)
    assert strength("ears", 0.1) < strength("ears", 0.5)


# ------------------------------------------------------- vLLM's cases, rewritten


def _vllm_like(delta):
    """Typical acceptance with an explicit delta (vLLM's tests pass epsilon 0.03, delta 0.9)."""
    spec = METHODS["typical"]
    return dataclasses.replace(
        spec, targets=functools.partial(typical, delta=delta), rej_at=functools.partial(_typical_at, delta=delta)
    )


def _one_hot_rows(b, k, v, g):
    ids = torch.randint(v, (b, k), generator=g)
    return torch.zeros(b, k, v).scatter_(-1, ids[..., None], 1.0), ids


def _drafts_avoiding(avoid, v, g):
    return (avoid + 1 + torch.randint(v - 1, avoid.shape, generator=g)) % v


def _round(p, x, eps, delta, seed=0):
    """One round on vLLM's test rows: its "uniform" rows are ``torch.rand`` (not normalised),
    so the rows are not validated; q is one-hot at the drafts (vLLM's sampler ignores q)."""
    b, n = x.shape
    q = torch.zeros(b, n, p.shape[-1]).scatter_(-1, x[..., None], 1.0)
    return verify_rounds(p, q, x, _vllm_like(delta), eps, torch.Generator().manual_seed(seed), validate=False)


@pytest.mark.parametrize("seed", range(3))
def test_vllm_uniform_target_accepts_every_draft(seed):
    g = torch.Generator().manual_seed(seed)
    b, k, v = 5, 3, 30_000
    p = torch.rand(b, k + 1, v, generator=g)  # vLLM's rows: high "entropy", threshold 0
    x = torch.randint(v, (b, k), generator=g)
    out = _round(p, x, 0.03, 0.9, seed)
    assert torch.equal(out.tokens[:, :k], x) and (out.accepted == k).all()
    assert (out.tokens[:, k] >= 0).all()  # the bonus token, from p


def test_the_sources_entropy_floor_rejects_a_normalised_flat_row():
    # on a true uniform row over 30,000 ids, H - log(p + 1e-5) is 10.05 nats instead of 10.31:
    # 0.9 exp(-H) = 3.9e-5 > p = 3.3e-5, so the sources' formula rejects every draft at delta 0.9
    v = 30_000
    p = torch.full((1, 4, v), 1.0 / v)
    x = torch.tensor([[1, 2, 3]])
    assert float(typical_threshold(p[0, :1], 0.03, 0.9)) > 1.0 / v
    assert _round(p, x, 0.03, 0.9).accepted.item() == 0
    assert verify_rounds(p, p[:, :3], x, "typical", 0.03).accepted.item() == 3  # delta = sqrt(0.03) passes


@pytest.mark.parametrize("seed", range(3))
def test_vllm_temperature_zero_target_rejects_and_recovers_the_argmax(seed):
    g = torch.Generator().manual_seed(seed)
    b, k, v = 5, 3, 30_000
    p, hot = _one_hot_rows(b, k + 1, v, g)
    x = _drafts_avoiding(hot[:, :k], v, g)
    out = _round(p, x, 0.03, 0.9, seed)
    assert torch.equal(out.tokens[:, 0], hot[:, 0]) and (out.tokens[:, 1:] == -1).all()
    assert (out.accepted == 0).all()


@pytest.mark.parametrize("seed", range(3))
def test_vllm_mixed_target_distribution(seed):
    g = torch.Generator().manual_seed(seed)
    b, k, v = 4, 3, 30_000
    p, hot = _one_hot_rows(b, k + 1, v, g)
    p[[1, 3]] = torch.rand(2, k + 1, v, generator=g)
    x = _drafts_avoiding(hot[:, :k], v, g)
    out = _round(p, x, 0.03, 0.9, seed)
    assert torch.equal(out.tokens[[0, 2], 0], hot[[0, 2], 0]) and (out.tokens[[0, 2], 1:] == -1).all()
    assert torch.equal(out.tokens[[1, 3], :k], x[[1, 3]]) and (out.tokens[[1, 3], k] >= 0).all()


@pytest.mark.parametrize("seed", range(3))
def test_vllm_accepts_tokens_partially(seed):
    g = torch.Generator().manual_seed(seed)
    k, v = 5, 30_000
    p, hot = _one_hot_rows(1, k + 1, v, g)
    out = _round(p, hot[:, :k], 0.03, 0.9, seed)
    assert torch.equal(out.tokens[:, :k], hot[:, :k]) and torch.equal(out.tokens[:, k], hot[:, k])
    x = torch.cat([hot[:, :2], _drafts_avoiding(hot[:, 2:k], v, g)], 1)
    out = _round(p, x, 0.03, 0.9, seed)
    assert torch.equal(out.tokens[:, :2], x[:, :2]) and torch.equal(out.tokens[:, 2], hot[:, 2])
    assert (out.tokens[:, 3:] == -1).all()


def test_vllm_non_default_posteriors_change_acceptance():
    g = torch.Generator().manual_seed(0)
    k, v = 5, 30_000
    p, hot = _one_hot_rows(1, k + 1, v, g)
    p[p == 0] = 1e-5  # as vLLM's test: 1.0 and 1e-5 elsewhere, not normalised
    x = _drafts_avoiding(hot[:, :k], v, g)
    out = _round(p, x, 0.03, 0.9)
    assert torch.equal(out.tokens[:, 0], hot[:, 0]) and (out.tokens[:, 1:] == -1).all()
    out = _round(p, x, 0.0, 0.0)  # threshold 0: every draft with p(x) > 0 passes
    assert torch.equal(out.tokens[:, :k], x) and out.tokens[0, k] >= 0


def test_threshold_is_the_sources_formula():
    p = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]])
    h = -(p * (p + 1e-5).log()).sum(-1)
    assert torch.allclose(typical_threshold(p, 0.09), torch.minimum(torch.tensor(0.09), 0.3 * (-h).exp()))
    assert torch.allclose(typical_threshold(p, 0.03, 0.9), torch.minimum(torch.tensor(0.03), 0.9 * (-h).exp()))


# ----------------------------------------------------------------- closed forms


def _setup(seed, n=1, v=V, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(n + 1, v, generator=g, dtype=torch.float64) * scale / T).softmax(-1).float()
    q = (torch.randn(n + 1, v, generator=g, dtype=torch.float64) * scale / T).softmax(-1).float()
    return g, p, q[:n]


def _first(method, knob, p, q, g, n_rows=B):
    n = p.shape[0] - 1
    x = torch.stack([torch.multinomial(q[i], n_rows, replacement=True, generator=g) for i in range(n)], -1)
    out = verify_rounds(p.expand(n_rows, *p.shape), q.expand(n_rows, *q.shape), x, method, knob, g)
    return out.tokens[:, 0], out


def _typical_closed_form(p, q, eps):
    a = (p > typical_threshold(p, eps)).double()
    beta = float((q.double() * a).sum())
    emitted = q.double() * a
    emitted[int(p.argmax())] += 1 - beta
    return beta, emitted


def _ears_closed_form(p, q, t):
    s = t * (1 - float(p.max()))
    p, q = p.double(), q.double()
    r = torch.minimum(q, torch.where(p > 0, p + s * q, torch.zeros_like(p)))
    beta = float(r.sum())
    resid = (p - q).clamp_min(0)
    return beta, r + (1 - beta) * resid / resid.sum()


@pytest.mark.parametrize("eps", [0.25, 0.09, 0.03])
def test_typical_matches_its_closed_form(eps):
    g = torch.Generator().manual_seed(61)
    p = torch.tensor([0.55, 0.2, 0.12, 0.07, 0.04, 0.02]).expand(2, 6)
    q = torch.tensor([[0.1, 0.15, 0.15, 0.2, 0.2, 0.2]])
    beta, emitted = _typical_closed_form(p[0], q[0], eps)
    assert beta == pytest.approx({0.25: 0.25, 0.09: 0.4, 0.03: 0.8}[eps])  # 2, 3, 5 tokens pass
    first, out = _first("typical", eps, p, q, g)
    rate = out.accepted.double().mean().item()
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / B) ** 0.5
    assert chi2_pvalue(first, emitted) > P_FLOOR
    assert chi2_pvalue(first, p[0]) < 1e-9  # not lossless


@pytest.mark.parametrize("t", [0.1, 0.3, 0.5, 1.0])
def test_ears_matches_its_closed_form(t):
    g, p, q = _setup(62)
    beta, emitted = _ears_closed_form(p[0], q[0], t)
    strict_beta = float(torch.minimum(p[0], q[0]).sum())
    assert beta > strict_beta + 0.01  # the tolerance accepts more
    first, out = _first("ears", t, p, q, g)
    rate = out.accepted.double().mean().item()
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / B) ** 0.5
    assert chi2_pvalue(first, emitted) > P_FLOOR
    if t >= 0.3:
        assert chi2_pvalue(first, p[0]) < 1e-9


def test_ears_never_accepts_a_token_the_verifier_excludes():
    g = torch.Generator().manual_seed(5)
    p = torch.tensor([0.4, 0.3, 0.3, 0.0, 0.0, 0.0]).expand(2, 6)
    q = torch.tensor([[0.05, 0.05, 0.1, 0.3, 0.3, 0.2]])
    first, out = _first("ears", 1.0, p, q, g)
    assert not (first >= 3).any()
    beta, emitted = _ears_closed_form(p[0], q[0], 1.0)
    assert chi2_pvalue(first, emitted) > P_FLOOR


# ------------------------------------------------------ strict point, randomness


def _batch(seed, b=4000, n=3, v=8):
    g = torch.Generator().manual_seed(seed)
    z_p = torch.randn(b, n + 1, v, generator=g) * 2
    p = (z_p / 0.7).softmax(-1)
    q = ((z_p + torch.randn(b, n + 1, v, generator=g)) / 0.7).softmax(-1)
    x = torch.multinomial(q[:, :n].reshape(-1, v), 1, generator=g).reshape(b, n)
    return dict(p=p, q=q, draft_ids=x)


def test_ears_at_zero_is_bit_identical_to_strict():
    batch = _batch(41)
    ref = verify_rounds(**batch, method="strict", generator=torch.Generator().manual_seed(9))
    out = verify_rounds(**batch, method="ears", knob=0.0, generator=torch.Generator().manual_seed(9))
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.accepted, ref.accepted)
    loose = verify_rounds(**batch, method="ears", knob=0.5, generator=torch.Generator().manual_seed(9))
    assert loose.accepted.sum() > ref.accepted.sum()


def test_ears_on_one_hot_verifier_rows_is_strict_at_any_tolerance():
    batch = _batch(42)
    batch["p"] = torch.nn.functional.one_hot(batch["p"].argmax(-1), 8).float()
    ref = verify_rounds(**batch, method="strict", generator=torch.Generator().manual_seed(3))
    out = verify_rounds(**batch, method="ears", knob=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(out.tokens, ref.tokens)


def test_typical_reads_only_the_bonus_uniform():
    batch = _batch(43, b=2000)
    u = torch.rand(2000, 4, generator=torch.Generator().manual_seed(1))
    other = u.clone()
    other[:, :3] = torch.rand(2000, 3, generator=torch.Generator().manual_seed(2))
    a = verify_rounds(**batch, method="typical", knob=0.09, uniforms=u)
    b = verify_rounds(**batch, method="typical", knob=0.09, uniforms=other)
    assert torch.equal(a.tokens, b.tokens)  # accept and residual uniforms change nothing
    full = a.accepted == 3
    assert 0 < int(full.sum()) < 2000
    bonus = u.clone()
    bonus[:, 3] = 1 - u[:, 3]
    c = verify_rounds(**batch, method="typical", knob=0.09, uniforms=bonus)
    assert torch.equal(c.tokens[~full], a.tokens[~full])  # a rejected round's token is the argmax
    assert not torch.equal(c.tokens[full], a.tokens[full])  # the bonus token is drawn with u_{N+1}
    # the drafts and the uniforms' count are strict's: typical pairs with strict under one seed
    s = verify_rounds(**batch, method="strict", uniforms=u)
    assert torch.equal(
        s.tokens[:, :1][(s.accepted > 0) & (a.accepted > 0)], a.tokens[:, :1][(s.accepted > 0) & (a.accepted > 0)]
    )


def test_typical_at_temperature_zero_rows_is_greedy():
    batch = _batch(44)
    p = torch.nn.functional.one_hot(batch["p"].argmax(-1), 8).float()
    for eps in (0.0, 0.09, 1.0):
        out = verify_rounds(p, batch["q"], batch["draft_ids"], "typical", eps, torch.Generator().manual_seed(0))
        greedy = p.argmax(-1)
        for i in range(50):
            n = int(out.accepted[i]) + 1
            assert torch.equal(out.tokens[i, :n], greedy[i, :n])


# ------------------------------------------------------------------ top-K rows


@pytest.mark.parametrize("method, knob", [("typical", 0.09), ("typical", 0.0), ("ears", 0.3), ("ears", 1.0)])
def test_top_k_rows(method, knob):
    p, q, z_p, z_q, _ = server_rows(3, extra_q=False)
    assert bool(z_p[0].isneginf().any())
    t = METHODS[method].targets(Rows(p[:1], q, None), knob) if method == "typical" else None
    g = torch.Generator().manual_seed(1)
    first, out = _first(method, knob, p, q, g, n_rows=40000)
    assert bool((p[0, first] > 0).all())  # never a token outside the verifier's returned ids
    closed = _typical_closed_form(p[0], q[0], knob) if method == "typical" else _ears_closed_form(p[0], q[0], knob)
    assert torch.isfinite(closed[1]).all()
    assert chi2_pvalue(first, closed[1]) > P_FLOOR
    if t is not None:
        assert torch.isfinite(t.pi_rej).all() and torch.equal(t.pi_res.sum(-1), torch.ones(1))


# ------------------------------------------------------- tuned and exported


def test_tuned_yaml_round_trips_the_new_rules(tmp_path):
    from relaxtune.report.export import build_config, load_config, save_config
    from relaxtune.tune.confirm import confirm
    from relaxtune.tune.settings import TuneSettings
    from relaxtune.tune.tuning import Tuner

    from .synthetic import PROBLEMS, SPEC, Lucky

    class Pair:
        name = "synthetic-pair"

    settings = TuneSettings(
        task="synthetic",
        methods=["typical", "ears"],
        n_drafts=[4],
        trials=3,
        stage_size=500,
        output_dir=str(tmp_path),
        c_rel=0.2,
        epsilon=0.1,
    )
    tuner = Tuner(settings, SPEC, PROBLEMS, Pair(), 0.2, evaluate_fn=Lucky(loss=lambda k: 0.0), progress=False)
    outcomes = tuner.tune(["typical", "ears"])
    config = build_config(tuner.result(outcomes, confirm(tuner, outcomes, PROBLEMS)))
    assert set(config.methods) == {"typical", "ears"}
    assert config.methods["typical"].knob_name == "epsilon" and config.methods["ears"].knob_name == "tolerance"
    assert any(m.knob is not None for m in config.methods.values())  # a confirmed point is exported
    assert load_config(save_config(config, tmp_path / "c.yaml")) == config
